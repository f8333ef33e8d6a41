"""Choose the default layer-skip self-draft for the offline default by measurement.

1. For each decoder layer i >= 1, measure greedy acceptance when only layer i is skipped.
2. Build candidate skip sets from the least harmful layers (the n most skippable, n = 1, 2, 4, 6, 8) and
   measure acceptance and wall-clock speed against plain decoding, same prompts, same run, k in {1, 2}.
Prints a table and a JSON line; the chosen set goes to spec_engine.drafters.DEFAULT_SKIP_LAYERS.

    PYTHONPATH=. python bench/choose_skip_layers.py [--tokens 32] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import spec_engine as se

PROMPTS = ["Explain in three sentences why the sky is blue.",
           "Write a Python function that checks whether a number is prime.",
           "Give me three tips for a job interview."]


def acceptance(model, prompt_ids, skip, k, tokens):
    result = se.SpeculativeDecoder(model, se.LayerSkipDrafter(model, skip)).generate(
        prompt_ids, k=k, max_new_tokens=tokens, sampling=se.SamplingParams(0.0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = se.load_model("smollm2-135m-instruct")
    model = loaded.model
    prompts = [loaded.encode_prompt(p) for p in PROMPTS]
    n_layers = len(model.model.layers)
    single = {}
    for layer in range(1, n_layers):
        single[layer] = statistics.mean(acceptance(model, p, [layer], 2, args.tokens).stats.acceptance_rate
                                        for p in prompts[:1])
        print(f"skip only layer {layer:2d}: acceptance {single[layer]:.2f}", flush=True)
    ranked = sorted(single, key=lambda i: -single[i])
    rows = []
    for n in (1, 2, 4, 6, 8):
        skip = sorted(ranked[:n])
        for k in (1, 2):
            ratios, accs = [], []
            for p in prompts:
                start = time.perf_counter()
                se.autoregressive_generate(model, p, max_new_tokens=args.tokens, sampling=se.SamplingParams(0.0))
                plain = time.perf_counter() - start
                result = acceptance(model, p, skip, k, args.tokens)
                ratios.append(plain / result.total_seconds)
                accs.append(result.stats.acceptance_rate)
            rows.append({"skip": skip, "k": k, "acceptance": statistics.mean(accs),
                         "speedup_vs_plain": statistics.median(ratios)})
            print(f"skip {len(skip)} layers {skip} k={k}: acceptance {rows[-1]['acceptance']:.2f}, "
                  f"speed {rows[-1]['speedup_vs_plain']:.2f}x plain", flush=True)
    best = max(rows, key=lambda r: r["speedup_vs_plain"])
    print(json.dumps({"single_layer_acceptance": single, "candidates": rows, "best": best}))


if __name__ == "__main__":
    main()
