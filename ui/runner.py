"""Gradio-free glue between settings, the model registry and the engine.

`prepare` loads what a run needs (yielding progress messages) and builds a fresh drafter and decoder;
`rounds` drives the engine, records each RoundEvent in the session's RunRecord and renders it once;
`baseline` measures plain decoding with the same settings and caches it in the session. User mistakes
surface as ValueError with a message meant for people.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import spec_engine as se

from . import registry as reg
from .render import RenderOptions, round_html
from .state import RunRecord, RunSettings, SessionState


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

    @property
    def prompt_text(self) -> str:
        return self.labeler.text(self.record.prompt_ids)


def load(names: list[str], registry: reg.ModelRegistry) -> Iterator[str]:
    """Yield progress while the models load; returns {name: LoadedModel}. Load errors become ValueError."""
    loaded = {}
    for name in dict.fromkeys(names):
        ok, reason = reg.availability(name)
        if not ok:
            raise ValueError(f"{reg.display_name(name)} cannot be loaded here: {reason}")
        try:
            loaded[name] = yield from registry.wait(name)
        except (MemoryError, RuntimeError) as exc:
            raise ValueError(f"loading {reg.display_name(name)} failed: {exc}") from exc
    return loaded


def prepare(settings: RunSettings, state: SessionState, registry: reg.ModelRegistry,
            show_spaces: bool = False) -> Iterator[str]:
    kind, spec = reg.split_draft(settings.draft)
    ok, reason = kind.available(settings.target)
    if not ok:
        raise ValueError(f"draft {settings.draft!r} is not available for {reg.display_name(settings.target)}: {reason}")
    models = yield from load([settings.target] + ([spec.model] if spec.model else []), registry)
    target = models[settings.target]
    sampling = settings.sampling()
    options = reg.DraftOptions(skip_layers=settings.skip_layers, exit_after=settings.exit_after)
    drafter = kind.build(spec, target, models.get(spec.model), options)
    decoder = se.SpeculativeDecoder(target.model, drafter, rule=settings.rule)
    input_ids = target.encode_prompt(settings.prompt, chat=settings.chat)
    se.validate_request(target.model, input_ids, settings.k, settings.max_new_tokens, sampling)
    label = reg.draft_label(settings.draft)
    if kind.key == "layer-skip" and settings.skip_layers.strip():
        label += f" skip {','.join(map(str, drafter.skip_layers))}"
    elif kind.key == "early-exit":
        label = f"early-exit:{len(target.model.model.layers) - len(drafter.skip_layers)}"
    record = state.new_run(settings, label, input_ids[0].tolist())
    opts = RenderOptions(show_spaces=show_spaces, greedy=settings.greedy, rule=settings.rule)
    return Prepared(settings, target, input_ids, decoder, record, registry.labeler(target), opts,
                    reg.eos_ids(target))


def rounds(prep: Prepared, state: SessionState) -> Iterator[se.RoundEvent]:
    """Run the engine; every event is stored in the record (rendered once) before it is yielded. Ends early,
    dropping the round in flight, once the Stop handler has recorded the run."""
    s = prep.settings
    stream = prep.decoder.stream(prep.input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(),
                                 seed=s.seed, eos_token_id=prep.eos, should_stop=state.stop_event.is_set)
    for event in stream:
        fragment = round_html(event, prep.labeler, prep.options)
        with state.lock:
            if prep.record.recorded:      # Stop already recorded the run as it stood: drop the late round
                return
            prep.record.fragments.append(fragment)
            prep.record.rounds.append(event)
            if event.stop_reason:
                prep.record.stop_reason = event.stop_reason
        yield event


def baseline(target, record: RunRecord, state: SessionState, force: bool = False):
    """Plain decoding with the run's settings, cached per baseline key (`force` measures again: timings on a
    shared machine vary); None if Stop was pressed."""
    cached = state.baselines.get(record.baseline_key)
    if cached is not None and not force:
        return cached
    import torch
    s = record.settings
    ids = torch.tensor([list(record.prompt_ids)], dtype=torch.long, device=target.device)
    result = se.autoregressive_generate(target.model, ids, max_new_tokens=s.max_new_tokens, sampling=s.sampling(),
                                        seed=s.seed, eos_token_id=reg.eos_ids(target),
                                        should_stop=state.stop_event.is_set)
    if result.stop_reason == "cancelled":
        return None
    state.baselines[record.baseline_key] = result
    return result
