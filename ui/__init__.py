"""The Gradio playground: renderers (events -> HTML), plots (events -> Plotly), per-session state, the model
registry and draft catalogue, handlers (generators) and the Blocks layout. Only `layout` and `handlers`
import Gradio; `render`, `plots`, `state` and `metrics` are pure and tested without a model."""
