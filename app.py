"""Speculative decoding playground: `python app.py` serves it on http://127.0.0.1:7860 (a Hugging Face Space
runs the same file). The default target (SmolLM2-135M, offline) starts loading at once; the page shows progress.

Limits for a public server (each flag overrides its SPEC_* environment variable; see ui/playground/limits.py):
    --allow-custom-models   let visitors name Hugging Face Hub ids besides the presets (SPEC_ALLOW_CUSTOM_MODELS=1);
                            safetensors only, never remote code, never local paths
    --max-extra-models N    models kept loaded besides the default, least recently used dropped (SPEC_MAX_EXTRA_MODELS)
    --max-run-seconds S     wall-clock cap of one run, its baseline or a sweep (SPEC_MAX_RUN_SECONDS)
    --max-new-tokens N      token cap of one run (SPEC_MAX_NEW_TOKENS)
    --queue-size N          requests waiting before "queue is full" (SPEC_QUEUE_SIZE)
    --concurrency N         runs decoding at once; 1 keeps timings honest (SPEC_CONCURRENCY)
    --threads N             torch's intra-op threads (SPEC_THREADS; default: one per core). On a shared host whose
                            load exceeds its cores, 1 is far faster: measured at a load of 6-8 on 2 cores, one
                            SmolLM2-135M forward took 64 ms on 1 thread and 540 ms on 2 (docs/hardening.md)
    --session-ttl S         a session's state (runs, step-through caches, trace exports) is deleted S seconds after
                            its last use; a closed tab's within the hour, as Gradio keeps it (SPEC_SESSION_TTL)

The same file serves every Space hardware tier: CPU basic, a dedicated GPU, and ZeroGPU (SPACES_ZERO_GPU set by the
Space): there the models load at start-up on the main thread and every model computation runs in a
`spaces.GPU` function (ui/playground/compute.py); SPEC_ZEROGPU_MODELS names the models to load (default: the
default target and Gemma-3-270M for the tokenizer-mismatch demo).

Where it listens: --port N (default 7860; GRADIO_SERVER_PORT) and --host A (default 127.0.0.1; GRADIO_SERVER_NAME,
0.0.0.0 to serve other machines).

Where models load (SPEC_DEVICE, SPEC_DTYPE):
    --device D              cpu, cuda, cuda:1, ... (default: CUDA when present, else the CPU)
    --dtype T               float32 | bfloat16 | float16 (default: float32 on the CPU and, on a GPU, for models of
                            0.5B parameters or less, so greedy runs match plain decoding; bfloat16 above)
"""
import argparse
import logging
import sys

import os

try:   # ZeroGPU on Hugging Face Spaces wants `spaces` imported before torch; elsewhere it is absent or inert
    import spaces  # noqa: F401
except ImportError:
    pass

from gradio import queueing
from gradio.server_messages import ProcessCompletedMessage

from ui.playground import coalesce, compute, limits
from ui.playground import registry
from ui.layout import build_demo, launch_options

MODEL_QUEUES = ("run", "compute")      # the concurrency ids of the endpoints that decode (ui/layout.py)
HIDDEN_ERROR = ("The server could not handle this request: an input it cannot use (a file must be one uploaded "
                "to this server) or an error on its side, which it logged.")


class AdmissionQueue(queueing.Queue):
    """Gradio's queue with `max_size` enforced at admission, exactly, and no silent errors.

    At most `max_size` requests wait, besides those being served. Gradio's `Queue.push` checks the size, then awaits
    the endpoint's validator, and only then appends the event: requests that arrive together all pass the check
    (50 at once against max_size 8 had 13 to 37 accepted). And a request Gradio has handed to its handler no longer
    counts in Gradio's queue, though it may still wait: at the engine's gate (ui/playground/coalesce.py), for an
    identical request's turn, or while its models load. So here a request holds a place from before its first
    await until it is appended (then the queue counts it) or refused, and every request the model endpoints'
    handlers hold (`MODEL_QUEUES`) counts as waiting until it is served (`coalesce.serving`). A full queue answers
    "queue_full" (HTTP 503: gradio_client raises QueueError "Queue is full", the page says so, ui/page_head.py).
    Errors Gradio hides from users (show_error is off: a file that was never uploaded, a malformed value) reached
    them as `{"error": null}`; they get HIDDEN_ERROR instead."""

    joining = 0          # requests between the size check and their place in the queue

    def waiting(self) -> int:
        """Requests admitted and not yet served: in Gradio's queue, joining it, or held by a model endpoint's handler
        without being served."""
        held = sum(q.current_concurrency for cid, q in self.event_queue_per_concurrency_id.items()
                   if cid in MODEL_QUEUES)
        return len(self) + self.joining + max(0, held - coalesce.serving())

    async def push(self, body, request, username):
        if self.max_size is not None and self.waiting() >= self.max_size:
            return False, f"Queue is full: {self.max_size} requests are waiting. Try again shortly.", "queue_full"
        self.joining += 1
        try:
            return await super().push(body, request, username)
        finally:
            self.joining -= 1

    def send_message(self, event, event_message):
        if isinstance(event_message, ProcessCompletedMessage) and not event_message.success \
                and event_message.output.get("error") is None:
            event_message.output = {**event_message.output, "error": HIDDEN_ERROR, "visible": True}
        super().send_message(event, event_message)


