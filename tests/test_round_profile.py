"""The round profile (spec_engine/round_profile.py): its parts add up to the rounds' time, it sees each kind of work
where it happens, and it leaves the engine as it found it."""
import torch

import spec_engine as se
from spec_engine.core import decoder as decoder_module
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.eagle_tree import EagleTreeDrafter
from spec_engine.drafters.lookup import LookupFirstDrafter
from spec_engine.round_profile import PARTS, RoundProfile, plain_step_seconds, profile_table, rows_table

GREEDY = se.SamplingParams(temperature=0)
PROMPT = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]])


def test_the_parts_add_up_to_the_rounds_and_the_engine_is_restored(target):
    head = random_eagle_drafter(target, seed=0)
    drafter = LookupFirstDrafter(EagleTreeDrafter(head.head, target, head.vocab_index, width=2, depth=3,
                                                  size_by_cost=False))
    decoder = se.SpeculativeDecoder(target, drafter)
    originals = (decoder_module.one_forward, decoder_module.trim_cache, type(drafter).propose)
    with RoundProfile(decoder) as profile:
        result = decoder.generate(PROMPT, k=6, max_new_tokens=24, sampling=GREEDY)
    plain = se.autoregressive_generate(target, PROMPT, max_new_tokens=24, sampling=GREEDY)
    assert result.tokens == plain.tokens
    assert profile.rounds == len(result.rounds)
    parts = profile.parts()
    assert list(parts) == list(PARTS)
    assert sum(parts.values()) == profile.seconds["round"]                     # bookkeeping is the remainder
    for part in ("draft forwards", "head catch-up", "verify forward", "sampling + rule", "cache trim",
                 "event building"):
        assert parts[part] > 0, part
    assert sum(len(v) for v in profile.verify_rows.values()) == len(result.rounds)
    assert sum(parts.values()) <= result.total_seconds
    # nothing of the profile stays behind
    assert (decoder_module.one_forward, decoder_module.trim_cache) == originals[:2]
    assert "propose" not in vars(drafter) and "step" not in vars(decoder)
    assert not drafter.fallback.head._forward_hooks and not drafter.fallback.head._forward_pre_hooks
    step = plain_step_seconds(plain)
    table = profile_table([{"arm": "a", "rounds": profile.rounds, "tokens": len(result.tokens), "plain_step": step,
                            "parts": parts}])
    assert table.count("\n") == 2 and "**" in table
    by_rows = rows_table({"a": dict(profile.verify_rows)}, {"a": step})
    assert all(f"| a | {n} | {len(v)} |" in by_rows for n, v in profile.verify_rows.items())


def test_the_benchmarks_profile_pass_on_a_tiny_model(target):
    from argparse import Namespace
    from spec_engine import bench_hf

    class Loaded:
        model, tokenizer = target, None
    args = Namespace(repeats=2, drafts=["lookup-tree", "suffix@4"], k=3, tokens=16)
    totals = {arm: {"arm": arm, "rounds": 0, "tokens": 0, "parts": dict.fromkeys(PARTS, 0.0)} for arm in args.drafts}
    plain, rows = {"seconds": 0.0, "steps": 0, "identical": True}, {arm: {} for arm in args.drafts}
    bench_hf.profile_prompt(args, Loaded(), PROMPT, None, totals, plain, rows)
    assert plain["identical"] and plain["steps"] == 2 * 15
    assert all(t["tokens"] == 2 * 16 and t["rounds"] >= 2 for t in totals.values())
    assert max(rows["suffix@4"]) <= 5 and max(rows["lookup-tree"]) <= 4          # k + 1 rows at most
    section = bench_hf.profile_section(1, totals, plain, rows)
    assert "plain decoding's tokens: yes" in section and "| suffix@4 |" in section and "| lookup-tree | 1 |" in section
