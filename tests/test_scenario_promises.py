"""Every classroom scenario (presets/scenarios.yaml) run as the app runs it, and its caption's promise checked on
what it produced (issue #38: scenario 4 promised copying, and the model wrote new code at 14% acceptance).

Each scenario runs through `handlers.run` (the Run button's handler) with its own settings, at most CAP new tokens,
without the speed measurement: the promises checked are about tokens, acceptance and the text, never about time (speed
claims depend on the machine; the captions' speeds are measured in docs/benchmarks.md). Nor how long the drafts are:
prompt lookup and the EAGLE head cut their drafts to what the verify cost measured at warm-up pays for, and on a busy
machine that is one token a round (measured here: the quote scenario drafted 4 tokens a round on a quieter machine, 1
under a load of 8 on 2 cores, at 68% and 77% acceptance), so copying is checked by acceptance. Greedy scenarios are
deterministic; the sampled ones (5-7) use their own seeds, so their checks are fixed outcomes, not statistics.
"""
import pytest

import spec_engine as se
from spec_engine.drafters.lookup import LOOKUP_NOTE
from ui.playground import handlers
from ui.playground import registry as reg
from ui.playground.handlers import RUN_OUTPUTS
from ui.playground.presets import load_presets
from ui.playground.state import SessionState

pytestmark = pytest.mark.slow

CAP = 40          # new tokens per scenario: enough rounds for each promise, a few seconds each


def run(scenario):
    """(final summary, its rounds, the prompt ids) of one scenario, run as the app runs it."""
    state = SessionState()
    args = dict(prompt=scenario.prompt, target=scenario.target or se.models.default_model_name(),
                draft=scenario.draft, k=scenario.k, temperature=scenario.temperature, top_p=scenario.top_p,
                top_k=scenario.top_k, max_new_tokens=min(scenario.max_new_tokens, CAP), seed=scenario.seed,
                rule=scenario.rule, chat=scenario.chat, skip_layers="", exit_after=0, auto_baseline=False,
                show_spaces=False)
    outputs = list(handlers.run(*[args[name] for name in handlers.RUN_INPUTS], state))
    final = outputs[-1][RUN_OUTPUTS.index("summary")]
    assert isinstance(final, dict) and final.get("final"), scenario.id
    record = state.active.record
    return final, record.rounds, record.prompt_ids


def plain_greedy(smollm2, prompt_ids, n):
    import torch
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    return se.autoregressive_generate(smollm2.model, ids, max_new_tokens=n, sampling=se.SamplingParams(temperature=0),
                                      eos_token_id=reg.eos_ids(smollm2)).tokens


@pytest.fixture(scope="module")
def results(playground_registry, gemma):
    playground_registry.put(gemma)
    return {s.id: (s, *run(s)) for s in load_presets().scenarios}


def acceptance(results, scenario_id):
    return results[scenario_id][1]["acceptance_rate"]


def tokens_per_forward(results, scenario_id):
    return results[scenario_id][1]["tokens_per_forward"]


def test_every_scenario_has_its_promise_checked(results):
    assert set(results) == set(PROMISES), "a scenario was added or renamed: check its caption's promise here"


def same_text_as_plain(results, smollm2, scenario_id):
    _, final, _, prompt_ids = results[scenario_id]
    return final["tokens"] == plain_greedy(smollm2, prompt_ids, len(final["tokens"]))


def greedy_layer_skip(results, smollm2):        # 1: green runs; "same text as plain: yes"
    assert max(r.accepted for r in results["greedy-layer-skip"][2]) >= 2
    assert same_text_as_plain(results, smollm2, "greedy-layer-skip")


def early_exit_lesson(results, smollm2):        # 2: nearly every draft struck through, acceptance near 0
    assert acceptance(results, "early-exit-lesson") < 0.15


def prompt_lookup_edit(results, smollm2):       # 3: long green runs, many tokens per forward (copies the prompt)
    assert acceptance(results, "prompt-lookup-edit") >= 0.5