def queue(demo):
    """The app's queue: `concurrency` runs decode, at most `queue_size` wait (see AdmissionQueue), and no
    endpoint is open to direct POSTs that skip the queue, its size and its validators (Gradio opens them
    unless on a Space)."""
    demo.queue(default_concurrency_limit=4, max_size=limits.current().queue_size, api_open=False)
    # Gradio's public max_size alone lets a burst past it (AdmissionQueue's docstring) and offers no hook for its
    # queue's class: this private swap is why requirements.txt pins gradio exactly (tests/test_pins.py checks it).
    demo._queue.__class__ = AdmissionQueue          # the queue demo.queue built, with the two changes above
    return demo


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Speculative decoding playground")
    parser.add_argument("--allow-custom-models", action="store_true", default=None,
                        help="allow Hugging Face Hub ids besides the presets (safetensors only, no remote code)")
    parser.add_argument("--max-extra-models", type=int, help="models kept loaded besides the default")
    parser.add_argument("--max-run-seconds", type=float, help="wall-clock cap of one run")
    parser.add_argument("--max-new-tokens", type=int, help="token cap of one run")
    parser.add_argument("--queue-size", type=int, help="requests waiting before 'queue is full'")
    parser.add_argument("--concurrency", type=int, help="runs decoding at once")
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: one per core)")
    parser.add_argument("--session-ttl", dest="session_ttl_seconds", type=float,
                        help="seconds a session's state is kept after its last use")
    parser.add_argument("--device", help="where models load: cpu, cuda, cuda:1 (default: CUDA when present)")
    parser.add_argument("--port", type=int, help="the port to serve on (default 7860, or GRADIO_SERVER_PORT)")
    parser.add_argument("--host", help="the address to listen on (default 127.0.0.1, or GRADIO_SERVER_NAME; "
                                       "0.0.0.0 serves other machines)")
    parser.add_argument("--dtype", help="float32 | bfloat16 | float16 (default: float32 on the CPU and for models of "
                                        "0.5B parameters or less, bfloat16 above)")
    return parser.parse_args(argv)


def listen_where(flags: dict, environ=os.environ) -> dict:
    """--port and --host as the variables Gradio's launch() reads (the same settings, named as flags); the other
    flags, returned."""
    for flag, variable in (("port", "GRADIO_SERVER_PORT"), ("host", "GRADIO_SERVER_NAME")):
        value = flags.pop(flag, None)
        if value is not None:
            environ[variable] = str(value)
    return flags


def configure(argv: list[str]) -> None:
    """Limits and placement from SPEC_* variables, then the flags in `argv`; before the demo is built (it starts
    loading the default target). On ZeroGPU the models are loaded here, on the main thread (`zerogpu_models`)."""
    flags = listen_where(vars(parse_args(argv)))
    placement = limits.placement_from_env(device=flags.pop("device"), dtype=flags.pop("dtype"))
    limits.configure(limits.from_env(**flags))
    if limits.current().threads:
        import torch
        torch.set_num_threads(limits.current().threads)
    import spec_engine as se
    se.use_speed_layer()        # before any model runs, loaded or the lab's toy ones (SPEC_ENGINE_ACCEL=0: none)
    registry.REGISTRY.place(**placement)
    if compute.ZEROGPU:
        registry.REGISTRY.preload(zerogpu_models())


def zerogpu_models() -> list[str]:
    """What a ZeroGPU Space serves (no model loads after start-up there): SPEC_ZEROGPU_MODELS (comma separated),
    else the default target and the tokenizer-mismatch demo's draft, those of them that can load here."""
    import spec_engine as se
    names = [n.strip() for n in os.environ.get("SPEC_ZEROGPU_MODELS", "").split(",") if n.strip()]
    names = names or [se.default_model_name(), registry.mismatch_draft_model()]
    return [name for name in dict.fromkeys(names) if registry.availability(name)[0]]


logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
logging.getLogger("ui").setLevel(logging.INFO)      # model loading progress on the console

# Flags only when run as a script: tests import this module under pytest's own argv.
configure(sys.argv[1:] if __name__ == "__main__" else [])
demo = queue(build_demo())

if __name__ == "__main__":
    demo.launch(**launch_options())
