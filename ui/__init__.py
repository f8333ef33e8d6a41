"""The Gradio playground.

    views/        pure: events -> HTML and Plotly figures
    playground/   the main panel: handlers, runner, model registry, session state, validation, limits
    classroom/    the classroom tabs: step-through, exactness lab, sweeps, trace export / replay
    layout.py     the Blocks layout that puts them together (app.py launches it)

What ui/ may import from the engine is written down once, in tests/test_architecture.py: the public API
(`import spec_engine as se`), spec_engine.classroom, .drafters and .models; never the core's modules or the
speed layer. views/ imports neither Gradio nor the rest of ui/.
"""
