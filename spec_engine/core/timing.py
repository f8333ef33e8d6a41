"""Clock reads that measure device work, not its launch.

CUDA runs kernels asynchronously: a forward returns once its kernels are queued, so `perf_counter()` read right
after it measures the launch, and the work is billed to whatever waits for it next (a host read, another clock).
Every clock read that brackets device work therefore waits for the device first (`clock(device)`). On the CPU
work is done when the call returns, and `sync` costs one attribute read and a comparison.
"""
from __future__ import annotations

from time import perf_counter

import torch


def sync(device) -> None:
    """Wait until the work queued on `device` (a torch.device or its name) is done: torch.cuda.synchronize on
    CUDA, torch.mps.synchronize on Apple GPUs; nothing on the CPU (or on meta, where nothing runs)."""
    kind = torch.device(device).type if isinstance(device, str) else getattr(device, "type", None)
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def clock(device) -> float:
    """perf_counter() once `device` has finished the work queued on it (see `sync`)."""
    sync(device)
    return perf_counter()


_OBSERVERS = "_spec_engine_forward_observers"


def watch_forwards(model, observer) -> None:
    """Call `observer(rows, seconds)` after every timed target forward of `model` the engine makes (a round's verify
    forward, a chain's or a tree's, and a plain decoding step). The draft sizing uses it to correct its verify-cost
    curve online (drafters/sizing.py); kept on the model, like that curve, so every run on the model reports to it."""
    observers = getattr(model, _OBSERVERS, None)
    if observers is None:
        observers = []
        object.__setattr__(model, _OBSERVERS, observers)       # a plain attribute, not a module or a buffer
    observers.append(observer)


def report_forward(model, rows: int, seconds: float) -> None:
    """A forward of `model` over `rows` new tokens took `seconds` (see watch_forwards)."""
    for observer in getattr(model, _OBSERVERS, ()):
        observer(rows, seconds)
