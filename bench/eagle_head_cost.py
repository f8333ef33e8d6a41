"""What one EAGLE draft step costs in each head dtype, beside the fp32 offline default: the reduced LM head over the
head's predicted feature, and one head step (fc, the decoder layer, its KV cache), timed alternately in one process,
medians. Not a test: timings are its output.

    python -m bench.eagle_head_cost --threads 1 --dtypes float32 bfloat16
    python -m bench.eagle_head_cost --threads 2 --dtypes bfloat16 --after-target 2

`--after-target ROWS` also times a round's catch-up as the engine meets it: right after a one-token forward of the
target (whose 538 MB stream has evicted the head's weights from the caches), the head's step over ROWS accepted
tokens' true features (the target's fused layers, so the fusion runs too), then the reduced LM head over its last
prediction (the next round's first draft); and the same two again at once, warm.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from spec_engine import prepare
from spec_engine.core import speed
from spec_engine.core.cache import forward_logits, new_cache, trim_cache
from spec_engine.drafters.eagle import DEFAULT_WEIGHTS, EagleDrafter, head_parts
from spec_engine.models import DEFAULT_MODEL, load_model, resolve_dtype


def engine_drafter(target_model, dtype: torch.dtype) -> EagleDrafter:
    """The shipped head in `dtype`, built as the engine builds its own (eagle.head_parts), with no sizing."""
    head, vocab_index, lm_head = head_parts(target_model, DEFAULT_WEIGHTS, dtype)
    return EagleDrafter(head, target_model, vocab_index, size_by_cost=False, lm_head=lm_head)


def time_step(drafter: EagleDrafter, repeats: int) -> tuple[float, float]:
    """(reduced LM head ms, head step ms), medians over `repeats` after a warm-up tenth."""
    width = len(drafter.feature_layers) * drafter.head.config.hidden_size
    drafter.begin([1, 2], torch.randn(1, width, generator=torch.Generator().manual_seed(0)))
    feature, head_ms, step_ms = drafter._predicted, [], []
    for _ in range(repeats):
        start = time.perf_counter()
        with speed.active().products():
            drafter.lm_head(feature)
        middle = time.perf_counter()
        drafter._step(feature[None], [100], 1)
        head_ms.append((middle - start) * 1e3)
        step_ms.append((time.perf_counter() - middle) * 1e3)
        trim_cache(drafter.cache, 1)
    skip = repeats // 10
    return statistics.median(head_ms[skip:]), statistics.median(step_ms[skip:])


def time_catch_up(drafter: EagleDrafter, target, rows: int, repeats: int) -> dict[str, float]:
    """Medians (ms) of a catch-up over `rows` true features and the LM head after it, right after a one-token target
    forward ("cold") and repeated at once ("warm")."""
    width = len(drafter.feature_layers) * drafter.head.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    drafter.begin([1, 2], torch.randn(1, width, generator=generator))
    features = torch.randn(rows, width, generator=generator)                          # [rows, F]
    cache = new_cache(target)
    forward_logits(target, list(range(100, 164)), cache, 1)
    context, start = cache.get_seq_length(), drafter.cache.get_seq_length()
    times: dict[str, list[float]] = {key: [] for key in ("cold step", "cold LM head", "warm step", "warm LM head")}
    for _ in range(repeats):
        forward_logits(target, [5], cache, 1)
        trim_cache(cache, context)
        for when in ("cold", "warm"):
            begin = time.perf_counter()
            predicted = drafter._step(features, list(range(200, 200 + rows)), start)[-1]   # [H]
            middle = time.perf_counter()
            with speed.active().products():
                drafter.lm_head(predicted)
            times[f"{when} step"].append((middle - begin) * 1e3)
            times[f"{when} LM head"].append((time.perf_counter() - middle) * 1e3)
            trim_cache(drafter.cache, start)
    skip = repeats // 10
    return {key: statistics.median(values[skip:]) for key, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eagle_head_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the dtypes")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--after-target", type=int, default=0, metavar="ROWS",
                        help="also time a catch-up over ROWS true features right after a target forward (see above)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, device="cpu", dtype="float32")
    prepare(target.model)
    drafters = {name: engine_drafter(target.model, resolve_dtype(name, "cpu")) for name in args.dtypes}
    results = {name: [] for name in args.dtypes}
    for _ in range(args.rounds):
        for name, drafter in drafters.items():
            results[name].append(time_step(drafter, args.repeats))
    print("| head dtype | reduced LM head (ms) | head step (ms) |\n|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r[0] for r in runs):.2f} | {statistics.median(r[1] for r in runs):.2f} |")
    if args.after_target:
        caught = {name: [] for name in args.dtypes}
        for _ in range(args.rounds):
            for name, drafter in drafters.items():
                caught[name].append(time_catch_up(drafter, target.model, args.after_target, args.repeats))
        keys = list(caught[args.dtypes[0]][0])
        print(f"\nA catch-up over {args.after_target} true features, then the LM head (ms; cold: right after a target "
              "forward)\n\n| head dtype | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
        for name, runs in caught.items():
            print(f"| {name} | " + " | ".join(f"{statistics.median(r[key] for r in runs):.2f}" for key in keys) + " |")


if __name__ == "__main__":
    main()
