"""The verification rules through the decoder (issue #37): the one table of rules, strict and the others wired end
to end, acceptance by position, per-token provenance, and greedy identity of `exact` and `strict` on SmolLM2.
The rules' exactness and drift are proved by enumeration in test_verify_enumeration.py and sampled in
test_statistical.py; these are the deterministic checks of the plumbing around them (all on tiny models but one)."""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.core.metrics import (acceptance_by_position, expected_tokens_by_position,
                                      expected_tokens_per_round, judged_acceptance)
from spec_engine.core.drafting import wants_unwarped
from spec_engine.core.rule import LIBRARY_RULES, RULE_INFO

PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
SAMPLED = se.SamplingParams(0.7, top_p=0.8)
NEW_RULES = ("strict", "typical", "q_mismatch")


def test_the_rule_table_is_the_one_every_list_reads():
    assert se.RULES == tuple(n for n, info in RULE_INFO.items() if info.chains) and se.RULES[0] == "exact"
    assert set(se.RULES) >= {"exact", "strict", "typical", "q_mismatch", "topp_membership", "no_residual"}
    assert {n for n, info in RULE_INFO.items() if info.exact} == {"exact", "strict", "invariant"}
    assert set(se.WRONG_RULES) == {n for n in se.RULES if not RULE_INFO[n].exact}
    assert se.TREE_RULES == ("exact", "strict", "invariant", "typical", "tree_best_sibling")
    assert se.WRONG_TREE_RULES == ("tree_best_sibling",)           # judges trees only
    assert all(info.lesson.endswith(".") and info.label and info.kind in ("exact", "lossy", "mistake")
               for info in RULE_INFO.values())
    assert all(rule in se.RULES for rule, _ in LIBRARY_RULES.values())


@pytest.mark.parametrize("rule", NEW_RULES)
def test_each_new_rule_runs_through_the_decoder_and_says_where_each_token_came_from(target, draft, rule):
    result = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule=rule).generate(
        PROMPT, k=3, max_new_tokens=12, sampling=SAMPLED, seed=3)
    assert len(result.tokens) == 12
    provenance = result.provenance
    assert [entry["token"] for entry in provenance] == result.tokens
    for r in result.rounds:
        kinds = [entry["kind"] for entry in r.provenance]
        assert kinds == ["draft"] * r.accepted + (["correction"] if r.correction is not None else []) \
            + (["bonus"] if r.bonus is not None else [])
        assert r.drafter == "model"
    assert {entry["drafter"] for entry in provenance if entry["kind"] == "draft"} <= {"model"}
    assert all(entry["drafter"] is None for entry in provenance if entry["kind"] != "draft")


def test_strict_keeps_a_draft_exactly_when_the_targets_own_draw_equals_it(target, draft):
    """The event of a strict round: drafts kept while their uniform lies in their token's CDF step of p; the first
    that does not is replaced by the target's draw, which differs from the draft."""
    result = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule="strict").generate(
        PROMPT, k=3, max_new_tokens=30, sampling=se.SamplingParams(1.0), seed=1)
    corrections = [r for r in result.rounds if r.correction is not None]
    assert corrections and any(r.accepted for r in result.rounds)
    for r in corrections:
        assert r.correction != r.drafted[r.accepted]
        assert r.accept_probs == pytest.approx(r.target_probs[:r.accepted + 1])         # p(x_i): the chance shown


def test_q_mismatch_reads_the_drafts_distribution_before_warping(target, draft):
    """The decoder asks the drafter for its temperature-1 softmax only under q_mismatch; the events' q(x) is then
    that (the bug's) q, which differs from the warped q it sampled from at T = 0.7."""
    drafter = se.ModelDrafter(draft)
    assert se.SpeculativeDecoder(target, drafter).draft_params(SAMPLED) is SAMPLED
    buggy = se.SpeculativeDecoder(target, drafter, rule="q_mismatch")
    asked = buggy.draft_params(SAMPLED)
    assert wants_unwarped(asked) and asked.as_dict() == SAMPLED.as_dict()
    assert not hasattr(drafter, "report_unwarped")                      # the request is the call's, not the drafter's
    state = buggy.start(PROMPT, k=2, max_new_tokens=8, sampling=SAMPLED, seed=0)
    assert drafter.propose(state.committed, 2, SAMPLED, state.generator).unwarped is None    # not asked
    drafter.rollback(state.committed)
    proposal = drafter.propose(state.committed, 2, asked, state.generator)
    logits = draft(input_ids=torch.tensor([state.committed])).logits[0, -1]
    assert torch.allclose(proposal.unwarped[0], torch.softmax(logits, -1), atol=1e-5)
    assert not torch.allclose(proposal.unwarped[0], proposal.probs[0], atol=1e-3)
    exact = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(PROMPT, k=2, max_new_tokens=8,
                                                                           sampling=SAMPLED, seed=0)
    wrong = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule="q_mismatch").generate(
        PROMPT, k=2, max_new_tokens=8, sampling=SAMPLED, seed=0)
    assert exact.rounds[0].draft_probs != pytest.approx(wrong.rounds[0].draft_probs)


