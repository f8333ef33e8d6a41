"""The EAGLE head's path-confidence stop, swept: speculative runs of `eagle+lookup` at each stop, interleaved with
plain decoding on the same prompt in one process, greedy, medians over repeats. Checks greedy identity as it goes.

    python -m bench.eagle_path_stop --threads 1 --prompts chat code --stops 0 0.2 0.3 0.4 0.5 --k 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import spec_engine as se
from spec_engine.bench import PROMPTS
from spec_engine.drafters.sizing import verify_costs
from spec_engine.accel.cpu_gemm import prepack
from spec_engine.models import DEFAULT_MODEL, load_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eagle_path_stop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", default=["chat", "code"], choices=sorted(PROMPTS))
    parser.add_argument("--stops", nargs="+", type=float, default=[0.0, 0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, device="cpu", dtype="float32")
    prepack(target.model)
    verify_costs(target.model)          # calibrated once, now, not inside the first timed run
    greedy, eos = se.SamplingParams(0.0), target.tokenizer.eos_token_id
    print("| prompt | path stop | vs plain | tokens per round |\n|---|---|---|---|")
    for name in args.prompts:
        prompt_ids = target.encode_prompt(PROMPTS[name])
        speedups, per_round = {stop: [] for stop in args.stops}, {}
        for _ in range(args.repeats):
            start = time.perf_counter()
            plain = se.autoregressive_generate(target.model, prompt_ids, max_new_tokens=args.tokens, sampling=greedy,
                                               eos_token_id=eos)
            plain_seconds = time.perf_counter() - start
            for stop in args.stops:
                drafter = se.make_drafter("eagle+lookup", target)
                drafter.fallback.min_path_confidence = stop
                start = time.perf_counter()
                result = se.SpeculativeDecoder(target.model, drafter).generate(
                    prompt_ids, k=args.k, max_new_tokens=args.tokens, sampling=greedy, eos_token_id=eos)
                speedups[stop].append(plain_seconds / (time.perf_counter() - start))
                per_round[stop] = len(result.tokens) / len(result.rounds)
                assert result.tokens == plain.tokens, "greedy identity broken"
        for stop in args.stops:
            print(f"| {name} | {stop:g} | {statistics.median(speedups[stop]):.2f}x | {per_round[stop]:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
