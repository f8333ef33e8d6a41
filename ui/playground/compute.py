"""The GPU functions: every place the playground runs a model, as a generator that takes only picklable values
(settings dataclasses, token ids, numbers, a `Stop`) and yields plain engine results (RoundEvent,
GenerationResult, BaselineResult, progress strings and the small markers below).

Why the split: on ZeroGPU (a Hugging Face Space tier) a function decorated with `spaces.GPU` runs in a forked
worker process that holds a GPU only while the call lasts. Its arguments and each value it yields are pickled
across the process boundary, and nothing it changes in the worker comes back. So the Gradio handlers
(handlers.py, the classroom tabs) keep all per-session state (SessionState with its lock and Stop event, the run
records, the rendering) on the main process, and only ask these functions for results, which they fold into the
session (runner.py) and render. The models are loaded once, at start-up, on the main thread (the registry's
`preload`); a forked worker finds them in its copy of the registry, and ZeroGPU places their weights on its GPU.

Elsewhere (CPU basic, a dedicated GPU, the tests) `gpu` leaves a function as it is: it runs in-process and lazily,
one result per `next()` of the handler, exactly as the handlers ran the engine before the split. Which of the two
happens is chosen at import time by SPACES_ZERO_GPU, the variable the `spaces` package itself reads.

Stopping. In-process a `Stop` is the session's own Event, so Stop reaches the engine between two rounds. Pickled
into a worker it arrives unset and stays so: there Stop reaches the worker when the handler stops pulling and
closes the generator (the handlers check the session's Stop after every result). `spaces` then closes the
function in the worker after the result in flight: within one round, or within one progress message (every
runner.BASELINE_POLL seconds) while a measurement runs; `in_worker` then cancels the measurement. Every call also
has its own deadline (`seconds`): the session's time limit, which also sizes the GPU time it asks ZeroGPU for.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import pickle
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator

import spec_engine as se

from ui.playground import coalesce, engine_thread, runner
from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground.state import RunSettings

log = logging.getLogger("ui.playground.compute")

# GPU seconds a call asks ZeroGPU for beyond its decoding budget: the worker's start and the weights' move onto the
# GPU (small models: a few seconds), the prefill and the build of the drafter.
GPU_MARGIN_SECONDS = 10
# A GPU call's decoding budget on ZeroGPU (see `call_seconds`): a pessimistic rate for the small presets (not yet
# measured on ZeroGPU's hardware), and a floor for prefill and short runs.
ZEROGPU_SECONDS_PER_TOKEN = 0.03
ZEROGPU_MIN_SECONDS = 5.0


def on_zerogpu(environ=None) -> bool:
    """True on a ZeroGPU Space: SPACES_ZERO_GPU, read as the `spaces` package reads it."""
    environ = os.environ if environ is None else environ
    return environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")


ZEROGPU = on_zerogpu()


# ------------------------------------------------------------------------------------- across the boundary

class Stop:
    """A handler's Stop flag as a GPU function's argument (see the module's docstring): the session's Event
    in-process; pickled, a fresh Event that nobody sets."""

    def __init__(self, event: threading.Event | None = None):
        self._event = event if event is not None else threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def __reduce__(self):
        return Stop, ()


@dataclass(frozen=True)
class Failure:
    """An error raised in the worker, carried back as a value: `spaces` passes only gr.Error through (other
    errors arrive as "ZeroGPU worker error" without their message). The handler re-raises `error`, so the same
    readable message reaches the user as in-process."""

    error: BaseException
    trace: str

    @classmethod
    def of(cls, exc: BaseException) -> "Failure":
        try:
            pickle.loads(pickle.dumps(exc))
            carried = exc
        except Exception:             # an exception that cannot cross: its type's family and its message
            family = (ValueError if isinstance(exc, ValueError) else MemoryError if isinstance(exc, MemoryError)
                      else RuntimeError)
            carried = family(str(exc) if family is ValueError else f"{type(exc).__name__}: {exc}")
        return cls(carried, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def throw(self):
        if not isinstance(self.error, (ValueError, MemoryError)):
            log.warning("GPU function failed in the worker:\n%s", self.trace)
        raise self.error


def gpu(duration: Callable[..., float]):
    """Mark a GPU function (a generator). On ZeroGPU it runs under `spaces.GPU` and asks for `duration(*args)`
    seconds, its errors carried back as `Failure`s; elsewhere the function is returned unchanged."""
    def mark(fn):
        if not ZEROGPU:
            return fn
        import spaces       # type: ignore[import-not-found]  # imported by app.py before torch

        @functools.wraps(fn)
        def carried(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as exc:
                yield Failure.of(exc)

        remote = spaces.GPU(duration=lambda *args, **kwargs: math.ceil(duration(*args, **kwargs)))(carried)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            results = remote(*args, **kwargs)
            try:
                for item in results:
                    if isinstance(item, Failure):
                        item.throw()
                    yield item
            finally:
                results.close()          # the handler stopped pulling: spaces stops the worker's loop
        call.gpu_function = fn
        return call
    return mark


def job_seconds(job, *_args, **_kwargs) -> float:
    """GPU time for a job with a `seconds` budget: the budget plus the margin."""
    return job.seconds + GPU_MARGIN_SECONDS


# ------------------------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class Built:
    """The run's decoder is built and its request checked: the label the history shows, the target's dtype, and the
    verify-cost curve its drafts are sized by (None if not sized by cost; kept so "measure again" sizes alike)."""
    label: str
    dtype: str
    sizing: se.Sizing | None = None


@dataclass(frozen=True)
class Phase:
    """A measurement begins: "timed" (the run decoded again, nothing drawn) or "plain" (plain decoding)."""
    name: str


# ------------------------------------------------------------------------------------------------ runs

@dataclass(frozen=True)
class RunJob:
    """One run for `run_job`: what to decode, and which of its three parts to do."""

    settings: RunSettings
    prompt_ids: tuple[int, ...]
    seconds: float                  # decoding budget of the call (the handler's time left, or a share of it)
    live: bool = True               # stream the run's rounds
    warm: bool = False              # without a live pass: decode it once untimed first, nothing yielded but progress
    timed: bool = False             # then decode it again with nothing drawn (its speed)
    plain: bool = False             # then plain decoding, same prompt, settings and seed
    settle: float = 0.0             # seconds between the live run and the timed one (the browser finishes drawing)
    sizing: se.Sizing | None = None    # size drafts by this curve (a run measured again: its first pass's)


def loaded(name: str):
    """A model the registry has loaded; ValueError if it has not (the handler loads before it calls)."""
    model = reg.REGISTRY.loaded(name)
    if model is None:
        raise ValueError(f"{reg.display_name(name)} is not loaded on this server: try again in a moment")
    return model


def build(settings: RunSettings, prompt_ids, sizing: se.Sizing | None = None) -> tuple:
    """(decoder, input_ids, target, Built) for `settings`, from the models the registry holds; with `sizing`, its
    drafts are sized by that verify-cost curve instead of the target's curve as it stands. A sampled run is sized by
    the curve measured at start-up (se.startup_sizing): its seed then fixes its text, whatever ran before it or
    beside it (the curve as it stands follows the timings of the runs before, and with it the draft lengths, which
    a sampled run's text depends on: 2 of 8 seeded requests sent at once gave other texts than alone)."""
    import torch
    kind, spec = drafts.split_draft(settings.draft)
    target = loaded(settings.target)
    if sizing is None and not settings.greedy:
        sizing = se.startup_sizing(target.model)
    draft = loaded(spec.model) if spec.model else None
    options = drafts.DraftOptions(skip_layers=settings.skip_layers, exit_after=settings.exit_after)
    drafter = drafts.build_drafter(spec, target, draft, options, sizing=sizing)
    decoder = se.SpeculativeDecoder(target.model, drafter, rule=settings.rule)
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=target.device)
    se.validate_request(target.model, input_ids, settings.k, settings.max_new_tokens, settings.sampling())
    label = settings.draft
    if kind.name == "layer-skip" and settings.skip_layers.strip():
        label += f" skip {','.join(map(str, drafter.skip_layers))}"
    elif kind.name == "early-exit":
        label = f"early-exit:{len(target.model.model.layers) - len(drafter.skip_layers)}"
    dtype = getattr(target, "dtype", None)
    return decoder, input_ids, target, Built(label, str(dtype).removeprefix("torch.") if dtype is not None else "",
                                             se.drafter_sizing(drafter))


@gpu(job_seconds)
def run_job(job: RunJob, stop: Stop) -> Iterator:
    """Yields Built, then the live RoundEvents (`live`), or Phase("warm") and progress strings (`warm`), then
    Phase("timed"), progress strings and the timed GenerationResult (`timed`), then Phase("plain"), progress strings
    and the BaselineResult (`plain`). A live run that was stopped or ran out of time is not measured; nor is plain
    decoding after a cut-short timed run.

    Every timed pass is the second pass of its decoder: Run's follows its live pass, and a run measured without one
    ("Measure the speedup again", a Sweep k point) decodes once untimed first (`warm`). The first pass of a fresh
    decoder runs slower than its second: the default run on two shared cores (load 8, one thread), 12.5 against
    14.2 tok/s (medians of 4 pairs, every first pass the slower, the cost spread over its rounds), which made "measure
    again" and Sweep k read lower than Run at the same settings.

    Only the timed passes (and plain decoding) correct the target's verify-cost curve (se.not_observed): a first
    pass runs its forwards cold, and a live pass beside a browser drawing it on the same cores, so their multi-row
    forwards read dearer against one-row steps timed quietly, and the next runs drafted smaller trees."""
    s = job.settings
    cpu = engine_thread.for_device(loaded(s.target).device)      # CPU decoding: on the engine's own threads
    decoder, input_ids, target, built = engine_thread.call(lambda: build(s, job.prompt_ids, job.sizing), cpu)
    eos = reg.eos_ids(target)
    budget = runner.Budget(stop, job.seconds)
    yield built
    try:
        if job.live:
            budget.start()
            last = None
            with se.not_observed(target.model):                         # see below
                rounds = engine_thread.call(lambda: decoder.stream(      # stream() prefills before its first round
                    input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                    eos_token_id=eos, should_stop=budget.should_stop), cpu)
                for last in engine_thread.iterate(rounds, cpu):
                    yield last
            if last is None or last.stop_reason == "cancelled":
                return
        elif job.warm and job.timed:
            yield Phase("warm")
            budget.start()
            with se.not_observed(target.model):
                warmed = yield from runner.in_worker(lambda: decode_once(decoder, input_ids, s, eos, budget, False),
                                                     budget, "warm-up", engine=cpu)
            if warmed.stop_reason == "cancelled" or budget.timed_out:
                return
        if job.timed:
            yield Phase("timed")
            if job.live or job.warm:
                stop.wait(job.settle)
            budget.start()
            result = yield from runner.in_worker(
                lambda: decode_once(decoder, input_ids, s, eos, budget, False), budget, "timed-run", engine=cpu)
            yield result
            if result.stop_reason == "cancelled" or budget.timed_out:
                return
        if job.plain:
            yield Phase("plain")
            budget.start()
            yield (yield from runner.in_worker(
                lambda: se.autoregressive_generate(target.model, input_ids, max_new_tokens=s.max_new_tokens,
                                                   sampling=s.sampling(), seed=s.seed, eos_token_id=eos,
                                                   should_stop=budget.should_stop),
                budget, "plain-decoding", engine=cpu))
    finally:
        budget.cancel.set()


def decode_once(decoder, input_ids, s: RunSettings, eos, budget: runner.Budget, display: bool):
    """One whole run of `decoder` with the settings and seed of `s` (its warm-up pass and its timed pass alike)."""
    return decoder.generate(input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                            eos_token_id=eos, should_stop=budget.should_stop, display=display)


def call_seconds(budget: runner.Budget, tokens: int, share: float | None = None) -> float:
    """The decoding budget of one GPU call: what is left of the handler's `budget`, or its `share` of it. On ZeroGPU
    also at most what decoding `tokens` tokens takes at ZEROGPU_SECONDS_PER_TOKEN, so that a short run asks for a
    short GPU slot: ZeroGPU refuses a call that asks for more than the visitor's quota has left."""
    seconds = budget.remaining if share is None else min(share, budget.remaining)
    if ZEROGPU:
        seconds = min(seconds, ZEROGPU_MIN_SECONDS + tokens * ZEROGPU_SECONDS_PER_TOKEN)
    return seconds


def pull(work: Iterator, stop: threading.Event, done: Callable[[], bool] = lambda: False,
         gated: bool = False) -> Iterator:
    """The results of a GPU function until it ends, Stop is set or `done()` holds; it is closed either way (on
    ZeroGPU that ends the worker's loop, see the module's docstring). `gated`: the work starts only at its turn at
    the engine's gate (coalesce.py), where runs wait too, so a lab or a sweep never decodes beside a run beyond
    the concurrency (a run passes False: it waits at the gate itself). While it waits, its coalesce.Waiting items
    come through (the caller shows the place in line, and yields, so that a closed tab can end it)."""
    if gated:
        inner = work                # a generator: nothing runs before its turn
        work = coalesce.gated(lambda: inner, stop.is_set)
    try:
        for item in work:
            if gated and isinstance(item, coalesce.Label):
                continue            # "measured under load" labels a run's timing; these callers time no run
            yield item
            if stop.is_set() or done():
                return
    finally:
        work.close()