def test_tree_drafts_refuse_q_mismatch_naming_rule_and_drafter(target):
    """q_mismatch is transformers' chain bug; strict and typical judge trees (tests/test_tree_rule.py)."""
    decoder = se.SpeculativeDecoder(target, se.TreeLookupDrafter(), rule="q_mismatch")
    with pytest.raises(ValueError, match="rule 'q_mismatch' is not implemented on draft trees and tree-lookup"):
        decoder.generate(PROMPT, k=3, max_new_tokens=6, sampling=se.SamplingParams(1.0))


@pytest.mark.parametrize("rule", ["strict", "typical"])
def test_strict_and_typical_run_tree_rounds_through_the_decoder(target, draft, rule):
    """A sampled tree drafter under strict and typical: whole runs, each round's kept path and the token after it as
    the engine's provenance says, the KV invariants checked by the engine every round."""
    from spec_engine.drafters.tree import ModelTreeDrafter
    result = se.SpeculativeDecoder(target, ModelTreeDrafter(draft, width=2, drawn="without_replacement"),
                                    rule=rule).generate(
        PROMPT, k=4, max_new_tokens=12, sampling=SAMPLED, seed=5)
    assert len(result.tokens) == 12 and [e["token"] for e in result.provenance] == result.tokens
    assert any(r.tree_parents for r in result.rounds)


# ------------------------------------------------------------------------------ acceptance by position

def fake(accepted: int, drafted: int, correction: bool):
    return SimpleNamespace(accepted=accepted, drafted=[0] * drafted, correction=7 if correction else None,
                           tree_parents=None)


def test_acceptance_by_position_counts_the_rounds_that_judged_each_position():
    """Rounds of k = 3: (2 kept, refused at 3), (3 kept, bonus), (0 kept, refused at 1), (1 kept, cut by EOS).
    Position 1: judged 4, kept 3; position 2: judged 2 (the third round stopped, the fourth kept 1 then EOS), kept
    2; position 3: judged 2, kept 1."""
    rounds = [fake(2, 3, True), fake(3, 3, False), fake(0, 3, True), fake(1, 3, False)]
    alphas = acceptance_by_position(rounds)
    assert alphas == pytest.approx([3 / 4, 2 / 2, 1 / 2])
    assert acceptance_by_position([]) == [] and acceptance_by_position([fake(0, 0, False)]) == []
    kept, judged = 6, 8
    assert judged_acceptance(rounds) == pytest.approx(kept / judged)
    assert expected_tokens_by_position(alphas) == pytest.approx(1 + 0.75 + 0.75 + 0.375)
    assert expected_tokens_by_position([0.6] * 4) == pytest.approx(expected_tokens_per_round(0.6, 4))


@pytest.mark.parametrize("make,params", [
    (lambda draft: se.ModelDrafter(draft), se.SamplingParams(1.0)),
    (lambda draft: se.PromptLookupDrafter(sizing="full"), se.SamplingParams(0.0)),
    (lambda draft: se.TreeLookupDrafter(), se.SamplingParams(1.0)),
], ids=["model-sampled", "lookup-greedy", "lookup-tree"])
def test_run_stats_acceptance_by_position_equals_what_the_rounds_say(target, draft, make, params):
    """Recounted from each event's own story: a chain round's position i is kept when drafted[i] was emitted in
    place, refused when the round has a correction there; a tree round's depth d likewise along tree_path."""
    result = se.SpeculativeDecoder(target, make(draft)).generate(PROMPT, k=4, max_new_tokens=40, sampling=params,
                                                                 seed=2)
    kept, judged = {}, {}
    for r in result.rounds:
        path = r.tree_path if r.is_tree else list(range(r.accepted))
        for depth, node in enumerate(path):
            assert r.emitted[depth] == r.drafted[node]
            kept[depth] = kept.get(depth, 0) + 1
            judged[depth] = judged.get(depth, 0) + 1
        if r.correction is not None:
            judged[len(path)] = judged.get(len(path), 0) + 1
    want = [kept.get(d, 0) / judged[d] for d in range(len(judged))]
    assert result.stats.acceptance_by_position == pytest.approx(want) and len(want) >= 2
    assert sum(judged.values())
    assert result.stats.judged_acceptance == pytest.approx(sum(kept.values()) / sum(judged.values()))


