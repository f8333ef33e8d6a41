"""Explanations: the sentences must say the numbers an independent count of the events gives."""
import re

import torch

import spec_engine as se
from spec_engine.classroom.explain import explain, facts


def event(index, drafted, accepted, correction=None, bonus=None, k=4, uniforms=True, note=None, stop=None):
    n = len(drafted)
    decided = min(accepted + 1, n)
    emitted = list(drafted[:accepted]) + [t for t in (correction, bonus) if t is not None]
    return se.RoundEvent(
        index=index, drafted=list(drafted), accepted=accepted, emitted=emitted, correction=correction, bonus=bonus,
        target_probs=[0.5] * n, draft_probs=[0.4] * n, accept_probs=[1.0] * accepted + [0.2] * (decided - accepted),
        uniforms=([0.1] * accepted + [0.9] * (decided - accepted)) if uniforms else [],
        next_top=[(9, 0.7)], target_top=[[(1, 0.5)]] * (n + 1), k=k, target_cache_len_before=10,
        target_cache_len=9, draft_cache_len_before=None, draft_cache_len=None, committed_len=20, draft_seconds=0.0,
        verify_seconds=0.0, round_seconds=0.01, finished=stop is not None, stop_reason=stop, note=note)


# 8 rounds with k = 4: 3 fully accepted (bonus), first rejections at positions 2, 2, 1, 3, 2; the last round
# is cut short by max_new_tokens (2 drafts, both accepted, bonus).
SCRIPT = [
    event(0, [1, 2, 3, 4], 4, bonus=5),
    event(1, [1, 2, 3, 4], 1, correction=6),
    event(2, [1, 2, 3, 4], 1, correction=6),
    event(3, [1, 2, 3, 4], 0, correction=7),
    event(4, [1, 2, 3, 4], 4, bonus=5),
    event(5, [1, 2, 3, 4], 2, correction=6, note="boundary fix"),
    event(6, [1, 2, 3, 4], 1, correction=8),
    event(7, [1, 2], 2, bonus=5, stop="max_new_tokens"),
]


def numbers(sentence):
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", sentence)]


def test_sentences_state_the_counts_of_the_events():
    sentences = explain(SCRIPT, k=4)
    new_tokens = sum(len(r.emitted) for r in SCRIPT)
    drafted = sum(len(r.drafted) for r in SCRIPT)
    accepted = sum(r.accepted for r in SCRIPT)
    full = sum(1 for r in SCRIPT if r.accepted == len(r.drafted))
    rejected_at = [r.accepted + 1 for r in SCRIPT if r.accepted < len(r.drafted)]
    discarded = sum(len(r.drafted) - r.accepted - 1 for r in SCRIPT if r.accepted < len(r.drafted))

    first = sentences[0]
    assert first.startswith(f"8 rounds (one target forward each) produced {new_tokens} new tokens")
    assert f"{new_tokens / 8:.2f} tokens per target forward" in first and "k + 1 = 5" in first
    assert f"In {full} of the 8 rounds that drafted, every draft token was accepted." in sentences
    acceptance = next(s for s in sentences if s.startswith("Overall"))
    assert numbers(acceptance)[:3] == [accepted, drafted, round(100 * accepted / drafted)]
    assert f"{discarded} later draft tokens were discarded" in acceptance
    a = accepted / (accepted + len(rejected_at))
    theory = (1 - a ** 5) / (1 - a)
    assert (f"Of the judged drafts (the accepted ones plus each round's rejected one) {a:.0%} were accepted; with "
            f"that per-token rate a, the theory (1 − a^(k+1))/(1 − a) expects {theory:.2f} tokens per target "
            f"forward.") in sentences
    most = max(set(rejected_at), key=lambda p: (rejected_at.count(p), -p))
    assert (f"The first rejection was most often at draft position {most} ({rejected_at.count(most)} of "
            f"{len(rejected_at)} rounds with a rejection).") in sentences
    assert any(s.startswith(f"{len(rejected_at)} rounds ended with a correction drawn from the residual")
               and s.endswith(f"and {full} with a bonus token.") for s in sentences)
    assert "1 round carried a drafter note: “boundary fix”." in sentences
    assert sentences[-1] == "The run ended because it reached the maximum number of new tokens."


def test_ties_go_to_the_earlier_position_and_greedy_is_inferred():
    rounds = [event(0, [1, 2, 3], 0, correction=4, uniforms=False),
              event(1, [1, 2, 3], 2, correction=4, uniforms=False)]
    f = facts(rounds)
    assert f.greedy is True and f.common_rejection == (1, 1) and f.rejection_positions == {1: 1, 3: 1}
    text = " ".join(explain(rounds))
    assert "most often at draft position 1 (1 of 2 rounds with a rejection)" in text
    assert "the target's argmax" in text and "residual" not in text
    assert "has not finished yet" in text


def test_no_rejection_no_draft_and_empty():
    assert explain([]) == []
    all_in = [event(0, [1, 2], 2, bonus=3, k=2, stop="eos")]
    text = explain(all_in)
    assert "No draft token was rejected." in text and "In 1 of the 1 round that drafted" in " ".join(text)
    assert text[-1] == "The run ended because the model emitted its end-of-sequence token."
    nothing = [event(0, [], 0, bonus=3, uniforms=False)]
    assert "No round drafted anything, so every token came from the target alone." in explain(nothing, k=4)


def test_wrong_rule_says_the_residual_is_skipped():
    text = " ".join(explain(SCRIPT[:3], rule="topp_membership"))
    assert "drawn from p itself" in text and "skips the residual" in text


def test_explanation_of_a_real_run_matches_run_stats(target, draft):
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    result = decoder.generate(torch.tensor([[1, 2, 3]]), k=3, max_new_tokens=30,
                              sampling=se.SamplingParams(temperature=1.0), seed=3)
    stats = result.stats
    sentences = explain(result.rounds, 3)
    assert sentences[0].startswith(f"{stats.rounds} rounds (one target forward each) produced {stats.new_tokens} ")
    assert f"{stats.tokens_per_round:.2f} tokens per target forward" in sentences[0]
    overall = next(s for s in sentences if s.startswith("Overall"))
    assert overall.startswith(f"Overall {stats.accepted} of {stats.drafted} draft tokens were accepted "
                              f"({stats.acceptance_rate:.0%} acceptance)")
    full = sum(1 for r in result.rounds if r.drafted and r.accepted == len(r.drafted))
    assert any(f"In {full} of the " in s for s in sentences)
