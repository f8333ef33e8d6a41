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