def test_the_trace_export_carries_acceptance_by_position_and_provenance(target, draft):
    from spec_engine.classroom import trace
    result = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule="strict").generate(
        PROMPT, k=3, max_new_tokens=10, sampling=SAMPLED, seed=0)
    settings = {"prompt": "p", "chat": False, "target": "t", "draft": "model", "k": 3, "temperature": 0.7,
                "top_p": 0.8, "top_k": 0, "max_new_tokens": 10, "seed": 0, "rule": "strict"}
    pieces = {i: (f"<{i}>", False, False) for i in range(8)}
    made = trace.Trace(settings, {"target": "t", "draft": "d"}, PROMPT[0].tolist(), "p", "x", result.rounds, pieces)
    doc = made.to_dict()
    assert doc["stats"]["acceptance_by_position"] == result.stats.acceptance_by_position
    assert doc["provenance"] == result.provenance
    again = trace.loads(trace.dumps(made))
    assert [r.drafter for r in again.rounds] == ["model"] * len(result.rounds)
    assert again.stats.acceptance_by_position == result.stats.acceptance_by_position


# --------------------------------------------------------------------------------------- SmolLM2

@pytest.mark.slow          # ~8 s on a shared 2-core CPU: three SmolLM2 runs
def test_greedy_identity_on_smollm2(smollm2):
    """Greedy decoding under exact and under strict equals plain greedy decoding token for token (float32, 20 tokens,
    prompt lookup on a prompt that repeats itself, so drafts are kept and refused)."""
    prompt = smollm2.encode_prompt("Repeat this line twice: the cat sat on the mat and the dog sat on the log.",
                                   chat=True)
    greedy = se.SamplingParams(0.0)
    plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=20, sampling=greedy)
    for rule in ("exact", "strict"):
        result = se.SpeculativeDecoder(smollm2.model, se.PromptLookupDrafter(sizing="full"), rule=rule).generate(
            prompt, k=4, max_new_tokens=20, sampling=greedy)
        assert result.tokens == plain.tokens, rule
        assert result.stats.accepted > 0 and any(r.correction is not None for r in result.rounds), rule


def test_the_eagle_head_and_lookup_first_report_the_unwarped_q_for_q_mismatch(target):
    """An (untrained) EAGLE head over a reduced vocabulary: under q_mismatch its proposals carry the head's
    temperature-1 softmax on the reduced ids and zeros elsewhere; inside eagle+lookup the request reaches the head."""
    from spec_engine.drafters.eagle import EagleDrafter, EagleHead, head_config
    torch.manual_seed(0)
    reduced = torch.tensor([0, 1, 2, 3, 5, 7])
    for make in (lambda: EagleDrafter(EagleHead(head_config(target.config)), target, reduced),
                 lambda: se.LookupFirstDrafter(EagleDrafter(EagleHead(head_config(target.config)), target, reduced))):
        drafter = make()
        result = se.SpeculativeDecoder(target, drafter, rule="q_mismatch").generate(
            torch.tensor([[1, 2, 3, 4]]), k=2, max_new_tokens=6, sampling=SAMPLED, seed=0)
        assert len(result.tokens) == 6
        buggy = se.SpeculativeDecoder(target, make(), rule="q_mismatch")
        state = buggy.start(torch.tensor([[1, 2, 3, 4]]), k=2, max_new_tokens=6, sampling=SAMPLED)
        proposal = buggy.drafter.propose(state.committed, 2, buggy.draft_params(SAMPLED), state.generator)
        assert proposal.unwarped is not None and proposal.unwarped.shape == proposal.probs.shape
        assert proposal.unwarped[:, [4, 6]].abs().sum() == 0
        assert proposal.unwarped.sum(-1).tolist() == pytest.approx([1.0] * len(proposal.tokens), abs=1e-5)


# ------------------------------------------------------------------------------ the verdicts the display reads

P4 = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]], dtype=torch.float64)


