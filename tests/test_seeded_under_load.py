"""A seed fixes a sampled run's text, whatever ran before it or beside it. A sampled run's text depends on its
draft lengths (the exact rule draws per drafted token), and a cost-sized drafter's lengths follow the verify-cost
curve, which the engine corrects from the timings of every run (spec_engine/drafters/sizing.py): under load, 2 of 8
seeded requests sent at once gave other texts than the same requests alone. The app sizes a sampled run by the curve
measured at start-up (compute.build, se.startup_sizing). The load is simulated: the curve is corrected by timings
that make longer drafts pay, as a busy host's timings move it, and the test checks that this changes an unpinned
run's text (else it could not fail)."""
import threading

import pytest

import spec_engine as se
from spec_engine.drafters import sizing
from ui.playground import handlers
from ui.playground.state import SessionState

from test_ui_handlers import SUMMARY, TARGET, run_args

SEEDS = tuple(range(1, 9))
SAMPLED = dict(draft="eagle", k=4, temperature=1.0, top_p=1.0, max_new_tokens=24, prompt="Tell me about the sea.")


def app_tokens(seed: int) -> list[int]:
    outputs = list(handlers.run(*run_args(seed=seed, **SAMPLED), SessionState()))
    return outputs[-1][SUMMARY]["tokens"]


def engine_tokens(smollm2, seed: int) -> list[int]:
    """The engine alone, its drafter sized by the curve as it stands (no pin)."""
    ids = smollm2.encode_prompt(SAMPLED["prompt"], chat=True)
    decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter("eagle", smollm2))
    return decoder.generate(ids, k=SAMPLED["k"], max_new_tokens=SAMPLED["max_new_tokens"], seed=seed,
                            sampling=se.SamplingParams(temperature=1.0),
                            eos_token_id=smollm2.model.generation_config.eos_token_id).tokens


@pytest.mark.slow           # 32 runs of 24 tokens on SmolLM2 (about a minute on two busy cores)
def test_eight_seeded_sampled_requests_at_once_give_their_texts_alone(playground_registry, smollm2, monkeypatch,
                                                                      curved_verify_costs):
    if not se.draft_modes()["eagle"].available(TARGET)[0]:
        pytest.skip("the EAGLE head for the offline default is not here")
    curve = sizing.verify_costs(smollm2.model)          # a CPU-like CostCurve (conftest), kept for this model
    monkeypatch.setattr(sizing, "kept_curve", lambda model: curved_verify_costs.get(id(model)))
    alone = {seed: app_tokens(seed) for seed in SEEDS}
    unpinned = {seed: engine_tokens(smollm2, seed) for seed in SEEDS}
    # a busy host's timings: one-row forwards slow, many rows nearly as cheap, so longer drafts pay
    for _ in range(sizing.WINDOW):
        curve.observe(1, 0.05)
        for rows in range(2, len(curve)):
            curve.observe(rows, 0.05 * (1 + 0.01 * rows))
    assert tuple(curve) != curve.measured
    moved = {seed: engine_tokens(smollm2, seed) for seed in SEEDS}
    assert moved != unpinned, "the corrected curve changed no text: this test could not fail"
    at_once: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda s=seed: at_once.__setitem__(s, app_tokens(s))) for seed in SEEDS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert at_once == alone
