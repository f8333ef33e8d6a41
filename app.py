"""Speculative decoding playground: `python app.py` serves it on http://127.0.0.1:7860 (a Hugging Face Space
runs the same file). The default target (SmolLM2-135M, offline) starts loading at once; the page shows progress."""
import logging

try:   # ZeroGPU on Hugging Face Spaces wants `spaces` imported before torch; elsewhere it is absent
    import spaces  # noqa: F401
except ImportError:
    pass

from ui.layout import LAYOUT_CSS, THEME, build_demo

logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
logging.getLogger("ui").setLevel(logging.INFO)      # model loading progress on the console

demo = build_demo()
demo.queue(default_concurrency_limit=4, max_size=64)

if __name__ == "__main__":
    demo.launch(theme=THEME, css=LAYOUT_CSS)
