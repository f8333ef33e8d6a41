"""The page's default run, engine alone, repeated in one process: what moves its measured speedup between runs.

    python -m bench.default_run_phases --repeats 8 --out bench/results/default-run-phases-2threads-slow-memory

The app's start-up (registry.warm_up: packing, batch costs, the verify-cost curve), then per repeat what Run does
after its live pass: the default draft's timed pass (the second pass of its decoder) and plain decoding, same prompt
(bench/data/app_default_prompt.json) and settings, greedy. Every target forward's seconds are read where the cost
curve reads them (timing.watch_forwards): per repeat, plain decoding's one-row step (median) and the verify forwards'
by row count, beside the run's rounds and speedup. No curve is corrected by these runs (se.not_observed), so each
repeat drafts by the same start-up curve and only the machine differs between them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

import spec_engine as se
from spec_engine.core import timing
from spec_engine.models.presets import default_model_name
from ui.playground import drafts, registry

PROMPT = Path(__file__).parent / "data" / "app_default_prompt.json"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.default_run_phases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=None, help="write OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = os.getloadavg()
    target = se.load_model(default_model_name())
    registry.warm_up(target, prepack=True)
    ids = target.encode_prompt(json.loads(PROMPT.read_text())["held_out"][0]["text"], chat=True)
    eos = registry.eos_ids(target)
    draft, k = drafts.default_draft(default_model_name())
    spec = drafts.split_draft(draft)[1]
    greedy = se.SamplingParams(0.0)
    forwards: list[tuple[int, float]] = []
    timing.watch_forwards(target.model, lambda rows, seconds: forwards.append((rows, seconds)))
    lines = ["| repeat | rounds | speedup | plain one-row step ms (median) | verify ms by rows (median) "
             "| verify of 5-8 rows / plain step |", "|---|---|---|---|---|---|"]
    for repeat in range(args.repeats):
        with se.not_observed(target.model):
            decoder = se.SpeculativeDecoder(target.model, drafts.build_drafter(spec, target, None,
                                                                               drafts.DraftOptions()))
            # the decoder's first pass, as Run's live pass; the second is timed
            decoder.generate(ids, k=k, max_new_tokens=args.tokens, sampling=greedy, eos_token_id=eos)
            forwards.clear()
            timed = decoder.generate(ids, k=k, max_new_tokens=args.tokens, sampling=greedy, eos_token_id=eos)
            verify = list(forwards)
            forwards.clear()
            plain = se.autoregressive_generate(target.model, ids, max_new_tokens=args.tokens, sampling=greedy,
                                               eos_token_id=eos)
            steps = [seconds for rows, seconds in forwards if rows == 1]
        speedup = (len(timed.tokens) / timed.total_seconds) / (len(plain.tokens) / plain.total_seconds)
        by_rows = {rows: 1000 * statistics.median(s for r, s in verify if r == rows)
                   for rows in sorted({r for r, _ in verify})}
        step = 1000 * statistics.median(steps)
        wide = [1000 * s for r, s in verify if 5 <= r <= 8]
        ratio = f"{statistics.median(wide) / step:.2f}" if wide else "-"
        lines.append(f"| {repeat + 1} | {len(timed.rounds)} | {speedup:.2f} | {step:.1f} | "
                     + ", ".join(f"{r}: {ms:.1f}" for r, ms in by_rows.items()) + f" | {ratio} |")
        print(lines[-1], flush=True)
    load = os.getloadavg()
    text = (f"python -m bench.default_run_phases --threads {args.threads} --repeats {args.repeats} "
            f"--tokens {args.tokens}\n\nload average (1 min) before/after: {before[0]:.2f} / {load[0]:.2f}; "
            f"speed layer {se.speed_layer()}\n\n" + "\n".join(lines))
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
