"""The main panel: Gradio handlers (handlers.py), the glue between settings, models and the engine (runner.py), the
one long-lived thread every CPU decode runs on (engine_thread.py), the
process-wide model registry and draft catalogue (registry.py), per-session state (state.py), the checks every
public endpoint runs (validate.py), the public app's limits (limits.py) and the example prompts and scenarios
(presets.py)."""