def quote_lookup(results, smollm2):             # 4: long green runs as the answer quotes the text
    assert acceptance(results, "quote-lookup") >= 0.5


def sampling_exact(results, smollm2):           # 5: p, q, the draw u and the decision on every judged draft
    rounds = results["sampling-exact"][2]
    assert all(len(r.uniforms) == len(r.accept_probs) > 0 for r in rounds if r.drafted)
    assert any(r.correction is not None for r in rounds) and any(r.accepted for r in rounds)


def wrong_topp(results, smollm2):               # 6: acceptance goes up against scenario 5
    assert acceptance(results, "wrong-topp") > acceptance(results, "sampling-exact")


def wrong_no_residual(results, smollm2):        # 7: acceptance looks alike scenario 5's (the bug is not in the speed)
    assert abs(acceptance(results, "wrong-no-residual") - acceptance(results, "sampling-exact")) < 0.2


def large_k(results, smollm2):                  # 8: discarded drafts after rejections; per draft, worse than k = 4
    rounds = results["large-k"][2]
    assert sum(len(r.discarded) for r in rounds) > sum(r.accepted for r in rounds) / 2
    assert acceptance(results, "large-k") < acceptance(results, "greedy-layer-skip")


def naive_ids(results, smollm2):                # 9: almost every draft struck through; the output is still exact
    assert acceptance(results, "naive-ids") < 0.1
    assert same_text_as_plain(results, smollm2, "naive-ids")


def cross_tokenizer(results, smollm2):          # 10: re-tokenizing restores acceptance against scenario 9
    assert acceptance(results, "cross-tokenizer") > acceptance(results, "naive-ids") + 0.1


def eagle_head(results, smollm2):               # 11: a trained head accepts far more than early exit's
    assert acceptance(results, "eagle-head") > acceptance(results, "early-exit-lesson") + 0.2


def eagle_plus_lookup(results, smollm2):        # 12: rounds copied from the prompt (※) accept several tokens at once
    rounds = results["eagle-plus-lookup"][2]
    copied = [r for r in rounds if r.note == LOOKUP_NOTE]
    assert copied and sum(r.accepted for r in copied) / sum(len(r.drafted) for r in copied) >= 0.7


def draft_tree(results, smollm2):               # 13: more tokens per forward than scenario 1's chain; same text
    assert tokens_per_forward(results, "draft-tree") > tokens_per_forward(results, "greedy-layer-skip")
    assert any(r.is_tree for r in results["draft-tree"][2])
    assert same_text_as_plain(results, smollm2, "draft-tree")


def rules_strict(results, smollm2):
    """Scenario 5 with the strict rule: some drafts kept and some refused (the by-position plot has both). That
    strict keeps fewer than exact is the lab's promise (one 40-token run can land either side: it did here, at
    seed 1); test_verify_enumeration.py proves it exactly and the lab tests show it over hundreds of draws."""
    assert 0 < acceptance(results, "rules-strict") < 1


def rules_typical(results, smollm2):
    """Scenario 5 with Medusa's typical acceptance: more drafts kept than the exact rule at the same settings."""
    assert acceptance(results, "rules-typical") >= acceptance(results, "sampling-exact")


PROMISES = {"greedy-layer-skip": greedy_layer_skip, "early-exit-lesson": early_exit_lesson,
            "prompt-lookup-edit": prompt_lookup_edit, "quote-lookup": quote_lookup, "sampling-exact": sampling_exact,
            "wrong-topp": wrong_topp, "wrong-no-residual": wrong_no_residual, "large-k": large_k,
            "naive-ids": naive_ids, "cross-tokenizer": cross_tokenizer, "eagle-head": eagle_head,
            "eagle-plus-lookup": eagle_plus_lookup, "draft-tree": draft_tree, "rules-strict": rules_strict,
            "rules-typical": rules_typical}


@pytest.mark.parametrize("scenario_id", list(PROMISES))
def test_the_scenario_keeps_its_captions_promise(results, smollm2, scenario_id):
    PROMISES[scenario_id](results, smollm2)