def test_a_strict_verdict_carries_each_decided_drafts_chance_and_draw():
    """settle_strict with its draws given: the kept drafts, the target's own draw at the first refusal (or the bonus
    at the point), and for the display p(x_i) and the uniform of every decided draft, p and q of every draft."""
    from spec_engine.core.verify import settle
    refused = settle("strict", [0, 1, 2], None, P4, [0.5, 0.6, 0.6], [1.0] * 3, [0.2, 0.9, 0.1], 0.95, None)
    assert (refused.accepted, refused.next_token) == (1, 2)            # row 1's CDF at 0.9 is token 2, not 1
    assert refused.accept_probs == [0.5, 0.6] and refused.uniforms == [0.2, 0.9]
    assert refused.drafted_p == [0.5, 0.6, 0.6] and refused.drafted_q == [1.0] * 3
    kept = settle("strict", [0, 1, 2], None, P4, [0.5, 0.6, 0.6], [1.0] * 3, [0.2, 0.3, 0.5], 0.95, None)
    assert (kept.accepted, kept.next_token) == (3, 2) and kept.is_bonus          # the bonus: row 3's CDF at 0.95
    assert kept.accept_probs == [0.5, 0.6, 0.6] and kept.uniforms == [0.2, 0.3, 0.5]
    assert kept.drafted_p == [0.5, 0.6, 0.6] and kept.drafted_q == [1.0] * 3


def test_typical_refuses_a_draft_exactly_at_its_threshold():
    """Medusa keeps a draft when p(x) is above the threshold, strictly: p = (0.91, 0.09) has threshold
    min(0.09, 0.3 exp(-H)) = 0.09, so token 1 is refused, in the reference and in the engine's rule."""
    from spec_engine.core.rule import speculative_step, typical_threshold
    from spec_engine.core.verify import settle
    p = torch.tensor([[0.91, 0.09], [0.5, 0.5]], dtype=torch.float64)
    assert typical_threshold(p[0]) == 0.09
    assert speculative_step(p, torch.tensor([[0.0, 1.0]], dtype=torch.float64), [1], [0.0], 0.1, "typical") == (0, 0)
    verdict = settle("typical", [1], None, p, [0.09], [1.0], [0.0], 0.1, None)
    assert verdict.accepted == 0 and verdict.accept_probs == [0.0]
    above = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    assert speculative_step(above, torch.tensor([[0.0, 1.0]], dtype=torch.float64), [1], [0.0], 0.1, "typical")[0] == 1


def test_q_mismatch_without_the_unwarped_distribution_says_which_drafters_report_it():
    from spec_engine.core.verify import judged_draft_probs
    with pytest.raises(ValueError, match=r"rule 'q_mismatch' reads the draft's distribution before warping, and this "
                                         r"drafter does not report it \(Proposal.unwarped\): use a model draft, layer "
                                         r"skip or the EAGLE head"):
        judged_draft_probs("q_mismatch", torch.full((1, 3), 1 / 3), None)
    unwarped = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    assert judged_draft_probs("q_mismatch", torch.full((1, 3), 1 / 3), unwarped).dtype == torch.float32


def test_a_greedy_tree_verdict_and_its_display_rows():
    """Greedy on a tree: the kept path and the argmax after it, no draws, and the display's rows are the
    temperature-1 softmax of each row (the token's own chance shown as certain); a rule that judges no trees, a
    sampled tree without its q and mismatched shapes are refused."""
    from spec_engine.core.verify import verify_tree
    from spec_engine.core.tree_rule import TokenTree
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.5], [0.1, 0.2, 0.3]])
    tree = TokenTree.of([1, 2], [-1, -1])
    verdict, display = verify_tree("exact", se.SamplingParams(0.0), tree, None, logits, torch.Generator())
    assert (verdict.accepted, verdict.next_token) == ([0], 0)
    assert (verdict.tried, verdict.accept_probs, verdict.uniforms) == ([], [], [])
    assert verdict.next_probs_top == [(0, 1.0)]
    assert torch.allclose(display, torch.softmax(logits, dim=-1)) and display.shape == (3, 3)
    with pytest.raises(ValueError, match=r"a tree round's rule must be one of \('exact', 'strict', 'invariant', "
                                         r"'typical', 'tree_best_sibling'\), got 'no_residual'"):
        verify_tree("no_residual", se.SamplingParams(1.0), tree, None, logits, torch.Generator())
    sampled = TokenTree([1, 2], [-1, -1], ["with_replacement"] * 3)
    with pytest.raises(ValueError, match="a sampled tree needs draft_probs for its nodes whose children were drawn"):
        verify_tree("exact", se.SamplingParams(1.0), sampled, None, logits, torch.Generator())
    with pytest.raises(AssertionError):
        verify_tree("exact", se.SamplingParams(1.0), sampled, torch.full((2, 3), 1 / 3), logits, torch.Generator())
