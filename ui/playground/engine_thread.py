"""Every CPU decode of the app on one long-lived thread: the engine's thread.

Why (measured 2026-12-02 on the 2-core AMD EPYC, torch 2.13 with its bundled GNU OpenMP): SmolLM2's plain decoding
ran at 31-38 tok/s on the main thread and 20-25 tok/s on any other thread, and the engine's blocked fp32 kernel took
2.9 ms for 30 layer products on the main thread against 4.9 ms on another. GNU OpenMP keeps a pool of worker threads
for each thread that opens a parallel region, and once its managed threads outnumber the cores it stops spinning
between regions ("throttled" spin: workers sleep and are woken for each region), which costs a small model's short
kernels a third of their speed. The app decoded on Gradio's handler threads and on a fresh worker thread for each
measurement: several pools, so every run was throttled, the speculative side more than plain decoding (more, shorter
regions). All of a run's decoding now happens on `workers` long-lived threads (one per run decoding at once, the
server's concurrency), so there are no more pools than cores would allow. No library offers this placement for an
eager torch loop; it is a ThreadPoolExecutor with a fixed size, behind two functions.

    result = call(fn)                   # fn() on an engine thread, its result or its error here
    for item in iterate(generator):     # each next() on an engine thread, the items here

Only CPU work moves (`for_device`): on a GPU the OpenMP pools do not decode, and ZeroGPU's worker owns its thread.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_WORKERS = 0
_LOCAL = threading.local()          # .engine: True on the engine's own threads


def _mark() -> None:
    _LOCAL.engine = True


def pool(workers: int) -> ThreadPoolExecutor:
    """The engine's threads, `workers` of them (made again when the server's concurrency changes)."""
    global _POOL, _WORKERS
    with _LOCK:
        if _POOL is None or _WORKERS != workers:
            old, _POOL, _WORKERS = _POOL, ThreadPoolExecutor(max_workers=max(1, workers),
                                                             thread_name_prefix="engine", initializer=_mark), workers
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def on_engine_thread() -> bool:
    return getattr(_LOCAL, "engine", False)


def _workers() -> int:
    from ui.playground import limits
    return limits.current().concurrency


def call(fn: Callable[[], T], enabled: bool = True) -> T:
    """fn() on an engine thread (inline when already on one, or when not `enabled`); its result, or its error raised
    here. Blocks the calling thread, which holds no lock the engine needs."""
    return submit(fn, enabled).result()


def submit(fn: Callable[[], T], enabled: bool = True):
    """fn() on an engine thread, as a Future (a finished one when it ran inline)."""
    from concurrent.futures import Future
    if not enabled or on_engine_thread():
        done: Future = Future()
        try:
            done.set_result(fn())
        except BaseException as exc:     # noqa: BLE001 - handed to the caller through the future
            done.set_exception(exc)
        return done
    return pool(_workers()).submit(fn)


_DONE = object()


def iterate(generator: Iterator[T], enabled: bool = True) -> Iterator[T]:
    """The items of `generator`, each computed on an engine thread (the consumer's work between items, such as
    drawing a round, stays on the consumer's thread). Closing this closes `generator`, on the caller's thread: no
    next() of it is running then, since one is asked for only when the consumer wants an item."""
    if not enabled:
        yield from generator
        return
    try:
        while True:
            item = call(lambda: next(generator, _DONE))
            if item is _DONE:
                return
            yield item
    finally:
        generator.close()


def for_device(device) -> bool:
    """Whether work on `device` moves to the engine's threads: CPU work, outside ZeroGPU."""
    from ui.playground import compute
    return getattr(device, "type", str(device)) == "cpu" and not compute.ZEROGPU
