"""A run's drafts and its "measure again" are sized by one verify-cost curve (ui/playground/compute.build,
runner.begin, handlers.measure_baseline): the curve the first pass sized by is kept on the run's record and handed to
the decoder built to measure it again, though the session's forwards have corrected the model's curve since. Tiny
target in place of the registry's model; no real model is loaded."""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.drafters.sizing import Sizing
from ui.playground import compute, handlers, runner
from ui.playground.state import RunRecord, RunSettings, SessionState
from tiny import TARGET_PIECES, ToyTokenizer, tiny_llama

SETTINGS = RunSettings(target="smollm2-135m-instruct", draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0,
                       top_k=0, max_new_tokens=8, seed=0, rule="exact", chat=False, prompt="ab")
EARLIER = Sizing((0.0,) + tuple(1.0 + 0.5 * r for r in range(17)), "corrected from 40 timed forwards")


@pytest.fixture
def tiny_target(monkeypatch):
    model = tiny_llama(vocab=len(TARGET_PIECES), layers=2, seed=0)
    loaded = SimpleNamespace(model=model, tokenizer=ToyTokenizer(TARGET_PIECES), device=model.device,
                             dtype=torch.float32)
    monkeypatch.setattr(compute, "loaded", lambda name: loaded)
    return loaded


def test_a_build_sizes_by_the_curve_it_is_given(tiny_target, curved_verify_costs):
    decoder, _, _, built = compute.build(SETTINGS, [1, 2, 1, 2], sizing=EARLIER)
    assert built.sizing == EARLIER and se.drafter_sizing(decoder.drafter) == EARLIER
    assert tuple(decoder.drafter.costs) == EARLIER.costs


def test_a_build_without_a_curve_sizes_by_the_models_as_it_stands(tiny_target, curved_verify_costs):
    _, _, _, built = compute.build(SETTINGS, [1, 2, 1, 2])
    curve = curved_verify_costs[id(tiny_target.model)]
    assert built.sizing == Sizing(tuple(curve), curve.source()) != EARLIER


def test_a_record_keeps_its_first_passs_curve():
    state = SessionState()
    prep = runner.Prepared(SETTINGS, (1, 2), None, None)
    record = runner.begin(prep, state, "prompt lookup", "float32", EARLIER)
    assert record.sizing == EARLIER
    assert runner.begin(prep, state, "prompt lookup", "float32", Sizing((0.0, 1.0), "later")).sizing == EARLIER


def test_measuring_again_hands_the_records_curve_to_the_new_build(monkeypatch):
    record = RunRecord(1, SETTINGS, "prompt lookup", (1, 2), rounds=[object()], sizing=EARLIER)
    state = SessionState()
    state.active = SimpleNamespace(record=record, options=SimpleNamespace(show_spaces=False))
    jobs = []

    def prepare(settings, state, registry, show_spaces=False, hold=False, record=None):
        return SimpleNamespace(prompt_ids=(1, 2), work=None, held=[], record=record)
        yield                                                  # a generator, as runner.prepare is

    def fold(prep, state, job, budget, source=None):
        jobs.append(job)
        return iter(())

    monkeypatch.setattr(handlers.runner, "prepare", prepare)
    monkeypatch.setattr(handlers.runner, "release", lambda prep, registry: None)
    monkeypatch.setattr(handlers, "fold", fold)
    list(handlers.measure_baseline(state))
    (job,) = jobs
    assert job.sizing == EARLIER and (job.live, job.timed, job.plain) == (False, True, True)
