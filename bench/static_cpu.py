"""The static KV cache path (spec_engine/core/static_cache.py) against the hand-written CPU layer, interleaved in one
process on the same prompts: SmolLM2-135M-Instruct fp32, greedy plain decoding, torch threads as given (2 by default).

    PYTHONPATH=. .venv/bin/python -m bench.static_cpu --tokens 32 --repeats 2 [--compile] [--out bench/results/NAME]
    PYTHONPATH=. .venv/bin/python -m bench.static_cpu --threads 1 --profile    # where a fixed step's time goes

Arms, in turn prompt by prompt (the order alternating by repeat), every arm's tokens checked identical to the CPU
layer's: `cpu` (the default path: accel's speed layer, its compiled C++ layers and growing caches), `static` (the
core's device-generic forward over StaticLayer caches, each forward at its own width), `fixed` (the same with every
forward of at most 32 rows padded to its bucket and attending over the whole capacity under a mask, eager) and, with
--compile, `fixed+inductor` (that fixed-shape step under torch.compile, inductor, fullgraph, dynamic=False: one graph
per bucket). The static arms run a second copy of the model that the CPU layer did not adopt (its packed linears read
a context variable that dynamo cannot trace). The first repeat warms up (and compiles) and is dropped. Prints tokens/s
per arm (median over prompts and repeats), each arm's ratio to `cpu`, the share of a fixed arm's time spent inside
its forward step, and the host's load (os.getloadavg) before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import spec_engine as se
from spec_engine.core import speed, static_cache

PROMPTS = ["Write a Python function that returns the factorial of n.",
           "Explain in a few sentences why the sky is blue.",
           "Give me three tips for learning a new language, one short sentence each."]
ARMS = {"static": {}, "fixed": {"fixed": True}, "fixed+inductor": {"fixed": True, "compile_cpu": True}}


class StepClock:
    """Wraps a fixed-shape runner (core/captured.py), adding up the seconds spent inside it."""

    def __init__(self, runner):
        self.runner, self.seconds = runner, 0.0

    def __call__(self, *args):
        start = time.perf_counter()
        out = self.runner(*args)
        self.seconds += time.perf_counter() - start
        return out


def load_models():
    """(the model as the CPU layer adopted it, a stock copy for the static arms)."""
    adopted = se.load_model("smollm2-135m-instruct", device="cpu", dtype="float32")
    previous = speed.install(speed.SpeedLayer())
    try:
        stock = se.load_model("smollm2-135m-instruct", device="cpu", dtype="float32").model
    finally:
        speed.install(previous)
    return adopted, stock


def profile_steps(stock, capacity: int, steps: int = 5) -> None:
    """Where a fixed-shape decode step's time goes (torch.profiler, ops by self CPU time), eager and under inductor:
    `steps` one-token forwards after a 60-token context, after three warm-up (and compiling) ones."""
    from torch.profiler import ProfilerActivity, profile

    from spec_engine.core.cache import forward_logits, new_cache
    for compile_cpu in (False, True):
        with static_cache.use(capacity, fixed=True, compile_cpu=compile_cpu):
            cache = new_cache(stock)
            forward_logits(stock, list(range(100, 160)), cache, 1)
            for _ in range(3):
                forward_logits(stock, [5], cache, 1)
                cache.crop(-1)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                for _ in range(steps):
                    forward_logits(stock, [5], cache, 1)
                    cache.crop(-1)
                seconds = time.perf_counter() - start
        print(f"fixed{'+inductor' if compile_cpu else ''}: {seconds / steps * 1e3:.1f} ms a step (profiled)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6, max_name_column_width=44))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="add the fixed-shape path under inductor")
    parser.add_argument("--capacity", type=int, default=512, help="static cache positions (a fixed forward attends "
                        "over all of them)")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    parser.add_argument("--profile", action="store_true", help="only profile the fixed-shape steps, eager and inductor")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the first warms up and is dropped)")
    torch.set_num_threads(args.threads)
    loaded, stock = load_models()
    if args.profile:
        return profile_steps(stock, args.capacity)
    cpu_layer = speed.active()
    arms = ["cpu", "static", "fixed"] + (["fixed+inductor"] if args.compile else [])
    layers = {arm: static_cache.StaticSpeedLayer(args.capacity, **ARMS[arm]) for arm in arms if arm != "cpu"}
    clocks = {}
    for arm, layer in layers.items():
        if layer.fixed:
            clocks[arm] = StepClock(layer.runner(torch.device("cpu")))
            layer.runners["cpu"] = clocks[arm]

    def run(arm: str, ids):
        greedy = se.SamplingParams(0.0)
        if arm == "cpu":
            return se.autoregressive_generate(loaded.model, ids, max_new_tokens=args.tokens, sampling=greedy)
        previous = speed.install(layers[arm])
        try:
            return se.autoregressive_generate(stock, ids, max_new_tokens=args.tokens, sampling=greedy)
        finally:
            speed.install(previous)

    encoded = [loaded.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                    return_tensors="pt") for p in PROMPTS]
    encoded = [e["input_ids"] if hasattr(e, "keys") else e for e in encoded]
    load_before = os.getloadavg()
    print(f"load before: {load_before}  threads {args.threads}  cpu layer: {cpu_layer.name}", flush=True)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    timed = {arm: 0.0 for arm in arms}
    for repeat in range(args.repeats):
        order = arms if repeat % 2 == 0 else arms[::-1]
        for clock in clocks.values():
            clock.seconds = 0.0                 # step time of the kept repeats only
        for index, ids in enumerate(encoded):
            reference = None
            for arm in order:
                start = time.perf_counter()
                result = run(arm, ids)
                seconds = time.perf_counter() - start
                if reference is None:
                    reference = result.tokens
                elif result.tokens != reference:
                    raise SystemExit(f"{arm} gave other tokens than {order[0]} on prompt {PROMPTS[index]!r}")
                if repeat:
                    rates[arm].append(len(result.tokens) / seconds)
                    timed[arm] += seconds
        print(f"repeat {repeat} done", flush=True)
    load_after = os.getloadavg()
    print(f"load after: {load_after}")
    report(args, arms, rates, timed, clocks, {"load_before": load_before, "load_after": load_after}, cpu_layer.name)


def report(args, arms: list[str], rates: dict, timed: dict, clocks: dict, loads: dict, cpu_layer: str) -> None:
    """Print each arm's median rate against the CPU layer's, and with --out write OUT.json and OUT.md."""
    base = statistics.median(rates["cpu"])
    rows = []
    for arm in arms:
        rate = statistics.median(rates[arm])
        share = clocks[arm].seconds / timed[arm] if arm in clocks else None
        rows.append({"arm": arm, "tokens_per_second": rate, "vs_cpu": rate / base, "runs": len(rates[arm]),
                     "forward_step_share": share})
        print(f"{arm:16s} {rate:7.2f} tok/s (median of {len(rates[arm])})  x{rate / base:.3f} of cpu"
              + (f"  {share:.0%} of its time in the forward step" if share is not None else ""))
    if args.out:
        meta = {"command": "python -m bench.static_cpu " + " ".join(os.sys.argv[1:]), "threads": args.threads,
                "capacity": args.capacity,
                "tokens": args.tokens, "repeats": args.repeats, **loads,
                "torch": torch.__version__, "cpu_layer": cpu_layer}
        out = Path(args.out)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "arms": rows}, indent=1))
        table = ["| arm | tok/s (median) | vs cpu | time in the forward step |", "|---|---|---|---|"]
        table += [f"| {r['arm']} | {r['tokens_per_second']:.2f} | x{r['vs_cpu']:.3f} | "
                  + (f"{r['forward_step_share']:.0%}" if r["forward_step_share"] is not None else "-") + " |"
                  for r in rows]
        out.with_suffix(".md").write_text("\n".join(table) + f"\n\nSmolLM2-135M-Instruct fp32, greedy, {args.tokens} "
                                          f"tokens, three chat prompts, tokens identical across arms.\n\n"
                                          f"{json.dumps(meta)}\n")


if __name__ == "__main__":
    main()
