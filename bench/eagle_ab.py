"""Two EAGLE heads on the app's default draft, alternating in one process: does a newly trained head draft better?

    python -m bench.eagle_ab --heads spec_engine/drafters/weights/eagle-smollm2-135m.safetensors /tmp/new.safetensors \
        --repeats 3 --out bench/results/eagle-ab-2threads

Each side is `eagle+lookup-tree` at k = 12 (the app's default draft, its sizing and stops as the shipped head's
record recommends) drafting with one head's weights. The prompts are the six-kind set's tuning part (the prompts
after the first five of each kind, which the issue's benchmark `bench_hf --per-kind 5` leaves out) and the app's
default prompt (presets/scenarios.yaml `chat-sky`). For each repeat and prompt, both sides run seconds apart, in an
order alternating by prompt and repeat, each a speculative run then plain decoding, greedy, 64 tokens, checked
token-identical; the first repeat warms up and is dropped. Reported per side, over all prompts, by kind and on the
default prompt alone: tokens per round, and the speedup over plain decoding (geometric mean of per-run ratios, each
from runs seconds apart).

The default draft sizes its trees by the verify costs it measures as it runs, so its tokens per round move with the
host's speed too. What the head alone decides is measured once more without any timing: `eagle-tree` with a fixed
tree of k nodes every round (`fixed_length`, as the exactness tests draft), greedy, untimed, in the first repeat
(deterministic: one run per prompt and head). On a shared host whose memory speed drifts from minute to minute
(docs/benchmarks.md) that fixed-tree figure is the one to judge a head by; the speedups say what a user would see.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

from bench.eagle_vocab import DEFAULT_PROMPT, drafting_with, tuning_setup
from spec_engine import SamplingParams, SpeculativeDecoder, autoregressive_generate
from spec_engine.drafters import eagle
from spec_engine.drafters.registry import make_drafter


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", nargs=2, required=True, metavar="WEIGHTS", help="two heads' .safetensors files")
    parser.add_argument("--k", type=int, default=12)
    args, argv, engine, prompts, ids = tuning_setup(parser, argv)
    model, greedy = engine.model, SamplingParams(temperature=0.0)
    dtype = eagle.head_dtype(model)
    sides = {Path(path).name if Path(path).name != Path(other).name else path:
             eagle.head_parts(model, Path(path), dtype) for path, other in zip(args.heads, args.heads[::-1])}
    names = list(sides)

    now = {"parts": None}
    ratios, tokens, rounds, fixed = defaultdict(list), defaultdict(int), defaultdict(int), defaultdict(lambda: [0, 0])
    load_before = os.getloadavg()
    with drafting_with(now):                                      # the registry's drafter, now["parts"]'s head
        for repeat in range(args.repeats):
            for i, (p, x) in enumerate(zip(prompts, ids)):
                for side in (names if (repeat + i) % 2 else names[::-1]):
                    now["parts"] = sides[side]
                    decoder = SpeculativeDecoder(model, make_drafter("eagle+lookup-tree", engine, None))
                    start = time.perf_counter()
                    result = decoder.generate(x, k=args.k, max_new_tokens=64, sampling=greedy, display=False)
                    middle = time.perf_counter()
                    plain = autoregressive_generate(model, x, max_new_tokens=64, sampling=greedy)
                    end = time.perf_counter()
                    assert result.tokens == plain.tokens, "speculative decoding left plain decoding's tokens"
                    if repeat == 0:                      # the head alone: a fixed tree, nothing timed
                        untimed = SpeculativeDecoder(model, make_drafter("eagle-tree", engine, None, fixed_length=True))
                        run = untimed.generate(x, k=args.k, max_new_tokens=64, sampling=greedy, display=False)
                        assert run.tokens == plain.tokens, "speculative decoding left plain decoding's tokens"
                        for key in ("all", p.kind, p.name):
                            fixed[side, key][0] += len(run.tokens)
                            fixed[side, key][1] += len(run.rounds)
                    else:
                        for key in ("all", p.kind, p.name):
                            ratios[side, key].append((end - middle) / (middle - start))
                            tokens[side, key] += len(result.tokens)
                            rounds[side, key] += len(result.rounds)
            print(f"repeat {repeat} done", flush=True)
    kinds = list(dict.fromkeys(p.kind for p in prompts[:-1]))
    columns = ["all", *kinds, DEFAULT_PROMPT.name]
    lines = [f"`python -m bench.eagle_ab {' '.join(argv)}`",
             f"{engine.name} fp32, {args.threads} threads, {len(prompts)} prompts ({args.per_kind} of each kind after "
             f"the first {args.first}, and the app's default prompt), `eagle+lookup-tree` at k = {args.k}, greedy, 64 "
             f"tokens, {args.repeats - 1} measured repeats, sides alternating by prompt; every run gave plain "
             f"decoding's tokens; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.", "",
             f"Tokens per round (all prompts, by kind, the default prompt): `eagle-tree` with a fixed tree of {args.k} "
             "nodes (the head alone, untimed), then the default draft as it runs; and the default draft's speedup over "
             "plain decoding (geometric mean of per-run ratios):", "",
             "| head | draft | " + " | ".join(columns) + " | speedup: all | speedup: default prompt |",
             "|---" * (len(columns) + 4) + "|"]
    summary = {}
    for side in names:
        summary[side] = {"fixed_tree_tokens_per_round": {c: fixed[side, c][0] / fixed[side, c][1] for c in columns},
                         "tokens_per_round": {c: tokens[side, c] / rounds[side, c] for c in columns},
                         "speedup": {c: statistics.geometric_mean(ratios[side, c]) for c in columns}}
        s = summary[side]
        lines.append(f"| {side} | fixed tree | " + " | ".join(f"{s['fixed_tree_tokens_per_round'][c]:.3f}"
                                                            for c in columns) + " | | |")
        lines.append(f"| {side} | default | " + " | ".join(f"{s['tokens_per_round'][c]:.3f}" for c in columns)
                     + f" | {s['speedup']['all']:.3f}x | {s['speedup'][DEFAULT_PROMPT.name]:.3f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps({"argv": argv, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
