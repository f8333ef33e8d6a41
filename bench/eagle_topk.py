"""How often the EAGLE head's first draft step holds the target's next token among its top j choices (j = 1..4), on
the held-out prompts of each kind, greedy: the ceiling a chain of drafts meets (top-1) and what a draft tree that
also verified the head's second, third ... choice at step 1 could reach (EAGLE-2). Timing-free: counts only.

Each round of a real `eagle` run (the shipped head, its recommended stops, k = 3) records the head's step-1 top
choices before it drafts; the token the target then commits at that position is the truth. Also reported: the mean
tokens per target forward of those runs; what a step-1 sibling would add per round (each round whose top-1 missed
but top-2 hit would commit the sibling and the target's next token instead of one correction); and the tokens per
forward of a two-branch tree, counted on the same rounds: the round's own chain beside a second chain that starts
from the head's second choice and is rolled k steps by the head (no early stop), the longer matching prefix wins.
Greedy output is the target's whatever the drafts, so each round's truth is known; the tree's rounds are counted at
the chain's round boundaries, an approximation of a run that drafted the tree.

    python -m bench.eagle_topk --kinds chat code --held-out 8 --tokens 96 --out bench/results/eagle-topk
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from spec_engine.bench import held_out_prompts
from spec_engine.core.cache import cache_len, trim_cache
from spec_engine.core.decoder import SpeculativeDecoder
from spec_engine.drafters.eagle import DEFAULT_WEIGHTS, EagleDrafter, head_dtype, load_head, recommended_settings
from spec_engine.models import DEFAULT_MODEL, load_model
from spec_engine.core.sampling import SamplingParams


TOP = 4


class RecordingEagleDrafter(EagleDrafter):
    """An EagleDrafter that notes, for each round: (committed length, its step-1 top-TOP target ids) in `step_one`,
    and (committed length, the round's chain, the greedy chain grown from the step-1 second choice) in `branches`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_one: list[tuple[int, list[int]]] = []
        self.branches: list[tuple[int, list[int], list[int]]] = []

    @torch.inference_mode()
    def second_chain(self, committed: list[int], first: int, k: int) -> list[int]:
        """k greedy drafts from draft 1 = `first` (a reduced-vocabulary index), as `propose` rolls the head; the head's
        cache is put back as it was."""
        keep, ids = cache_len(self.cache), list(self.cache_ids)
        feature, tokens = self._predicted, [self._vocab_ids[first]]
        for i in range(k - 1):
            feature = self._step(feature[None], tokens[-1:], len(committed) - 1 + i)[-1]              # [H]
            tokens.append(self._vocab_ids[int(self.lm_head(feature).argmax())])
        trim_cache(self.cache, keep)
        self.cache_ids = ids
        return tokens

    def propose(self, committed, k, params, generator):
        if self._predicted is None or k == 0:
            return super().propose(committed, k, params, generator)
        logits = self.lm_head(self._predicted)                                            # [N]
        top = torch.topk(logits.float(), TOP).indices.tolist()
        self.step_one.append((len(committed), [self._vocab_ids[i] for i in top]))
        second = self.second_chain(committed, top[1], k)
        proposal = super().propose(committed, k, params, generator)
        self.branches.append((len(committed), list(proposal.tokens), second))
        return proposal


def step_one_hits(step_one: list[tuple[int, list[int]]], sequence: list[int]) -> list[list[bool]]:
    """For each recorded round whose position the run reached: [truth in top-1, in top-2, ...]."""
    return [[sequence[at] in top[:j + 1] for j in range(len(top))]
            for at, top in step_one if at < len(sequence)]


def matched(drafts: list[int], sequence: list[int], at: int) -> int:
    """How many leading drafts equal sequence[at:]."""
    n = 0
    while n < len(drafts) and at + n < len(sequence) and drafts[n] == sequence[at + n]:
        n += 1
    return n


def round_matches(branches: list[tuple[int, list[int], list[int]]], sequence: list[int]) -> list[tuple[int, int]]:
    """(chain, two-branch tree) matching drafts of each round whose position the run reached: a greedy round commits
    its matching drafts and one target token, so 1 + these are its tokens per target forward."""
    return [(matched(chain, sequence, at), max(matched(chain, sequence, at), matched(second, sequence, at)))
            for at, chain, second in branches if at < len(sequence)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eagle_topk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=["chat", "code"])
    parser.add_argument("--held-out", type=int, default=8, help="prompts of each kind")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, device="cpu", dtype="float32")
    head, vocab_index = load_head(DEFAULT_WEIGHTS, dtype=head_dtype(target.model))
    settings = recommended_settings()
    prompts = held_out_prompts(args.held_out, args.kinds)
    rows = []
    for kind in args.kinds:
        hits, emitted, rounds, matches = [], 0, 0, []
        for seed, text in enumerate(t for n, t in prompts.items() if n.startswith(f"held-out-{kind}-")):
            drafter = RecordingEagleDrafter(head, target.model, vocab_index,
                                            min_confidence=settings.get("min_confidence", 0.0),
                                            min_path_confidence=settings.get("min_path_confidence", 0.0))
            prompt = target.encode_prompt(text)                                           # [1, T]
            result = SpeculativeDecoder(target.model, drafter).generate(
                prompt, k=args.k, max_new_tokens=args.tokens, sampling=SamplingParams(0.0), seed=seed,
                eos_token_id=target.tokenizer.eos_token_id)
            sequence = prompt[0].tolist() + result.tokens
            hits += step_one_hits(drafter.step_one, sequence)
            matches += round_matches(drafter.branches, sequence)
            emitted, rounds = emitted + result.stats.new_tokens, rounds + result.stats.rounds
        top = [sum(h[j] for h in hits) / len(hits) for j in range(TOP)]
        per_forward = emitted / rounds
        rows.append({"kind": kind, "prompts": args.held_out, "rounds": len(hits), "top": top,
                     "tokens_per_forward": per_forward, "sibling_gain": top[1] - top[0],
                     "chain_counted": sum(1 + c for c, _ in matches) / len(matches),
                     "tree_counted": sum(1 + t for _, t in matches) / len(matches)})
    lines = [f"| held-out kind | rounds | step-1 top-1 | top-2 | top-3 | top-4 | tokens / forward (k = {args.k}) "
             "| + a step-1 leaf sibling | chain, counted | two-branch tree, counted |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} ({r['prompts']}) | {r['rounds']} | " + " | ".join(f"{v:.3f}" for v in r["top"]) +
                     f" | {r['tokens_per_forward']:.2f} | +{r['sibling_gain']:.2f} "
                     f"(+{100 * r['sibling_gain'] / r['tokens_per_forward']:.0f}%) | {r['chain_counted']:.2f} | "
                     f"{r['tree_counted']:.2f} (+{100 * (r['tree_counted'] / r['chain_counted'] - 1):.0f}%) |")
    command = "python -m bench.eagle_topk " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(lines) + (f"\n\nGreedy, fp32 target, the shipped head ({DEFAULT_WEIGHTS.name}), "
                               f"{args.tokens} new tokens per prompt. `{command}`\n")
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"rows": rows, "command": command}, indent=1) + "\n")


if __name__ == "__main__":
    main()
