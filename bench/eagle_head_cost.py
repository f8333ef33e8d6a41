"""What one EAGLE draft step costs in each head dtype, beside the fp32 offline default: the reduced LM head over the
head's predicted feature, and one head step (fc, the decoder layer, its KV cache), timed alternately in one process,
medians. Not a test: timings are its output.

    python -m bench.eagle_head_cost --threads 1 --dtypes float32 bfloat16
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from spec_engine.core.cache import trim_cache
from spec_engine.accel.cpu_gemm import batched_gemm, prepack
from spec_engine.drafters.eagle import EagleDrafter, load_head
from spec_engine.models import DEFAULT_MODEL, load_model, resolve_dtype


def time_step(drafter: EagleDrafter, repeats: int) -> tuple[float, float]:
    """(reduced LM head ms, head step ms), medians over `repeats` after a warm-up tenth."""
    width = len(drafter.feature_layers) * drafter.head.config.hidden_size
    drafter.begin([1, 2], torch.randn(1, width, generator=torch.Generator().manual_seed(0)))
    feature, head_ms, step_ms = drafter._predicted, [], []
    for _ in range(repeats):
        start = time.perf_counter()
        with batched_gemm():
            drafter.lm_head(feature)
        middle = time.perf_counter()
        drafter._step(feature[None], [100], 1)
        head_ms.append((middle - start) * 1e3)
        step_ms.append((time.perf_counter() - middle) * 1e3)
        trim_cache(drafter.cache, 1)
    skip = repeats // 10
    return statistics.median(head_ms[skip:]), statistics.median(step_ms[skip:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eagle_head_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the dtypes")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, device="cpu", dtype="float32")
    prepack(target.model)
    drafters = {}
    for name in args.dtypes:
        head, vocab_index = load_head(dtype=resolve_dtype(name, "cpu"))
        drafters[name] = EagleDrafter(head, target.model, vocab_index, size_by_cost=False)
    results = {name: [] for name in args.dtypes}
    for _ in range(args.rounds):
        for name, drafter in drafters.items():
            results[name].append(time_step(drafter, args.repeats))
    print("| head dtype | reduced LM head (ms) | head step (ms) |\n|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r[0] for r in runs):.2f} | {statistics.median(r[1] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
