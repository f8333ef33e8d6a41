"""Batching and speculation together, measured (issue #58). Not a test: run it by hand.

    python -m spec_engine.bench_batch --threads 2 --batches 1 2 4 8 16 32 --tokens 64 \
        --out bench/results/batch-heldout

For each batch size B, the first B held-out prompts of bench/data/hf_compare_prompts.json (chat-templated, greedy,
`--tokens` new tokens each, no EOS stop so every sequence decodes the same length) go through `BatchDecoder` at once,
in each arm, the arms back to back in balanced orders (`balanced_orders`: each arm follows each other arm equally
often) so a passing load, and what one arm leaves behind for the next, touches them alike:

    plain      draft_length="off": batched plain decoding, one packed forward per token for the whole batch
    tree       the app's default draft (`--tree`, eagle+lookup-tree k 12), each sequence drafting as it would alone
    chain      a chain (`--chain`, eagle+lookup k 3), likewise
    adaptive   the default draft with draft_length="adaptive": drafts sized per round from the measured cost of a
               packed forward (BatchCosts.measure, timed once before the arms) and each sequence's acceptance
    lone       at B = 1 only: today's single-sequence engine (SpeculativeDecoder.generate) with the default draft

Each arm reports batch tokens per second (all sequences' tokens over the wall time of the whole batch, prefill
included), decode tokens per second (the same tokens over that time less the prompts' prefill forwards: what a
batch's decoding rounds deliver, the figure batching changes), the median sequence's latency, tokens per target
forward (a weight read) and the speedup over plain decoding at the same batch size: of the medians, and its range
over the passes, each pass's run against the same pass's plain run (a shared host's memory speed drifts; these
ratios show by how much the comparison moved). Every arm's tokens are checked equal to the plain arm's (greedy
identity).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

import spec_engine as se
from spec_engine.bench_hf import encode, load_prompts, select_prompts
from spec_engine.core.batch import BatchCosts, BatchDecoder, Request
from spec_engine.models.presets import default_model_name

ARMS = ("plain", "tree", "chain", "adaptive")
PUBLISHED = "EAGLE-3 on SGLang, H100, Llama-3.1-8B, MT-bench (EAGLE-3 paper, Table 3): 2.36x at batch 1, 1.62x at 8, " \
            "1.32x at 32"


def run_arm(target, prompts: list[torch.Tensor], arm: str, args, costs: BatchCosts) -> dict:
    greedy = se.SamplingParams(0.0)
    spec = {"plain": args.tree, "tree": args.tree, "chain": args.chain, "adaptive": args.tree}[arm]
    draft, k = spec.rsplit("@", 1) if "@" in spec else (spec, "4")
    mode = {"plain": "off", "tree": "fixed", "chain": "fixed", "adaptive": "adaptive"}[arm]
    batch = BatchDecoder(target.model, draft_length=mode, costs=costs)
    requests = [Request(i, ids, se.make_drafter(draft, target), k=int(k), max_new_tokens=args.tokens,
                        sampling=greedy, eos_token_id=None) for i, ids in enumerate(prompts)]
    start = time.perf_counter()
    forwards, caps = 0, []
    for request in requests:
        batch.add(request)
    while batch.active:
        events = batch.step()
        forwards += 1
        caps += [e.draft_cap for e in events]
    seconds = time.perf_counter() - start
    results = {request.id: batch.finished.pop(request.id) for request in requests}
    tokens = sum(len(r.tokens) for r in results.values())
    prefill = sum(r.prefill_seconds for r in results.values())     # prompt chunks go one at a time, between rounds
    return {"arm": arm, "batch": len(prompts), "seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds,
            "prefill_s": prefill, "decode_tok_s": tokens / (seconds - prefill),
            "latency_s": statistics.median(r.total_seconds for r in results.values()),
            "tokens_per_forward": tokens / forwards, "mean_cap": statistics.fmean(caps) if caps else 0.0,
            "texts": [results[i].tokens for i in range(len(prompts))]}


def run_lone(target, ids: torch.Tensor, args) -> dict:
    draft, k = args.tree.rsplit("@", 1) if "@" in args.tree else (args.tree, "4")
    decoder = se.SpeculativeDecoder(target.model, se.make_drafter(draft, target))
    start = time.perf_counter()
    result = decoder.generate(ids, k=int(k), max_new_tokens=args.tokens, sampling=se.SamplingParams(0.0),
                              eos_token_id=None)
    seconds = time.perf_counter() - start
    return {"arm": "lone", "batch": 1, "seconds": seconds, "tokens": len(result.tokens),
            "tok_s": len(result.tokens) / seconds, "latency_s": seconds, "prefill_s": result.prefill_seconds,
            "decode_tok_s": len(result.tokens) / (seconds - result.prefill_seconds),
            "tokens_per_forward": len(result.tokens) / max(1, len(result.rounds)), "mean_cap": float(k),
            "texts": [result.tokens]}


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n arms in which each arm follows every other arm equally often (a Williams design: n orders for even
    n, 2n for odd). Why: an arm timed right after a drafting arm runs slower (5-15% at every batch size, see main),
    and in the rotation used before, the adaptive arm always followed the chain arm and plain decoding always
    followed the adaptive arm: at batch 16, where the adaptive arm drafted nothing and ran plain decoding's forwards,
    it read x0.89-0.94 of plain decoding in the benchmark against x1.02 alternating with plain decoding alone."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(arm + i) % n for arm in first] for i in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def merged(runs: list[dict]) -> list[dict]:
    """One row per (batch, arm): the median run's figures over the repeats, with the range of batch tok/s and of the
    speedup over plain decoding within each pass (the arms of a pass run minutes apart at most, so these ratios
    show how far a host's drift moves the comparison)."""
    groups: dict[tuple, list[dict]] = {}
    plain = {(r["batch"], r.get("pass")): r["tok_s"] for r in runs if r["arm"] == "plain"}
    for r in runs:
        groups.setdefault((r["batch"], r["arm"]), []).append(r)
    rows = []
    for (batch, arm), group in groups.items():
        row = dict(group[0])
        for key in ("seconds", "tok_s", "decode_tok_s", "latency_s", "prefill_s", "tokens_per_forward", "mean_cap"):
            row[key] = statistics.median(r[key] for r in group)
        row["low"], row["high"], row["runs"] = min(r["tok_s"] for r in group), max(r["tok_s"] for r in group), \
            len(group)
        row.pop("pass", None)
        row["identical"] = all(r["identical"] for r in group)
        ratios = [r["tok_s"] / plain[r["batch"], r.get("pass")] for r in group if (r["batch"], r.get("pass")) in plain]
        row["pass_low"], row["pass_high"] = (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["batch"], (ARMS + ("lone",)).index(r["arm"])))


