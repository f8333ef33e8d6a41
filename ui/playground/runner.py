"""Gradio-free glue between settings, the model registry and the engine.

`prepare` loads what a run needs (yielding progress messages) and builds a fresh drafter and decoder;
`rounds` drives the engine, records each RoundEvent in the session's RunRecord and renders it once;
`timed` and `baseline` measure the speedup: the speculative run is decoded again, and plain decoding once, with
nothing drawn while they run (a worker thread; the handler only yields a short progress line), so both sides of
the speedup are measured the same way, whatever the live view cost the run it drew. User mistakes surface as
ValueError with a message meant for people.

A run owns everything mutable it touches (its drafter, both KV caches, its torch.Generator); the models are
shared read-only. A `Budget` says when a handler call must stop: Stop pressed, the caller gone, or its
wall-clock cap reached; the engine asks it once per round. `release` drops the run's decoder (and with it
the caches) and lets go of the models it held, so a finished, stopped or abandoned run keeps no memory.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from time import monotonic
from typing import Iterator

import spec_engine as se

from ui.playground import limits, validate
from ui.playground import registry as reg
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
    settings: RunSettings
    target: object                 # spec_engine.models.LoadedModel
    input_ids: object              # LongTensor [1, T]
    decoder: se.SpeculativeDecoder
    record: RunRecord
    labeler: object
    options: RenderOptions
    eos: object
    budget: Budget | None = None
    held: list[str] = field(default_factory=list)     # registry names this run holds (released by `release`)

    @property
    def prompt_text(self) -> str:
        return self.labeler.text(self.record.prompt_ids)


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


def prepare(settings: RunSettings, state: SessionState, registry: reg.ModelRegistry,
            show_spaces: bool = False, budget: Budget | None = None, hold: bool = False,
            record: RunRecord | None = None, share: float | None = None) -> Iterator[str]:
    """Load, build and check a run. With `hold`, the models stay held until `release(prep, registry)`. With
    `record` (a finished run), the fresh decoder belongs to that run instead of a new one (to time it again). With
    `share` (seconds), the run also stops after that long, within the handler's deadline (`Budget.child`)."""
    kind, spec = reg.split_draft(settings.draft)
    ok, reason = kind.available(settings.target)
    if not ok:
        raise ValueError(f"draft {settings.draft!r} is not available for {reg.display_name(settings.target)}: {reason}")
    held: list[str] | None = [] if hold else None
    models = yield from load([settings.target] + ([spec.model] if spec.model else []), registry, held)
    try:
        return build(settings, state, registry, models, kind, spec, show_spaces,
                     None if budget is None else budget.child(share), held or [], record)
    except BaseException:
        for name in held or []:
            registry.release(name)
        raise


def build(settings: RunSettings, state: SessionState, registry: reg.ModelRegistry, models: dict, kind, spec,
          show_spaces: bool, budget: Budget | None, held: list[str], record: RunRecord | None = None) -> Prepared:
    target = models[settings.target]
    sampling = settings.sampling()
    input_ids = target.encode_prompt(settings.prompt, chat=settings.chat)
    context = se.context_length(target.model)
    validate.check_prompt_fits(int(input_ids.shape[1]), settings.max_new_tokens, context, settings.target)
    if spec.mode == "same-tokenizer":
        validate.check_same_tokenizer(target, models[spec.model], spec.model)
    options = reg.DraftOptions(skip_layers=settings.skip_layers, exit_after=settings.exit_after)
    drafter = kind.build(spec, target, models.get(spec.model), options)
    decoder = se.SpeculativeDecoder(target.model, drafter, rule=settings.rule)
    se.validate_request(target.model, input_ids, settings.k, settings.max_new_tokens, sampling)
    label = reg.draft_label(settings.draft)
    if kind.key == "layer-skip" and settings.skip_layers.strip():
        label += f" skip {','.join(map(str, drafter.skip_layers))}"
    elif kind.key == "early-exit":
        label = f"early-exit:{len(target.model.model.layers) - len(drafter.skip_layers)}"
    if record is None:
        record = state.new_run(settings, label, input_ids[0].tolist())
    dtype = getattr(target, "dtype", None)
    record.dtype = str(dtype).removeprefix("torch.") if dtype is not None else ""   # bf16: near-ties may differ
    opts = RenderOptions(show_spaces=show_spaces, greedy=settings.greedy, rule=settings.rule)
    return Prepared(settings, target, input_ids, decoder, record, registry.labeler(target), opts,
                    reg.eos_ids(target), budget, held)


def release(prep: Prepared | None, registry: reg.ModelRegistry) -> None:
    """The run is over (finished, stopped, timed out or abandoned): stop anything it started, drop its decoder
    (drafter and caches) and the models it held. The record, labeler and settings stay for the views."""
    if prep is None:
        return
    if prep.budget is not None:
        prep.budget.cancel.set()
    prep.decoder = None
    prep.target = None
    held, prep.held = prep.held, []
    for name in held:
        registry.release(name)


