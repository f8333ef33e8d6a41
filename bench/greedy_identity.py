"""How often the engine's greedy output differs from plain decoding in the same dtype: `eagle+lookup` at each k
against plain decoding, on the benchmark's four prompts and the first N held-out ones, no EOS stop. In fp32 none
should (the exactness tests assert it on fewer prompts); in bf16 a batched forward rounds differently from a
one-token one, so some do. Not a test: it prints where runs first differ.

    python -m bench.greedy_identity --dtype bfloat16 --held-out 12 --k 3 8 --tokens 96
"""
from __future__ import annotations

import argparse

import torch

import spec_engine as se
from spec_engine.bench import PROMPTS, held_out_prompts
from spec_engine.accel.cpu_gemm import prepack
from spec_engine.models import DEFAULT_MODEL, load_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.greedy_identity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--draft", default="eagle+lookup")
    parser.add_argument("--held-out", type=int, default=12)
    parser.add_argument("--k", nargs="+", type=int, default=[3, 8])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, device="cpu", dtype=args.dtype)
    prepack(target.model)
    decoder = se.SpeculativeDecoder(target.model, se.make_drafter(args.draft, target))
    greedy = se.SamplingParams(0.0)
    prompts = {**PROMPTS, **held_out_prompts(args.held_out)}
    differ = runs = 0
    for name, text in prompts.items():
        ids = target.encode_prompt(text)
        plain = se.autoregressive_generate(target.model, ids, args.tokens, greedy).tokens
        for k in args.k:
            spec = decoder.generate(ids, k=k, max_new_tokens=args.tokens, sampling=greedy).tokens
            runs += 1
            if spec != plain:
                differ += 1
                first = next(i for i, (a, b) in enumerate(zip(spec + [None], plain + [None])) if a != b)
                print(f"{name}, k = {k}: first differs at token {first} of {len(plain)}", flush=True)
    print(f"{args.dtype}, {args.draft}: {differ} of {runs} runs differ from plain decoding ({len(prompts)} prompts, "
          f"k = {' and '.join(map(str, args.k))}, {args.tokens} tokens)")


if __name__ == "__main__":
    main()
