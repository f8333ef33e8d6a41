"""Quantization changes the model; speculation does not. Both measured on the offline default (SmolLM2-135M).

1. **Quantized targets** (spec_engine/models/quantize.py: bf16, torch's int8 and int4 weight-only kernels), each a
   quantized copy of the loaded fp32 target (load_model(quantization=...) builds the same modules): greedy decoding's
   tokens per second, the weight bytes one step reads, and how the model changed against fp32: the position where
   its greedy text first leaves fp32's (none: equal over all --tokens), and, teacher-forced on held-out text (each
   held-out prompt of bench/data/eagle_prompts.json followed by fp32's greedy answer to it), the share of positions
   whose top-1 token is fp32's and the mean KL(fp32 || quantized) in nats. fp32 runs twice: on the CPU speed layer's
   lean forward (what the app runs) and on transformers' modules (SPEC_ENGINE_LEAN=0), the path int8 / int4 take.
2. **The quantized self-draft** (`quantized-self:B`): the same copies drafting for the fp32 target at k = --k; every
   run is checked to give plain fp32 decoding's tokens; tokens per target forward and the speedup over plain fp32
   decoding (sides alternating, timed seconds apart).

The targets' bf16 logits (the bf16 model's, and the bf16 LM head of int8 / int4) round to steps of 1/8 near 20, so a
near-tie of fp32 can become an exact tie there: the first divergences of bench/results/quantized-smollm2-1thread at
position 5 of its first prompt are one (fp32's two best logits 21.647 and 21.570; the bf16 copy's, teacher-forced,
21.625 both).

    python -m bench.quantized --prompts 2 --tokens 32 --out bench/results/quantized-smollm2-1thread
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from spec_engine import QuantizedSelfDrafter, SamplingParams, SpeculativeDecoder, autoregressive_generate
from spec_engine.bench import held_out_prompts
from spec_engine.classroom.three_ways import agreement
from spec_engine.core import speed
from spec_engine.models import DEFAULT_MODEL, load_model
from spec_engine.models.quantize import TORCH_SCHEMES, quantized_copy, weight_bytes_per_token

GREEDY = SamplingParams(temperature=0.0)


@contextmanager
def lean(on: bool):
    """The CPU speed layer's lean forward on or off (it reads SPEC_ENGINE_LEAN before every forward)."""
    before = os.environ.get("SPEC_ENGINE_LEAN")
    os.environ["SPEC_ENGINE_LEAN"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["SPEC_ENGINE_LEAN"]
        else:
            os.environ["SPEC_ENGINE_LEAN"] = before


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def first_divergence(tokens: list[int], reference: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)


def variants(target) -> dict[str, tuple[object, bool]]:
    """name -> (model, lean forward on): fp32 on both paths, then the quantized copies."""
    out = {"fp32": (target, True), "fp32 (transformers' modules)": (target, False)}
    for scheme in TORCH_SCHEMES:
        copy = quantized_copy(target, scheme)
        speed.active().adopt(copy)
        speed.active().warm(copy)
        out[scheme] = (copy, True)
    return out


def measure_targets(target, prompts, args) -> tuple[list[dict], dict]:
    """Each target decodes every prompt once a repeat, the targets' order reversed every other repeat (a shared
    machine's load drifts: neighbours in time share it)."""
    models = variants(target)
    seconds, tokens = {name: [] for name in models}, {name: {} for name in models}
    for repeat in range(args.repeats + 1):
        for name in (list(models) if repeat % 2 else list(models)[::-1]):
            model, lean_on = models[name]
            with lean(lean_on):
                for p, ids in prompts.items():
                    spent, result = timed(lambda: autoregressive_generate(model, ids, max_new_tokens=args.tokens,
                                                                          sampling=GREEDY))
                    tokens[name][p] = result.tokens
                    if repeat:            # the first pass warms up
                        seconds[name].append(spent)
    fp32 = tokens["fp32"]
    texts = [torch.cat([ids, torch.tensor([fp32[p]])], dim=1) for p, ids in prompts.items()]
    rows = []
    for name, (model, _) in models.items():
        top1, kl = agreement(model, target, texts)
        rows.append({"target": name, "tokens_per_second": args.tokens / statistics.median(seconds[name]),
                     "seconds_spread": [min(seconds[name]), max(seconds[name])],
                     "weight_mb_per_token": weight_bytes_per_token(model) / 2**20,
                     "first_divergence": {p: first_divergence(t, fp32[p]) for p, t in tokens[name].items()},
                     "top1_agreement": top1, "kl_nats": kl})
    return rows, fp32


def measure_drafts(target, prompts, plain_tokens, args) -> list[dict]:
    rows = []
    for scheme in TORCH_SCHEMES:
        drafter = QuantizedSelfDrafter(target, scheme)
        ratios, tokens, forwards = [], 0, 0
        for repeat in range(args.repeats + 1):
            for p, ids in prompts.items():
                sides = {}
                for side in (("plain", "spec") if repeat % 2 else ("spec", "plain")):
                    run = (lambda: SpeculativeDecoder(target, drafter).generate(
                        ids, k=args.k, max_new_tokens=args.tokens, sampling=GREEDY, display=False)) \
                        if side == "spec" else \
                        (lambda: autoregressive_generate(target, ids, max_new_tokens=args.tokens, sampling=GREEDY))
                    sides[side] = timed(run)
                result = sides["spec"][1]
                assert result.tokens == plain_tokens[p], f"quantized-self:{scheme} left plain decoding's tokens"
                if repeat:
                    ratios.append(sides["plain"][0] / sides["spec"][0])
                    tokens, forwards = tokens + len(result.tokens), forwards + len(result.rounds)
        rows.append({"draft": f"quantized-self:{scheme}", "k": args.k, "tokens_per_forward": tokens / forwards,
                     "speedup": statistics.geometric_mean(ratios), "speedup_spread": [min(ratios), max(ratios)],
                     "same_tokens_as_plain": True})
    return rows


def report(argv, args, targets, drafts, load) -> str:
    lines = [f"`python -m bench.quantized {' '.join(argv)}`",
             f"{DEFAULT_MODEL}, {args.threads} thread(s), {args.prompts} held-out prompts, greedy, {args.tokens} "
             f"tokens, {args.repeats} measured repeats after a warm-up; load average {load[0]:.2f} before, "
             f"{load[1]:.2f} after (a shared machine: compare rows only within this run).", "",
             "| target | tok/s | MB of weights read per token | first divergence from fp32 (per prompt) | "
             "top-1 agreement | KL (nats) |", "|---|---|---|---|---|---|"]
    for r in targets:
        divergence = ", ".join("none" if d is None else str(d) for d in r["first_divergence"].values())
        lines.append(f"| {r['target']} | {r['tokens_per_second']:.1f} | {r['weight_mb_per_token']:.0f} | "
                     f"{divergence} | {r['top1_agreement']:.3f} | {r['kl_nats']:.4f} |")
    lines += ["", "Quantized self-draft for the fp32 target (every run gave plain fp32 decoding's tokens):", "",
              "| draft | k | tokens per target forward | speedup over plain fp32 (spread) |", "|---|---|---|---|"]
    for r in drafts:
        lines.append(f"| {r['draft']} | {r['k']} | {r['tokens_per_forward']:.2f} | {r['speedup']:.2f}x "
                     f"({r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}) |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="the first N held-out prompts")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_model(DEFAULT_MODEL, "cpu", "float32")
    speed.active().warm(engine.model)
    prompts = {name: engine.encode_prompt(text) for name, text in held_out_prompts(args.prompts).items()}
    load_before = os.getloadavg()[0]
    targets, plain_tokens = measure_targets(engine.model, prompts, args)
    drafts = measure_drafts(engine.model, prompts, plain_tokens, args)
    load = (load_before, os.getloadavg()[0])
    text = report(argv, args, targets, drafts, load)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n", encoding="utf-8")
        meta = {"command": f"python -m bench.quantized {' '.join(argv)}", "args": vars(args),
                "load_average": load, "torch": torch.__version__}
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "targets": targets, "self_drafts": drafts},
                                                       indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
