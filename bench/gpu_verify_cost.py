"""What a verify forward costs on a GPU: one target forward over n new tokens after a cached context, as a multiple
of a one-token forward, through the engine's own forward (`core.cache.forward_logits`, the path every round takes),
on random-weight models of real shapes (`spec_engine.bench.random_target`: a forward's cost does not depend on the
weights' values). Beside each measured row: the What-if tab's projection for the GPU class named by --bandwidth and
--tflops (v(n) = 1 + (n - 1) / n_ridge, docs/whatif.md), and what a one-token forward would take if it only read
the weights at the datasheet bandwidth, so the page's "verifying a few rows costs about one step" is checked, not
assumed. CUDA events would time the GPU alone; this times what a decoder waits for (host time included, synchronised
before and after), since that is what a round pays.

    python -m bench.gpu_verify_cost --out bench/results/gpu/verify-cost-h200          # on the lent H200
    python -m bench.gpu_verify_cost --device cpu --models random-smollm2-135m --tokens 1 4 --repeats 2   # plumbing
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from spec_engine.bench import random_target
from spec_engine.classroom.whatif import CostModel, Hardware
from spec_engine.core.cache import forward_logits, new_cache, trim_cache
from spec_engine.core.timing import clock

ROWS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
MODELS = ["random-smollm2-135m:float32", "random-llama-1b:bfloat16", "random-llama-8b:bfloat16"]


def forward_seconds(model, cache, context: int, tokens: list[int]) -> float:
    """One forward over `tokens` after `context` cached positions, synchronised; the cache is trimmed back."""
    start = clock(model.device)
    forward_logits(model, tokens, cache, len(tokens))
    seconds = clock(model.device) - start
    trim_cache(cache, context)
    return seconds


def measure(name: str, dtype: str, device: str, rows: list[int], context: int, repeats: int) -> dict:
    loaded = random_target(name, device=device, dtype=dtype)
    model = loaded.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    generator = torch.Generator().manual_seed(0)
    cache = new_cache(model)
    forward_logits(model, torch.randint(100, 20000, (context,), generator=generator).tolist(), cache, 1)
    seconds = {n: [] for n in rows}
    for repeat in range(repeats + 2):                                   # two warm-up passes, not kept
        for n in rows:                                                  # interleaved: drift hits every n alike
            tokens = torch.randint(100, 20000, (n,), generator=generator).tolist()
            elapsed = forward_seconds(model, cache, context, tokens)
            if repeat >= 2:
                seconds[n].append(elapsed)
    one = statistics.median(seconds[rows[0]])
    out = {"model": name, "dtype": dtype, "weights_gb": weight_bytes / 1e9, "one_token_ms": one * 1e3,
           "rows": [{"tokens": n, "ms": statistics.median(seconds[n]) * 1e3,
                     "vs_one": statistics.median(seconds[n]) / one} for n in rows]}
    del model, loaded, cache
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_verify_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=MODELS, help="NAME:DTYPE (random-* shapes of spec_engine.bench)")
    parser.add_argument("--tokens", nargs="+", type=int, default=ROWS)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--bandwidth", type=float, default=4800, help="GB/s, the datasheet's (H200: 4800)")
    parser.add_argument("--tflops", type=float, default=989, help="dense bf16 tensor TFLOP/s (H200: 989)")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    card = Hardware("card", "the card's datasheet", args.bandwidth, args.tflops, memory_gb=0.0)
    ridge = card.ridge_rows                                             # rows where arithmetic = weight reads
    roofline = CostModel("What-if", verify_one=1.0, verify_per_row=1.0 / ridge, draft_forward=0.0,
                         plain_tokens_per_second=0.0, measured=False)    # whatif.gpu_cost's verify curve
    results = []
    for spec in args.models:
        name, _, dtype = spec.partition(":")
        results.append(measure(name, dtype or "bfloat16", args.device, args.tokens, args.context, args.repeats))
        r = results[-1]
        print(f"{name} {r['dtype']}: one token {r['one_token_ms']:.2f} ms; " +
              " ".join(f"{row['tokens']}:{row['vs_one']:.2f}" for row in r["rows"]), flush=True)
    head = ("| tokens per forward | " + " | ".join(f"{r['model']} {r['dtype']}" for r in results)
            + " | What-if projection |")
    lines = [head, "|---" * (len(results) + 2) + "|"]
    for i, n in enumerate(args.tokens):
        lines.append(f"| {n} | "
                     + " | ".join(f"{r['rows'][i]['vs_one']:.2f} ({r['rows'][i]['ms']:.2f} ms)" for r in results)
                     + f" | {roofline.verify_cost(n):.2f} |")
    reads = " ".join(f"{r['model']}: {r['weights_gb']:.2f} GB of weights, "
                     f"{r['weights_gb'] / args.bandwidth * 1e3:.2f} ms to read at {args.bandwidth:g} GB/s "
                     f"against {r['one_token_ms']:.2f} ms measured." for r in results)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = {"device": device_name, "context": args.context, "repeats": args.repeats, "torch": torch.__version__,
            "ridge_rows": ridge, "bandwidth_gb_s": args.bandwidth, "tensor_tflops": args.tflops,
            "command": "python -m bench.gpu_verify_cost " + " ".join(argv or [])}
    text = ("\n".join(lines) + f"\n\nCost of one forward over n new tokens after {args.context} cached ones, "
            f"in one-token forwards of the same model (medians of {args.repeats}, ms in brackets), on {device_name}. "
            f"The projection is the What-if tab's v(n) = 1 + (n - 1) / {ridge:.0f}. {reads}\n\n{json.dumps(meta)}\n")
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "models": results}, indent=1))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
