"""How often the EAGLE head's first draft step holds the target's next token among its top j choices (j = 1..4), on
the held-out prompts of each kind, greedy: the ceiling a chain of drafts meets (top-1) and what a draft tree that
also verified the head's second, third ... choice at step 1 could reach (EAGLE-2). Timing-free: counts only.

Each round of a real `eagle` run (the shipped head, its recommended stops, k = 3) records the head's step-1 top
choices before it drafts; the token the target then commits at that position is the truth. Also reported: the mean
tokens per target forward of those runs and, from them, what a step-1 sibling would add per round (each round
whose top-1 missed but top-2 hit would commit the sibling and the target's next token instead of one correction).

    python -m bench.eagle_topk --kinds chat code --held-out 8 --tokens 96 --out bench/results/eagle-topk
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from spec_engine.bench import held_out_prompts
from spec_engine.decoder import SpeculativeDecoder
from spec_engine.eagle import DEFAULT_WEIGHTS, EagleDrafter, head_dtype, load_head, recommended_settings
from spec_engine.models import DEFAULT_MODEL, load_model
from spec_engine.sampling import SamplingParams


TOP = 4


class RecordingEagleDrafter(EagleDrafter):
    """An EagleDrafter that notes, before each round's drafts, (committed length, its step-1 top-TOP target ids)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_one: list[tuple[int, list[int]]] = []

    def propose(self, committed, k, params, generator):
        if self._predicted is not None:
            logits = self.lm_head(self._predicted)                                        # [N]
            top = torch.topk(logits.float(), TOP).indices.tolist()
            self.step_one.append((len(committed), [self._vocab_ids[i] for i in top]))
        return super().propose(committed, k, params, generator)


def step_one_hits(step_one: list[tuple[int, list[int]]], sequence: list[int]) -> list[list[bool]]:
    """For each recorded round whose position the run reached: [truth in top-1, in top-2, ...]."""
    return [[sequence[at] in top[:j + 1] for j in range(len(top))]
            for at, top in step_one if at < len(sequence)]


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
        hits, emitted, rounds = [], 0, 0
        for seed, (name, text) in enumerate((n, t) for n, t in prompts.items() if n.startswith(f"held-out-{kind}-")):
            drafter = RecordingEagleDrafter(head, target.model, vocab_index,
                                            min_confidence=settings.get("min_confidence", 0.0),
                                            min_path_confidence=settings.get("min_path_confidence", 0.0))
            prompt = target.encode_prompt(text)                                           # [1, T]
            result = SpeculativeDecoder(target.model, drafter).generate(
                prompt, k=args.k, max_new_tokens=args.tokens, sampling=SamplingParams(0.0), seed=seed,
                eos_token_id=target.tokenizer.eos_token_id)
            hits += step_one_hits(drafter.step_one, prompt[0].tolist() + result.tokens)
            emitted, rounds = emitted + result.stats.new_tokens, rounds + result.stats.rounds
        top = [sum(h[j] for h in hits) / len(hits) for j in range(TOP)]
        per_forward = emitted / rounds
        rows.append({"kind": kind, "prompts": args.held_out, "rounds": len(hits), "top": top,
                     "tokens_per_forward": per_forward, "sibling_gain": top[1] - top[0]})
    lines = [f"| held-out kind | rounds | step-1 top-1 | top-2 | top-3 | top-4 | tokens / forward (k = {args.k}) "
             "| + a step-1 leaf sibling |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} ({r['prompts']}) | {r['rounds']} | " + " | ".join(f"{v:.3f}" for v in r["top"]) +
                     f" | {r['tokens_per_forward']:.2f} | +{r['sibling_gain']:.2f} "
                     f"(+{100 * r['sibling_gain'] / r['tokens_per_forward']:.0f}%) |")
    command = "python -m bench.eagle_topk " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    text = "\n".join(lines) + (f"\n\nGreedy, fp32 target, the shipped head ({DEFAULT_WEIGHTS.name}), "
                               f"{args.tokens} new tokens per prompt. `{command}`\n")
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"rows": rows, "command": command}, indent=1) + "\n")


if __name__ == "__main__":
    main()
