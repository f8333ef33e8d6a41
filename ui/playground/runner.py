"""Gradio-free glue on the handler's side (the main process): settings -> a prepared run, and the GPU functions'
results -> the session.

`prepare` loads what a run needs (yielding progress messages) and holds the models, encodes the prompt and checks
the request; the engine itself runs in a GPU function (compute.py), which yields plain results. The fold functions
(`begin`, `record_round`, `end_rounds`, `keep_timing`, `keep_baseline`, `keep_live_timing`) put those results into
the session's RunRecord, so per-session state never crosses into the GPU function (on ZeroGPU that runs in another
process, see compute.py). User mistakes surface as ValueError with a message meant for people.

A `Budget` says when a handler call must stop: Stop pressed, the caller gone, or its wall-clock cap reached.
`release` closes the run's GPU function (its decoder, drafter and caches go with it) and lets go of the models it
held, so a finished, stopped or abandoned run keeps no memory.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from time import monotonic
from typing import Iterator

import spec_engine as se

from ui.playground import coalesce, engine_thread, limits, validate
from ui.playground import registry as reg
from ui.playground import drafts
from ui.views.render import RenderOptions, round_html
from ui.playground.state import RunRecord, RunSettings, SessionState, Timing

TIME_LIMIT = "time limit"      # RunRecord.stop_reason when the Budget's deadline ended the run
# Seconds between progress messages while a measurement runs: each one is redrawn by the browser, which on the same
# two cores slows the engine it measures (chromium used ~0.2 cores at 4 messages a second).
BASELINE_POLL = 2.0


class Budget:
    """When one handler call must stop: the session's Stop event, `cancel` (set when the caller is gone),
    or `seconds` of decoding after `start()` (model loading does not count).

    A handler that makes several runs (a k sweep, the mismatch demo) gives each run its own `child()`: the
    children share the handler's Stop event and deadline, and `release` cancels only the finished run's child,
    never the budget the next run still needs."""

    def __init__(self, stop_event: threading.Event, seconds: float | None = None, parent: "Budget | None" = None,
                 own_deadline: bool = False):
        self.stop_event = stop_event
        self.seconds = limits.current().max_run_seconds if seconds is None else seconds
        self.cancel = threading.Event()
        self.parent = parent
        self.own_deadline = parent is None or own_deadline      # a child shares its parent's unless given a share
        self._deadline: float | None = None

    def child(self, seconds: float | None = None) -> "Budget":
        """A budget for one run of this handler: the same Stop and deadline, its own cancel, and with `seconds`
        also a deadline of its own (a share of the whole, so one slow run cannot starve the runs after it)."""
        return Budget(self.stop_event, self.seconds if seconds is None else seconds, parent=self,
                      own_deadline=seconds is not None)

    @property
    def deadline(self) -> float | None:
        deadlines = [d for d in (self.parent.deadline if self.parent is not None else None,
                                 self._deadline if self.own_deadline else None) if d is not None]
        return min(deadlines) if deadlines else None

    @property
    def remaining(self) -> float:
        """Seconds of decoding left: all of them before `start()`."""
        deadline = self.deadline
        return self.seconds if deadline is None else max(0.0, deadline - monotonic())

    def start(self) -> None:
        if self.parent is not None:
            self.parent.start()
        if self.own_deadline and self._deadline is None:
            self._deadline = monotonic() + self.seconds

    @property
    def timed_out(self) -> bool:
        return self.deadline is not None and monotonic() >= self.deadline

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set() or (self.parent is not None and self.parent.cancelled)

    def should_stop(self) -> bool:
        return self.stop_event.is_set() or self.cancelled or self.timed_out


@dataclass
class Prepared:
    """A run as its handler keeps it: the settings, the prompt's ids, how to render it, and its record once the
    GPU function has built the run (`begin`)."""

    settings: RunSettings
    prompt_ids: tuple[int, ...]
    labeler: object
    options: RenderOptions
    record: RunRecord | None = None
    held: list[str] = field(default_factory=list)     # registry names this run holds (released by `release`)
    work: Iterator | None = None                       # the GPU function's results while it runs

    @property
    def prompt_text(self) -> str:
        return self.labeler.text(self.prompt_ids)


def load(names: list[str], registry: reg.ModelRegistry, held: list[str] | None = None) -> Iterator[str]:
    """Yield progress while the models load; returns {name: LoadedModel}. Load errors become ValueError.
    With `held` (a list), each model is held as soon as it is loaded and its name appended, so the caller
    must `registry.release` them; if loading stops half-way (an error, or the caller closed), the models
    held so far are released here."""
    loaded, mine = {}, []
    try:
        for name in dict.fromkeys(names):
            ok, reason = reg.availability(name)
            if not ok:
                raise ValueError(f"{reg.display_name(name)} cannot be loaded here: {reason}")
            try:
                if held is None:
                    loaded[name] = yield from registry.wait(name)
                else:
                    loaded[name] = yield from registry.acquire(name)
                    mine.append(name)
            except (MemoryError, RuntimeError, OSError) as exc:
                raise ValueError(f"loading {reg.display_name(name)} failed: {exc}") from exc
    except BaseException:
        for name in mine:
            registry.release(name)
        raise
    if held is not None:
        held.extend(mine)
    return loaded


def encode(target, prompt: str, chat: bool) -> list[int]:
    """The prompt's ids as the engine will see them, computed on the CPU: the handler's process never moves a
    tensor to the GPU (on ZeroGPU it may not, outside its main thread)."""
    import torch
    on_cpu = dataclasses.replace(target, device=torch.device("cpu"))    # the same tokenizer, no weights copied
    return on_cpu.encode_prompt(prompt, chat=chat)[0].tolist()


def prepare(settings: RunSettings, state: SessionState, registry: reg.ModelRegistry, show_spaces: bool = False,
            hold: bool = False, record: RunRecord | None = None) -> Iterator[str]:
    """Load (yielding progress) and check a run; returns a Prepared. With `hold`, the models stay held until
    `release(prep, registry)`. With `record` (a finished run), the GPU function's results belong to that run
    instead of a new one (to time it again)."""
    kind, spec = drafts.split_draft(settings.draft)
    ok, reason = kind.available(settings.target)
    if not ok:
        raise ValueError(f"draft {settings.draft!r} is not available for {reg.display_name(settings.target)}: {reason}")
    held: list[str] | None = [] if hold else None
    models = yield from load([settings.target] + ([spec.model] if spec.model else []), registry, held)
    try:
        target = models[settings.target]
        prompt_ids = encode(target, settings.prompt, settings.chat)
        validate.check_prompt_fits(len(prompt_ids), settings.max_new_tokens, se.context_length(target.model),
                                   settings.target)
        if spec.mode == "same-tokenizer":
            validate.check_same_tokenizer(target, models[spec.model], spec.model)
        options = RenderOptions(show_spaces=show_spaces, greedy=settings.greedy, rule=settings.rule)
        return Prepared(settings, tuple(prompt_ids), registry.labeler(target), options, record, held or [])
    except BaseException:
        for name in held or []:
            registry.release(name)
        raise


def release(prep: Prepared | None, registry: reg.ModelRegistry) -> None:
    """The run is over (finished, stopped, timed out or abandoned): close its GPU function (its decoder and caches
    go with it) and let go of the models it held. The record, labeler and settings stay for the views."""
    if prep is None:
        return
    work, prep.work = prep.work, None
    held, prep.held = prep.held, []
    try:
        if work is not None:
            work.close()        # may raise (a generator closed while it runs elsewhere): the holds go regardless
    finally:
        for name in held:
            registry.release(name)


# ------------------------------------------------------------------------- the GPU function's results

def begin(prep: Prepared, state: SessionState, label: str, dtype: str, sizing=None) -> RunRecord:
    """The GPU function has built the run: its record, a new run of the session unless `prepare` was given one.
    `sizing` is the verify-cost curve its drafts were sized by: a record keeps its first pass's."""
    if prep.record is None:
        prep.record = state.new_run(prep.settings, label, prep.prompt_ids)
    prep.record.dtype = dtype                      # bf16: near-ties may differ from plain decoding
    if prep.record.sizing is None:
        prep.record.sizing = sizing
    return prep.record