def table(rows: list[dict]) -> str:
    plain = {r["batch"]: r for r in rows if r["arm"] == "plain"}
    base = plain.get(1) or plain[min(plain)]            # batch 1 when measured, else the smallest batch
    lines = ["| batch | arm | batch tok/s (min-max) | decode tok/s | x plain (same batch) "
             "| x plain in each pass (min-max) | x plain batch 1 (decode) "
             "| median latency s | tokens / forward | mean draft cap | identical to plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['arm']} | {r['tok_s']:.1f} ({r['low']:.1f}-{r['high']:.1f}) | "
                     f"{r['decode_tok_s']:.1f} | "
                     f"{r['tok_s'] / plain[r['batch']]['tok_s']:.2f} | {r['pass_low']:.2f}-{r['pass_high']:.2f} | "
                     f"{r['decode_tok_s'] / base['decode_tok_s']:.2f} | {r['latency_s']:.2f} | "
                     f"{r['tokens_per_forward']:.2f} | {r['mean_cap']:.1f} | {r['identical']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m spec_engine.bench_batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tree", default="eagle+lookup-tree@12", help="the default draft, NAME@k")
    parser.add_argument("--chain", default="eagle+lookup@3", help="the chain arm's draft, NAME@k")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--repeats", type=int, default=1, help="passes over every batch and arm (medians reported)")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = os.getloadavg()
    target = se.load_model(default_model_name())
    se.prepare(target.model)
    held = select_prompts(load_prompts(), "held-out")
    ids = [encode(target, p) for p in held]
    if max(args.batches) > len(ids):
        raise SystemExit(f"--batches: at most {len(ids)} held-out prompts")
    costs = BatchCosts.measure(target.model) if "adaptive" in args.arms else None
    warm = argparse.Namespace(**{**vars(args), "tokens": 8})
    for arm in args.arms:                              # builds, packs and first-use costs, before anything is timed
        run_arm(target, ids[:2], arm, warm, costs)
    run_lone(target, ids[0], warm)
    runs = []
    orders = balanced_orders(len(args.arms))
    for repeat in range(args.repeats):
        for turn, size in enumerate(args.batches):
            for arm in [args.arms[i] for i in orders[(turn + repeat) % len(orders)]]:
                gc.collect()            # the last arm's drafters and caches go before this one is timed
                # ...and the arm runs 8 tokens untimed first, so every timed run follows a run of its own arm: an arm
                # timed right after a drafting arm ran 5-15% slower at every batch size.
                run_arm(target, ids[:size], arm, warm, costs)
                runs.append({**run_arm(target, ids[:size], arm, args, costs), "pass": repeat})
                print(f"batch {size} {arm}: {runs[-1]['tok_s']:.1f} tok/s", flush=True)
            if size == 1:
                runs.append({**run_lone(target, ids[0], args), "pass": repeat})
    reference = {r["batch"]: r["texts"] for r in runs if r["arm"] == "plain"}
    for r in runs:
        r["identical"] = r["texts"] == reference.get(r["batch"], r["texts"])
    rows = merged(runs)
    load = os.getloadavg()
    header = (f"python -m spec_engine.bench_batch --threads {args.threads} "
              f"--batches {' '.join(map(str, args.batches))} "
              f"--tokens {args.tokens} --tree {args.tree} --chain {args.chain} --arms {' '.join(args.arms)} "
              f"--repeats {args.repeats}\n\n"
              f"load average (1 min) before/after: "
              f"{before[0]:.2f} / {load[0]:.2f}; {torch.get_num_threads()} threads; "
              f"speed layer {se.speed_layer()}\n\n"
              + (f"The adaptive arm's packed-forward costs, measured once before the arms: {costs.summary()}\n\n"
                 if costs else "")
              + "Published: "
              f"{PUBLISHED}\n\n")
    text = header + table(rows)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n")
        Path(args.out + ".json").write_text(json.dumps([{k: v for k, v in r.items() if k != "texts"} for r in rows],
                                                       indent=1))


if __name__ == "__main__":
    main()
