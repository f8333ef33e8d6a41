"""The static path's captured forwards against eager ones, on random-weight models of real shapes
(`spec_engine.bench.random_target`: a forward's cost does not depend on the weights' values):

- plain greedy decoding, eager (the default path) and captured (`static_cache.use(fixed=True)`: one CUDA graph per
  verify bucket, core/captured.py): tokens/s, the step time, and the achieved bandwidth (weight bytes / step time);
  whether the two gave the same tokens (fp32 must; bf16 may differ at near-ties, as attention spans differ);
- the verify cost by rows on the captured path: a forward over n rows after a cached context, as a multiple of a
  one-row forward (each n padded to its bucket, so 1, 2, 4, ... 32 are the widths a graph is captured for);
- prompt lookup's and the EAGLE head's (a random head: the cost is real, its acceptance is not) speedup over plain
  captured decoding on the captured path, beside their tokens per target forward (the speedup's ceiling).

    python -m bench.gpu_static --out bench/results/gpu/static                                  # a lent GPU
    python -m bench.gpu_static --device cpu --models random-smollm2-135m:float32 --tokens 4 --rows 1 2 --repeats 1

On the CPU the captured path is its fallback (the same fixed-shape forward, eager): the plumbing, not a figure.
Each model's rows are printed as soon as they are measured, so a step cut short by its time limit keeps them.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import spec_engine as se
from spec_engine.bench import random_target
from spec_engine.core import static_cache
from spec_engine.core.cache import forward_logits, new_cache, trim_cache
from spec_engine.core.timing import clock
from spec_engine.drafters.eagle import random_eagle_drafter

MODELS = ["random-smollm2-135m:float32", "random-llama-1b:bfloat16", "random-llama-8b:bfloat16"]
GREEDY = se.SamplingParams(0.0)


def prompt_ids(device, length: int = 96) -> torch.Tensor:
    """Seeded random ids with a phrase repeated, so that prompt lookup finds matches: [1, length]."""
    generator = torch.Generator().manual_seed(0)
    phrase = torch.randint(100, 20000, (12,), generator=generator)
    noise = torch.randint(100, 20000, (length,), generator=generator)
    ids = torch.where(torch.arange(length) % 24 < 12, phrase.repeat(length // 12 + 1)[:length], noise)
    return ids[None].to(device)


def timed(device, run):
    start = clock(device)
    result = run()
    return result, clock(device) - start


def decoding(model, prompt, tokens: int, repeats: int, drafter=None) -> dict:
    """Tokens/s of greedy decoding (plain, or speculative with `drafter()` at k=4), after one untimed warm-up run
    (it captures the graphs on the captured path): median over `repeats`."""
    def run():
        if drafter is None:
            return se.autoregressive_generate(model, prompt, max_new_tokens=tokens, sampling=GREEDY)
        return se.SpeculativeDecoder(model, drafter()).generate(prompt, k=4, max_new_tokens=tokens, sampling=GREEDY)
    run()
    results = [timed(model.device, run) for _ in range(repeats)]
    result = results[-1][0]
    rate = statistics.median(len(r.tokens) / s for r, s in results)
    forwards = max(result.stats.rounds, 1) if drafter is not None else len(result.tokens)
    return {"tok_s": rate, "tokens": result.tokens, "tokens_per_forward": len(result.tokens) / forwards}


def verify_rows(model, rows: list[int], context: int, repeats: int) -> list[dict]:
    """ms of one forward over n rows after `context` cached positions (on the path installed), medians."""
    generator = torch.Generator().manual_seed(1)
    cache = new_cache(model)
    forward_logits(model, torch.randint(100, 20000, (context,), generator=generator).tolist(), cache, 1)
    seconds = {n: [] for n in rows}
    for repeat in range(repeats + 2):                        # two warm-up passes (captures), not kept
        for n in rows:
            tokens = torch.randint(100, 20000, (n,), generator=generator).tolist()
            _, elapsed = timed(model.device, lambda: forward_logits(model, tokens, cache, n))
            trim_cache(cache, context)
            if repeat >= 2:
                seconds[n].append(elapsed)
    one = statistics.median(seconds[rows[0]])
    return [{"rows": n, "ms": statistics.median(seconds[n]) * 1e3, "vs_one": statistics.median(seconds[n]) / one}
            for n in rows]


def measure(spec: str, device: str, args) -> dict:
    name, _, dtype = spec.partition(":")
    model = random_target(name, device=device, dtype=dtype or "bfloat16").model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = prompt_ids(model.device)
    capacity = prompt.shape[1] + args.tokens + 64
    eager = decoding(model, prompt, args.tokens, args.repeats)
    with static_cache.use(capacity, fixed=True):
        captured = decoding(model, prompt, args.tokens, args.repeats)
        rows = verify_rows(model, args.rows, args.context, args.repeats)
        drafts = {"prompt-lookup": decoding(model, prompt, args.tokens, args.repeats, se.PromptLookupDrafter),
                  "eagle (random head)": decoding(model, prompt, args.tokens, args.repeats,
                                                  lambda: random_eagle_drafter(model, scale=3.0))}
    out = {"model": name, "dtype": str(model.dtype).removeprefix("torch."), "weights_gb": weight_bytes / 1e9,
           "same_tokens": eager["tokens"] == captured["tokens"], "verify": rows, "plain": {}, "drafts": {}}
    for path, r in (("eager", eager), ("captured", captured)):
        out["plain"][path] = {"tok_s": r["tok_s"], "step_ms": 1e3 / r["tok_s"], "gb_s": weight_bytes / 1e9 * r["tok_s"]}
    for draft, r in drafts.items():
        out["drafts"][draft] = {"tok_s": r["tok_s"], "speedup": r["tok_s"] / captured["tok_s"],
                                "tokens_per_forward": r["tokens_per_forward"]}
    return out


def report(r: dict, bandwidth: float) -> str:
    eager, captured = r["plain"]["eager"], r["plain"]["captured"]
    lines = [f"### {r['model']} {r['dtype']} ({r['weights_gb']:.2f} GB of weights)",
             "| plain decoding | tok/s | ms a token | GB/s | of the card's |", "|---|---|---|---|---|"]
    for path, p in (("eager", eager), ("captured", captured)):
        lines.append(f"| {path} | {p['tok_s']:.1f} | {p['step_ms']:.2f} | {p['gb_s']:.0f} | "
                     f"{p['gb_s'] / bandwidth:.0%} |")
    lines.append(f"\ncaptured x{captured['tok_s'] / eager['tok_s']:.2f} of eager; same tokens: {r['same_tokens']}\n")
    lines += ["| verify rows (captured) | " + " | ".join(str(v["rows"]) for v in r["verify"]) + " |",
              "|---" * (len(r["verify"]) + 1) + "|",
              "| ms | " + " | ".join(f"{v['ms']:.2f}" for v in r["verify"]) + " |",
              "| vs one row | " + " | ".join(f"{v['vs_one']:.2f}" for v in r["verify"]) + " |", "",
              "| draft (captured, k=4) | tok/s | speedup | tokens per forward | speedup / tokens per forward |",
              "|---|---|---|---|---|"]
    for draft, d in r["drafts"].items():
        lines.append(f"| {draft} | {d['tok_s']:.1f} | {d['speedup']:.2f}x | {d['tokens_per_forward']:.2f} | "
                     f"{d['speedup'] / d['tokens_per_forward']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_static", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=MODELS, help="NAME:DTYPE (random-* shapes of spec_engine.bench)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rows", nargs="+", type=int, default=list(static_cache.BUCKETS))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth", type=float, default=4800, help="GB/s, the datasheet's (H200: 4800)")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json (after each model)")
    args = parser.parse_args(argv)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = {"device": device_name, "torch": torch.__version__, "tokens": args.tokens, "repeats": args.repeats,
            "context": args.context, "bandwidth_gb_s": args.bandwidth,
            "command": "python -m bench.gpu_static " + " ".join(argv or [])}
    results, text = [], f"Captured (static, fixed shapes) against eager forwards on {device_name}.\n\n"
    for spec in args.models:
        results.append(measure(spec, args.device, args))
        if args.device == "cuda":
            torch.cuda.empty_cache()            # the model measured is gone: its memory goes back before the next
        text += report(results[-1], args.bandwidth) + "\n"
        print(report(results[-1], args.bandwidth), flush=True)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_suffix(".md").write_text(text + json.dumps(meta) + "\n")
            out.with_suffix(".json").write_text(json.dumps({"meta": meta, "models": results}, indent=1))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
