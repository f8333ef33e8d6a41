"""The static KV cache path (spec_engine/core/static_cache.py) against the hand-written CPU layer, interleaved in one
process on the same prompts: SmolLM2-135M-Instruct fp32, greedy plain decoding, torch threads as given (2 by default).

    PYTHONPATH=. .venv/bin/python -m bench.static_cpu --tokens 48 --repeats 3 [--compile]

Arms, in turn prompt by prompt (the order alternating by repeat), every arm's tokens checked identical to the CPU
layer's: `cpu` (the default path: accel's speed layer, its compiled C++ layers and growing caches), `static` (the
core's device-generic forward over StaticLayer caches) and, with --compile, `static+inductor` (the same with the
model's forward under torch.compile, inductor, dynamic shapes). The first repeat warms up (and compiles) and is
dropped. Prints tokens/s per arm (median over prompts and repeats) and each arm's ratio to `cpu`, with the host's
load (os.getloadavg) before and after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import spec_engine as se
from spec_engine.core import speed, static_cache

PROMPTS = ["Write a Python function that returns the factorial of n.",
           "Explain in a few sentences why the sky is blue.",
           "Give me three tips for learning a new language, one short sentence each."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="add the static path under torch.compile (inductor)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the first warms up and is dropped)")
    torch.set_num_threads(args.threads)
    loaded = se.load_model("smollm2-135m-instruct", device="cpu", dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    cpu_layer = speed.active()
    compiled = torch.compile(model, backend="inductor", dynamic=True) if args.compile else None

    def run(arm: str, ids):
        greedy = se.SamplingParams(0.0)
        if arm == "cpu":
            return se.autoregressive_generate(model, ids, max_new_tokens=args.tokens, sampling=greedy)
        with static_cache.use(ids.shape[1] + args.tokens + 8):
            return se.autoregressive_generate(compiled if arm == "static+inductor" else model, ids,
                                              max_new_tokens=args.tokens, sampling=greedy)

    arms = ["cpu", "static"] + (["static+inductor"] if args.compile else [])
    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             return_tensors="pt") for p in PROMPTS]
    encoded = [e["input_ids"] if hasattr(e, "keys") else e for e in encoded]
    print(f"load before: {os.getloadavg()}  threads {args.threads}  cpu layer: {cpu_layer.name}")
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        order = arms if repeat % 2 == 0 else arms[::-1]
        for ids in encoded:
            reference = None
            for arm in order:
                start = time.perf_counter()
                result = run(arm, ids)
                seconds = time.perf_counter() - start
                if reference is None:
                    reference = result.tokens
                elif result.tokens != reference:
                    raise SystemExit(f"{arm} gave other tokens than {order[0]} on prompt {PROMPTS[encoded.index(ids)]!r}")
                if repeat:
                    rates[arm].append(len(result.tokens) / seconds)
    print(f"load after: {os.getloadavg()}")
    base = statistics.median(rates["cpu"])
    for arm in arms:
        rate = statistics.median(rates[arm])
        print(f"{arm:16s} {rate:7.2f} tok/s (median of {len(rates[arm])})  x{rate / base:.3f} of cpu")


if __name__ == "__main__":
    main()
