"""Command line: speculative decoding on one prompt, with the measured plain-decoding baseline.

    python -m spec_engine --prompt "Rewrite: ..." --draft prompt-lookup --k 4 --temperature 0.7 --top-p 0.9
    python -m spec_engine --prompt "..." --draft gemma-3-270m:cross-tokenizer --json

Text marks (colour on a terminal): accepted drafts plain (green), [correction] (red), {bonus} (blue).
--device and --dtype default to $SPEC_DEVICE and $SPEC_DTYPE, else to CUDA when present and to float32 on the CPU
and for models of 0.5B parameters or less (greedy runs then match plain decoding token for token), bfloat16 above.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from spec_engine.core import speed
from spec_engine.core.metrics import expected_tokens_by_position
from spec_engine.core.decoder import MAX_K, MAX_NEW_TOKENS, SpeculativeDecoder, autoregressive_generate
from spec_engine.drafters.registry import make_drafter, parse_draft
from spec_engine.models import DEFAULT_MODEL, QUANTIZATIONS, load_model
from spec_engine.core.sampling import SamplingParams
from spec_engine.core.rule import RULE_INFO
from spec_engine.core.verify import RULES

COLOURS = {"accepted": "\033[32m", "correction": "\033[31m", "bonus": "\033[34m", "reset": "\033[0m"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spec_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="target: preset name, local dir or hub id")
    parser.add_argument("--draft", default="prompt-lookup",
                        help="layer-skip | layer-skip-tree | early-exit[:N] | prompt-lookup[:N[:M]] | "
                             "lookup-tree[:N] | eagle[:C] | eagle+lookup[:C] | <model> | "
                             "<model>:cross-tokenizer | <model>:naive-ids")
    parser.add_argument("--k", type=int, default=4, help=f"draft tokens per round, 1..{MAX_K}")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=64, help=f"1..{MAX_NEW_TOKENS}")
    parser.add_argument("--rule", default="exact", choices=RULES, help="; ".join(
        f"{name}: {'exact' if RULE_INFO[name].exact else RULE_INFO[name].kind}" for name in RULES))
    parser.add_argument("--no-chat", action="store_true", help="encode the prompt as plain text, no chat template")
    parser.add_argument("--device", default=os.environ.get("SPEC_DEVICE") or None,
                        help="cpu | cuda | cuda:N (default: $SPEC_DEVICE, else CUDA when present)")
    parser.add_argument("--dtype", default=os.environ.get("SPEC_DTYPE") or None,
                        help="float32 | bfloat16 | float16 (default: $SPEC_DTYPE, else float32 on the CPU and for "
                             "models of 0.5B parameters or less, bfloat16 above)")
    parser.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                        help="the target's weights: bf16, int8, int4 (torch's CPU kernels) or 8bit, 4bit "
                             "(bitsandbytes); default as loaded")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON object: settings, text, stats, rounds")
    return parser.parse_args(argv)


def marked_text(rounds, tokenizer, colour: bool) -> str:
    def piece(ids, kind):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if colour:
            return f"{COLOURS[kind]}{text}{COLOURS['reset']}"
        return {"accepted": text, "correction": f"[{text}]", "bonus": f"{{{text}}}"}[kind]
    parts = []
    for r in rounds:
        parts.append(piece(r.emitted[:r.accepted], "accepted") if r.accepted else "")
        if r.correction is not None:
            parts.append(piece([r.correction], "correction"))
        if r.bonus is not None:
            parts.append(piece([r.bonus], "bonus"))
    return "".join(parts)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
        spec = parse_draft(args.draft)
        log = (lambda message: None) if args.json else (lambda message: print(f"  {message}", file=sys.stderr))
        target = load_model(args.model, args.device, args.dtype, quantization=args.quantization, progress=log)
        speed.active().warm(target.model)   # the speed layer's lazy state (packed weights) made before the timed run
        draft = load_model(spec.model, target.device, target.dtype, progress=log) if spec.needs_model else None
        prompt_ids = target.encode_prompt(args.prompt, chat=not args.no_chat)
        decoder = SpeculativeDecoder(target.model, make_drafter(spec, target, draft), rule=args.rule)
        eos = target.tokenizer.eos_token_id
        result = decoder.generate(prompt_ids, k=args.k, max_new_tokens=args.max_new_tokens, sampling=sampling,
                                  seed=args.seed, eos_token_id=eos)
        baseline = None if args.no_baseline else autoregressive_generate(
            target.model, prompt_ids, max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
            eos_token_id=eos)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    speedup = baseline.total_seconds / result.total_seconds if baseline else None
    if args.json:
        print(json.dumps({
            "settings": {**vars(args), **sampling.as_dict()}, "target": target.name, "draft": args.draft,
            "placement": {"device": str(target.device), "dtype": str(target.dtype).removeprefix("torch.")},
            "text": target.tokenizer.decode(result.tokens, skip_special_tokens=True), "tokens": result.tokens,
            "stats": result.stats.__dict__, "total_seconds": result.total_seconds,
            "baseline": None if baseline is None else {"tokens": baseline.tokens,
                                                       "total_seconds": baseline.total_seconds,
                                                       "tokens_per_second": baseline.tokens_per_second},
            "speedup_vs_plain": speedup, "provenance": result.provenance,
            "rounds": [r.to_dict() for r in result.rounds]}))
        return 0
    colour = sys.stdout.isatty()
    print(marked_text(result.rounds, target.tokenizer, colour))
    legend = ("green = accepted draft, red = correction, blue = bonus" if colour
              else "plain = accepted draft, [correction], {bonus}")
    s = result.stats
    print(f"\n({legend})")
    print(f"target {target.name} ({target.dtype}), draft {args.draft}, k={args.k}, rule={args.rule}, "
          f"{sampling.as_dict()}")
    trees = sum(r.is_tree for r in result.rounds)
    drafts = (f"{s.accepted} accepted of {s.drafted} tree nodes; a tree counts its depth, one path is kept" if trees
              else f"{s.accepted}/{s.drafted} drafts")
    print(f"acceptance rate {s.acceptance_rate:.2f} ({drafts}), "
          f"{s.tokens_per_round:.2f} tokens per target forward, {s.rounds} rounds")
    if s.acceptance_by_position:
        print("acceptance by position " + " ".join(f"{alpha:.2f}" for alpha in s.acceptance_by_position)
              + f" (E = 1 + sum of prod = {expected_tokens_by_position(s.acceptance_by_position):.2f} tokens per "
                "forward)")
    print(f"speculative {s.tokens_per_second:.1f} tok/s ({result.total_seconds:.2f} s for {s.new_tokens} tokens)")
    if baseline:
        print(f"plain       {baseline.tokens_per_second:.1f} tok/s ({baseline.total_seconds:.2f} s for "
              f"{len(baseline.tokens)} tokens) -> speedup {speedup:.2f}x (measured, same prompt, settings and seed)")
        if sampling.greedy and baseline.tokens != result.tokens:
            print("warning: greedy outputs differ (numerics of batched vs single-token forwards"
                  + (f": in {str(target.dtype).removeprefix('torch.')} near-ties may differ; float32 keeps them"
                     if target.dtype not in (torch.float32, torch.float64) else "") + ")", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
