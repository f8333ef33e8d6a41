"""Gradio-free glue between settings, the model registry and the engine.

`prepare` loads what a run needs (yielding progress messages) and builds a fresh drafter and decoder;
`rounds` drives the engine, records each RoundEvent in the session's RunRecord and renders it once;
`baseline` measures plain decoding with the same settings and caches it in the session. User mistakes
surface as ValueError with a message meant for people.

A run owns everything mutable it touches (its drafter, both KV caches, its torch.Generator); the models are
shared read-only. A `Budget` says when a handler call must stop: Stop pressed, the caller gone, or its
wall-clock cap reached; the engine asks it once per round. `release` drops the run's decoder (and with it
the caches) and lets go of the models it held, so a finished, stopped or abandoned run keeps no memory.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from time import monotonic
from typing import Iterator

import spec_engine as se

from . import limits, validate
from . import registry as reg
from .render import RenderOptions, round_html
from .state import RunRecord, RunSettings, SessionState

TIME_LIMIT = "time limit"      # RunRecord.stop_reason when the Budget's deadline ended the run
BASELINE_POLL = 0.25           # seconds between progress messages while plain decoding runs


class Budget:
    """When one handler call must stop: the session's Stop event, `cancel` (set when the caller is gone),
    or `seconds` of decoding after `start()` (model loading does not count)."""

    def __init__(self, stop_event: threading.Event, seconds: float | None = None):
        self.stop_event = stop_event
        self.seconds = limits.current().max_run_seconds if seconds is None else seconds
        self.cancel = threading.Event()
        self.deadline: float | None = None

    def start(self) -> None:
        if self.deadline is None:
            self.deadline = monotonic() + self.seconds

    @property
    def timed_out(self) -> bool:
        return self.deadline is not None and monotonic() >= self.deadline

    def should_stop(self) -> bool:
        return self.stop_event.is_set() or self.cancel.is_set() or self.timed_out


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
            show_spaces: bool = False, budget: Budget | None = None, hold: bool = False) -> Iterator[str]:
    """Load, build and check a run. With `hold`, the models stay held until `release(prep, registry)`."""
    kind, spec = reg.split_draft(settings.draft)
    ok, reason = kind.available(settings.target)
    if not ok:
        raise ValueError(f"draft {settings.draft!r} is not available for {reg.display_name(settings.target)}: {reason}")
    held: list[str] | None = [] if hold else None
    models = yield from load([settings.target] + ([spec.model] if spec.model else []), registry, held)
    try:
        return build(settings, state, registry, models, kind, spec, show_spaces, budget, held or [])
    except BaseException:
        for name in held or []:
            registry.release(name)
        raise


def build(settings: RunSettings, state: SessionState, registry: reg.ModelRegistry, models: dict, kind, spec,
          show_spaces: bool, budget: Budget | None, held: list[str]) -> Prepared:
    target = models[settings.target]
    sampling = settings.sampling()
    input_ids = target.encode_prompt(settings.prompt, chat=settings.chat)
    context = se.decoder.context_length(target.model)
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
    record = state.new_run(settings, label, input_ids[0].tolist())
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


def baseline(target, record: RunRecord, state: SessionState, force: bool = False, budget: Budget | None = None):
    """Plain decoding with the run's settings, cached per baseline key (`force` measures again: timings on a
    shared machine vary). A generator: it yields elapsed-time messages while a worker thread decodes, so the
    handler stays responsive; if the handler is closed, the worker stops within one token. Returns the
    BaselineResult, or None if Stop, the caller's departure or the time limit ended it."""
    cached = state.baselines.get(record.baseline_key)
    if cached is not None and not force:
        return cached
    import torch
    budget = budget or Budget(state.stop_event)
    budget.start()
    s = record.settings
    ids = torch.tensor([list(record.prompt_ids)], dtype=torch.long, device=target.device)
    outcome: dict = {}

    def work():
        try:
            outcome["result"] = se.autoregressive_generate(
                target.model, ids, max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                eos_token_id=reg.eos_ids(target), should_stop=budget.should_stop)
        except BaseException as exc:   # re-raised in the handler's thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="plain-decoding", daemon=True)
    began = monotonic()
    worker.start()
    try:
        while True:
            worker.join(BASELINE_POLL)
            if not worker.is_alive():
                break
            yield f"{monotonic() - began:.0f} s"
    finally:
        if worker.is_alive():          # the handler was closed (Stop, a closed tab): stop within one token
            budget.cancel.set()
            worker.join()
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    if result.stop_reason == "cancelled":
        return None
    state.add_baseline(record.baseline_key, result)
    return result
