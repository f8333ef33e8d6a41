"""What a verify forward costs on this CPU: one target forward over n new tokens after a cached context, as a multiple
of a one-token forward, as transformers runs it (stock `F.linear`, SDPA copying the grouped KV heads) and as the engine
runs it (its lean forward, spec_engine/accel/lean_llama.py, with MKL-packed weights, spec_engine/accel/cpu_gemm.py, and
grouped-query attention without the copy), interleaved in one process, medians over repeats, all in units of
transformers' one-token forward (so the engine's one-token column shows what its lean forward saves). The JSON keeps the
keys "stock" and "packed" (the engine's column) that bench/lookup_policy.py reads.

    python -m bench.verify_cost --threads 1 --repeats 9 --out bench/results/verify-cost-fp32
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from spec_engine.core.cache import forward_logits, new_cache, trim_cache
from spec_engine.accel.cpu_gemm import prepack
from spec_engine.models import DEFAULT_MODEL, load_model


def forward_seconds(model, cache, context: int, tokens: list[int], packed: bool) -> float:
    """One forward over `tokens` after `context` cached positions (the cache is trimmed back afterwards)."""
    start = time.perf_counter()
    if packed:
        forward_logits(model, tokens, cache, len(tokens))               # the engine's path: inside batched_gemm()
    else:
        with torch.inference_mode():                                     # stock: outside batched_gemm()
            position_ids = torch.arange(context, context + len(tokens))[None]
            model(input_ids=torch.tensor([tokens]), position_ids=position_ids, cache=cache, use_cache=True,
                  logits_to_keep=len(tokens))
    seconds = time.perf_counter() - start
    trim_cache(cache, context)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.verify_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens", nargs="+", type=int, default=list(range(1, 18)))
    parser.add_argument("--context", type=int, default=160, help="cached positions before the verified tokens")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.model, device="cpu", dtype="float32")
    model = target.model
    if not prepack(model):
        raise SystemExit("this torch has no MKL packed sgemm (or SPEC_ENGINE_PACKED_GEMM=0): nothing to compare")
    generator = torch.Generator().manual_seed(0)
    cache = new_cache(model)
    forward_logits(model, torch.randint(100, 20000, (args.context,), generator=generator).tolist(), cache, 1)
    seconds = {(packed, n): [] for packed in (False, True) for n in args.tokens}
    for _ in range(args.repeats):
        for n in args.tokens:
            tokens = torch.randint(100, 20000, (n,), generator=generator).tolist()
            for packed in (False, True):
                seconds[packed, n].append(forward_seconds(model, cache, args.context, tokens, packed))
    one = statistics.median(seconds[False, 1])
    rows = [{"tokens": n, "stock": statistics.median(seconds[False, n]) / one,
             "packed": statistics.median(seconds[True, n]) / one} for n in args.tokens]
    table = "\n".join(["| tokens per forward | stock (transformers) "
                       "| engine (lean forward, packed weights, grouped attention) |", "|---|---|---|"] +
                      [f"| {r['tokens']} | {r['stock']:.2f} | {r['packed']:.2f} |" for r in rows])
    meta = {"model": target.name, "one_token_ms": one * 1e3, "context": args.context, "repeats": args.repeats,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "command": "python -m bench.verify_cost " + " ".join(argv or [])}
    print(table + f"\n\ncost of one forward over n tokens / a one-token forward ({one * 1e3:.1f} ms), medians\n")
    if args.out:
        out = Path(args.out)
        out.with_suffix(".md").write_text(f"{table}\n\nCost of one forward over n new tokens after {args.context} "
                                          f"cached ones, in transformers' one-token forwards (medians).\n\n"
                                          f"{json.dumps(meta)}\n")
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