def record_round(prep: Prepared, state: SessionState, event: se.RoundEvent) -> bool:
    """Store a live round in the record (rendered once). False, and the round dropped, once the Stop handler has
    recorded the run as it stood. A run the engine cancelled without the session's Stop ran out of time."""
    fragment = round_html(event, prep.labeler, prep.options)
    record = prep.record
    with state.lock:
        if record.recorded:
            return False
        record.fragments.append(fragment)
        record.rounds.append(event)
        if event.stop_reason:
            timed_out = event.stop_reason == "cancelled" and not state.stop_event.is_set()
            record.stop_reason = TIME_LIMIT if timed_out else event.stop_reason
    return True


def end_rounds(prep: Prepared, state: SessionState, timed_out: bool = False) -> None:
    """The live run is over: one closed before its last round (Stop, a cancelled API job, a closed tab) is
    recorded as cancelled, or as stopped by the time limit when `timed_out` and not by Stop (a long prompt's
    prefill can use up the budget before the first round)."""
    record = prep.record
    if record is None:
        return
    with state.lock:
        if record.stop_reason is None and not (record.rounds and record.rounds[-1].finished):
            record.stop_reason = TIME_LIMIT if timed_out and not state.stop_event.is_set() else "cancelled"


SHARED_MEASUREMENT = "by the computation shared with another student"


