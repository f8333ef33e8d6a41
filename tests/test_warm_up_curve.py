"""Only steady-state forwards correct the verify-cost curve (spec_engine/drafters/sizing.py, `not_observed`).

The curve sizes every cost-sized draft, and the engine corrects it from timed forwards. A warm-up's forwards are
first uses (lazy packing, compiled kernels, cold caches), and a live pass runs beside the browser drawing it, so their
multi-row forwards read dearer than the one-row steps plain decoding times quietly: measured at start-up, the app's
warm-up run moved 5-8 rows from 1.00 to 1.34 one-row forwards, and the default prompt's first runs drafted trees of 4
nodes instead of 7 (35 rounds against 31, x1.19 against x1.44-1.50). Tiny models; the measurement is replaced by a
fixed curve (no clock decides anything here), and the forward watcher is the engine's own."""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.drafters import sizing
from ui.playground import compute, registry
from ui.playground.state import RunSettings
from conftest import CURVED_VERIFY
from tiny import TARGET_PIECES, tiny_llama

pytestmark = pytest.mark.measured_costs          # the real verify_costs: it installs the forward watcher

PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
SETTINGS = RunSettings(target="tiny", draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, top_k=0,
                       max_new_tokens=12, seed=0, rule="exact", chat=False, prompt="abc")


@pytest.fixture
def curve(monkeypatch):
    """A tiny target whose curve `verify_costs` keeps as the app's is kept, measured as CURVED_VERIFY."""
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda model: CURVED_VERIFY)
    model = tiny_llama(vocab=len(TARGET_PIECES), layers=2, seed=0)
    kept = sizing.verify_costs(model)
    assert sizing.kept_curve(model) is kept and kept.observed == 0
    return model, kept


def decode(model):
    ids = torch.tensor([PROMPT])
    se.autoregressive_generate(model, ids, max_new_tokens=6, sampling=se.SamplingParams(0.0))
    se.SpeculativeDecoder(model, se.PromptLookupDrafter()).generate(ids, k=4, max_new_tokens=8)


def test_forwards_inside_not_observed_correct_nothing_and_those_after_do(curve):
    model, kept = curve
    with se.not_observed(model):
        with se.not_observed(model):           # nested: the outer one still holds after the inner ends
            decode(model)
        decode(model)
    assert kept.observed == 0 and tuple(kept) == kept.measured
    decode(model)
    assert kept.observed > 0                   # else the two checks above could not fail


def test_a_failing_run_inside_not_observed_leaves_the_curve_observing(curve):
    model, kept = curve
    with pytest.raises(RuntimeError), se.not_observed(model):
        raise RuntimeError("a run failed")
    decode(model)
    assert kept.observed > 0


def test_a_curve_measured_inside_not_observed_is_not_corrected_there(monkeypatch):
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda model: CURVED_VERIFY)
    model = tiny_llama(vocab=len(TARGET_PIECES), layers=2, seed=0)
    with se.not_observed(model):
        decode(model)                          # its drafter measures the curve on first use
    kept = sizing.kept_curve(model)
    assert kept is not None and kept.observed == 0


def test_the_apps_warm_up_run_leaves_the_start_up_curve_as_measured(curve, monkeypatch):
    model, kept = curve
    monkeypatch.setenv("SPEC_BATCHING", "0")           # the batch costs are timed elsewhere (test_class_batch.py)
    loaded = SimpleNamespace(name="tiny", model=model, device=model.device,
                             encode_prompt=lambda text, chat=False: torch.tensor([PROMPT]))
    registry.warm_up_default_run(loaded)
    assert kept.observed == 0 and tuple(kept) == kept.measured


def test_a_run_is_corrected_for_by_its_timed_pass_and_plain_decoding_not_its_live_pass(curve, monkeypatch):
    model, kept = curve
    loaded = SimpleNamespace(model=model, tokenizer=SimpleNamespace(eos_token_id=None), device=model.device,
                             dtype=torch.float32)
    monkeypatch.setattr(compute, "loaded", lambda name: loaded)
    job = compute.RunJob(SETTINGS, tuple(PROMPT), 60.0, live=True, timed=True, plain=True)
    seen = {}
    for item in compute.run_job(job, compute.Stop()):
        if isinstance(item, compute.Phase):
            seen[item.name] = kept.observed
        elif isinstance(item, se.RoundEvent):
            seen.setdefault("rounds", 0)
            seen["rounds"] += 1
    seen["end"] = kept.observed
    assert seen["rounds"] > 1 and seen["timed"] == 0, seen        # the live pass corrected nothing
    assert seen["end"] > seen["plain"] > 0, seen                  # the timed pass did, and plain decoding
