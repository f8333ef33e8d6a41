"""Where a batched round's time goes, by arm and batch size: what limits speculation inside a batch here.

    python -m bench.batch_round_phases --batches 2 4 8 --repeats 2

Per batch size, on the held-out prompts, greedy, 64 tokens: plain batched decoding, the chain arm and the adaptive
length (spec_engine.bench_batch's arms, each run untimed for 8 tokens first), with the EAGLE heads' catch-ups batched
(drafting.catching_up_together, as shipped) and one per sequence (its registrations emptied), the variants
interleaved in one process. For each: decode tok/s (prefill excluded), tokens per round, mean draft cap, and the
round's seconds split into the packed target forward, the prompts' prefill chunks, planning (drafting), the drafters'
catch-up and settling (verification, commit, trim).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import spec_engine as se
from spec_engine.bench_batch import encode, load_prompts, run_arm, select_prompts
from spec_engine.core import batch as batch_module
from spec_engine.core import drafting
from spec_engine.core.decoder import SpeculativeDecoder
from spec_engine.models.presets import default_model_name

PHASES = {"forward": (batch_module, "forward_packed"), "prefill": (batch_module, "one_forward"),
          "plan": (SpeculativeDecoder, "plan"), "catch-up": (batch_module.BatchDecoder, "catch_up"),
          "settle": (SpeculativeDecoder, "settle"), "round": (batch_module.BatchDecoder, "step")}


def clocked(spent: dict) -> None:
    """Wrap each phase's function so that its seconds add up in spent[phase] (and its calls in spent[phase, 'n'])."""
    for phase, (owner, name) in PHASES.items():
        original = getattr(owner, name)

        def timed(*args, _original=original, _phase=phase, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_phase] = spent.get(_phase, 0.0) + time.perf_counter() - start
                spent[_phase, "n"] = spent.get((_phase, "n"), 0) + 1
        setattr(owner, name, timed)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_round_phases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = se.load_model(default_model_name())
    se.prepare(target.model)
    ids = [encode(target, p) for p in select_prompts(load_prompts(), "held-out")]
    costs = batch_module.BatchCosts.measure(target.model)
    arm_args = argparse.Namespace(tree="eagle+lookup-tree@12", chain="eagle+lookup@3", tokens=args.tokens)
    warm = argparse.Namespace(**{**vars(arm_args), "tokens": 8})
    shipped = list(drafting.TOGETHER)
    variants = [("plain", True), ("chain", True), ("chain", False), ("adaptive", True), ("adaptive", False)]
    spent: dict = {}
    clocked(spent)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    print("| batch | arm | catch-ups | decode tok/s | tokens/round | mean cap | forward | prefill | plan | catch-up "
          "| settle | catch-up ms/round |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for batch in args.batches:
        runs: dict = {}
        for repeat in range(args.repeats):
            shift = repeat % len(variants)
            for arm, together in variants[shift:] + variants[:shift]:
                drafting.TOGETHER[:] = shipped if together else []
                run_arm(target, ids[:batch], arm, warm, costs)
                spent.clear()
                out = run_arm(target, ids[:batch], arm, arm_args, costs)
                runs.setdefault((arm, together), []).append((out, dict(spent)))
        drafting.TOGETHER[:] = shipped
        for arm, together in variants:
            outs = runs[(arm, together)]
            share = {phase: statistics.median(s.get(phase, 0.0) / s["round"] for _, s in outs)
                     for phase in PHASES if phase != "round"}
            catch = statistics.median(1000 * s.get("catch-up", 0.0) / s["round", "n"] for _, s in outs)
            print(f"| {batch} | {arm} | {'one forward' if together else 'per sequence'} | "
                  f"{statistics.median(o['decode_tok_s'] for o, _ in outs):.0f} | "
                  f"{statistics.median(o['tokens_per_forward'] for o, _ in outs):.2f} | "
                  f"{statistics.fmean(o['mean_cap'] for o, _ in outs):.2f} | "
                  + " | ".join(f"{100 * share[p]:.0f}%" for p in ("forward", "prefill", "plan", "catch-up", "settle"))
                  + f" | {catch:.2f} |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