def keep_timing(record: RunRecord, state: SessionState, result: se.GenerationResult, labeler=None,
                options: RenderOptions | None = None, shared: bool = False) -> Timing | None:
    """The run decoded again with its own settings and seed and nothing drawn becomes its speed
    (`RunRecord.timing`). The live run drew every round in the browser on the same cores, which slows the engine
    by a different amount for every run; plain decoding is measured without drawing, so the speculative side is
    too. The rounds must equal the live ones (same seed, same code): otherwise the timing is not kept. A run with no
    rounds yet takes the timed run's as its own, rendered with `labeler` and `options` (the app's buttons all time a
    second pass after a first that gave the record its rounds: handlers.measurement_job). `shared`: another
    request's computation measured it (this request followed it: coalesce.py), and its `how` says so. None if the
    timed run was stopped."""
    if result.stop_reason == "cancelled":
        return None
    how = "decoded again without drawing"
    if not record.rounds:       # measured without a first pass: the timed run is the run itself
        fragments = [round_html(event, labeler, options) for event in result.rounds] if labeler is not None else []
        with state.lock:
            record.fragments.extend(fragments)
            record.rounds.extend(result.rounds)
            record.stop_reason = result.stop_reason
        how = "decoded without drawing"
    if shared:
        how += f" ({SHARED_MEASUREMENT})"
    same = result.tokens == record.tokens and len(result.rounds) == len(record.rounds)
    if not same:      # cannot happen with a deterministic engine; if it does, say so rather than mix two runs
        raise ValueError("the timed run differs from the live run (same settings and seed): its speed is not shown")
    # The live rounds with the timed run's clocks: a timed run after a live one decodes with display=False (nothing
    # beyond what plain decoding computes), so its own events leave out the p, q and top entries the views read.
    rounds = tuple(dataclasses.replace(live, draft_seconds=timed.draft_seconds, verify_seconds=timed.verify_seconds,
                                       round_seconds=timed.round_seconds, prefill_seconds=timed.prefill_seconds)
                   for live, timed in zip(record.rounds, result.rounds))
    timing = Timing(seconds=result.total_seconds, tokens=len(result.tokens), rounds=rounds, at=time.time(), how=how)
    with state.lock:
        record.timing = timing
    return timing


def keep_live_timing(record: RunRecord, state: SessionState) -> None:
    """A run driven without drawing (a sweep point, the mismatch demo) is its own timing."""
    with state.lock:
        record.timing = Timing(seconds=record.engine_seconds, tokens=len(record.tokens), rounds=tuple(record.rounds),
                               at=time.time(), how="run without drawing")


def keep_baseline(record: RunRecord, state: SessionState, result: se.BaselineResult,
                  reused=None, shared: bool = False) -> se.BaselineResult | None:
    """Plain decoding with the run's settings, measured right after it: the session's baseline for its key, and
    the run's own. With `reused` (coalesce.Reused) it was measured earlier by another request, and says how long
    ago; `shared`: measured by another request's computation that this one followed. None if it was stopped."""
    if result.stop_reason == "cancelled":
        return None
    at = None if reused is None else reused.at
    note = SHARED_MEASUREMENT if shared else None
    if reused is not None:
        note = f"reused: measured {coalesce.age_text(time.time() - reused.at)} before by an identical request"
        if reused.under_load:
            note += f", {reused.under_load}"
    state.add_baseline(record.baseline_key, result, run_id=record.run_id, at=at, note=note)
    with state.lock:
        record.plain = (result, state.baseline_info[record.baseline_key]["at"])
        record.plain_note = note
    return result


def add_label(record: RunRecord, state: SessionState, text: str) -> None:
    """A line about how the run was computed (shared with another student, under load), shown with its speed."""
    with state.lock:
        if text not in record.labels:
            record.labels.append(text)


def in_worker(work, budget: Budget, label: str, engine: bool = False) -> Iterator[str]:
    """Run `work()` in a worker thread while yielding "N s" progress lines; returns its result (re-raises its
    error). Nothing else runs on the engine's path meanwhile: the caller only wakes every BASELINE_POLL seconds.
    If the caller is closed (Stop, a closed tab), `budget.cancel` stops the work within one token or round.
    `engine`: the worker is one of the engine's long-lived threads (engine_thread.py: CPU decoding), not a new one."""
    if engine:
        future = engine_thread.submit(work)
    else:
        future = concurrent.futures.Future()

        def run():
            try:
                future.set_result(work())
            except BaseException as exc:   # re-raised in the caller's thread
                future.set_exception(exc)

        threading.Thread(target=run, name=label, daemon=True).start()
    began = monotonic()
    try:
        while True:
            try:
                return future.result(timeout=BASELINE_POLL)
            except concurrent.futures.TimeoutError:
                yield f"{monotonic() - began:.0f} s"
    finally:
        if not future.done():
            budget.cancel.set()
            concurrent.futures.wait([future])
