"""Pure views: RoundEvents -> HTML (render.py, tokens.py), -> Plotly figures (plots.py, lab_plots.py), and the
arithmetic behind the headline numbers (metrics.py). No model, no Gradio, no probability computed here."""