def rounds(prep: Prepared, state: SessionState) -> Iterator[se.RoundEvent]:
    """Run the engine; every event is stored in the record (rendered once) before it is yielded. Ends early,
    dropping the round in flight, once the Stop handler has recorded the run. The budget's deadline ends it
    as "time limit"."""
    s = prep.settings
    should_stop = state.stop_event.is_set if prep.budget is None else prep.budget.should_stop
    if prep.budget is not None:
        prep.budget.start()
    stream = prep.decoder.stream(prep.input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(),
                                 seed=s.seed, eos_token_id=prep.eos, should_stop=should_stop)
    try:
        yield from record_rounds(prep, state, stream)
    finally:
        with state.lock:    # closed from outside before its last round: a cancelled API job, a closed tab
            if prep.record.stop_reason is None and not (prep.record.rounds and prep.record.rounds[-1].finished):
                prep.record.stop_reason = "cancelled"


def record_rounds(prep: Prepared, state: SessionState, stream) -> Iterator[se.RoundEvent]:
    for event in stream:
        fragment = round_html(event, prep.labeler, prep.options)
        with state.lock:
            if prep.record.recorded:      # Stop already recorded the run as it stood: drop the late round
                return
            prep.record.fragments.append(fragment)
            prep.record.rounds.append(event)
            if event.stop_reason:
                timed_out = (event.stop_reason == "cancelled" and prep.budget is not None and prep.budget.timed_out
                             and not state.stop_event.is_set())
                prep.record.stop_reason = TIME_LIMIT if timed_out else event.stop_reason
        yield event


def in_worker(work, budget: Budget, label: str) -> Iterator[str]:
    """Run `work()` in a worker thread while yielding "N s" progress lines; returns its result (re-raises its
    error). Nothing else runs on the engine's path meanwhile: the handler only wakes every BASELINE_POLL seconds.
    If the handler is closed (Stop, a closed tab), `budget.cancel` stops the work within one token or round."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = work()
        except BaseException as exc:   # re-raised in the handler's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name=label, daemon=True)
    began = monotonic()
    worker.start()
    try:
        while True:
            worker.join(BASELINE_POLL)
            if not worker.is_alive():
                break
            yield f"{monotonic() - began:.0f} s"
    finally:
        if worker.is_alive():
            budget.cancel.set()
            worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def timed(prep: Prepared, state: SessionState, budget: Budget | None = None) -> Iterator[str]:
    """Decode the run again with its own settings and seed and nothing drawn, and keep that timing as the run's
    speed (`RunRecord.timing`). The live run drew every round in the browser on the same cores, which slows the
    engine by a different amount for every run; plain decoding is measured without drawing, so the speculative
    side is too. The rounds must equal the live ones (same seed, same code): otherwise the timing is not kept.
    Returns the Timing, or None if it was stopped."""
    record, s = prep.record, prep.settings
    budget = budget or Budget(state.stop_event)
    budget.start()
    result = yield from in_worker(
        lambda: prep.decoder.generate(prep.input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(),
                                      seed=s.seed, eos_token_id=prep.eos, should_stop=budget.should_stop),
        budget, "timed-run")
    if result.stop_reason == "cancelled":
        return None
    same = result.tokens == record.tokens and len(result.rounds) == len(record.rounds)
    if not same:      # cannot happen with a deterministic engine; if it does, say so rather than mix two runs
        raise ValueError("the timed run differs from the live run (same settings and seed): its speed is not shown")
    timing = Timing(seconds=result.total_seconds, tokens=len(result.tokens), rounds=tuple(result.rounds),
                    at=time.time(), how="decoded again without drawing")
    with state.lock:
        record.timing = timing
    return timing


def keep_live_timing(record: RunRecord, state: SessionState) -> None:
    """A run driven without drawing (a sweep point, the mismatch demo) is its own timing."""
    with state.lock:
        record.timing = Timing(seconds=record.engine_seconds, tokens=len(record.tokens), rounds=tuple(record.rounds),
                               at=time.time(), how="run without drawing")


def baseline(target, record: RunRecord, state: SessionState, force: bool = False, budget: Budget | None = None):
    """Plain decoding with the run's settings, cached per baseline key (`force` measures again: timings on a
    shared machine vary), in a worker thread with nothing drawn (`in_worker`). Returns the BaselineResult, or
    None if Stop, the caller's departure or the time limit ended it."""
    cached = state.baselines.get(record.baseline_key)
    if cached is not None and not force:
        return cached
    import torch
    budget = budget or Budget(state.stop_event)
    budget.start()
    s = record.settings
    ids = torch.tensor([list(record.prompt_ids)], dtype=torch.long, device=target.device)
    result = yield from in_worker(
        lambda: se.autoregressive_generate(target.model, ids, max_new_tokens=s.max_new_tokens, sampling=s.sampling(),
                                           seed=s.seed, eos_token_id=reg.eos_ids(target),
                                           should_stop=budget.should_stop),
        budget, "plain-decoding")
    if result.stop_reason == "cancelled":
        return None
    state.add_baseline(record.baseline_key, result, run_id=record.run_id)
    with state.lock:
        record.plain = (result, state.baseline_info[record.baseline_key]["at"])
    return result
