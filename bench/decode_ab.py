"""Whole decodes with this checkout's compiled kernels against another revision's, interleaved in one process: what
a kernel change does to plain decoding, to speculative decoding and to their ratio, where a change that forwards
alone do not show (where a forward leaves the caches, say) acts on everything around them.

    python -m bench.decode_ab --against ae936f7 --repeats 5 --out bench/results/decode-ab-nta-2threads

Both sides build their csrc/blocked_gemm.cpp and csrc/lean_layers.cpp (the other side's from `git show REV:`, as
`bench.native_layers --against` builds them), and
each prompt runs on one side and then on the other, seconds apart (the order alternating by prompt and repeat),
speculative decoding then plain decoding, greedy, checked token-identical; the first repeat warms up and is dropped.
Alternated repeat by repeat instead (a minute apart), two runs of one comparison
(the cache bookkeeping of 03918df, in a scratch script) read its speculative side 14% faster and 6% slower; prompt by
prompt, 2.4% and 2.1% faster (2026-12-04; results made before then alternated repeat by repeat). Ratios are
taken per prompt and repeat on one side (the two runs seconds apart), then their geometric mean. Also timed: the
EAGLE head's catch-up (EagleDrafter._feed) per round. A single process alternating sides is the only comparison that
holds on a shared host whose memory speed drifts by a quarter from one half-hour to the next (docs/benchmarks.md).

The prompts are the six-kind set's tuning part: from each kind the prompts after the first five, which the issue's
benchmark (`bench_hf --per-kind 5`) measures; `--first` and `--per-kind` choose others. `--neighbour MB` runs a
process beside the measurement that streams MB megabytes over and over on one thread (a neighbour on a shared host,
competing for the last-level cache and the memory's bandwidth; give the measurement `--threads 1` on a 2-core machine
so that the neighbour has a core of its own):

    python -m bench.decode_ab --against ae936f7 --repeats 3 --threads 1 --per-kind 1 --neighbour 240 \
        --out bench/results/decode-ab-nta-1thread-neighbour
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from bench.native_layers import library_at, sources_at
from spec_engine import SamplingParams, SpeculativeDecoder, autoregressive_generate
from spec_engine.accel import blocked_gemm, native, native_layers
from spec_engine.bench_hf import encode, load_prompts
from spec_engine.drafters import eagle
from spec_engine.drafters.registry import make_drafter
from spec_engine.models import DEFAULT_MODEL, load_model

ROOT = Path(__file__).resolve().parents[1]
SIX_KINDS = ROOT / "bench" / "data" / "six_kinds.json"
NEIGHBOUR = "import torch\ntorch.set_num_threads(1)\nx = torch.ones({mb} * 2 ** 18)\nwhile True:\n    x.sum()\n"


def tuning_prompts(first: int, per_kind: int) -> list:
    """The six-kind set's prompts after the first `first` of each kind (the issue's benchmark measures the first
    five), `per_kind` of each."""
    kinds: dict[str, list] = defaultdict(list)
    for prompt in load_prompts(SIX_KINDS):
        if prompt.set == "held-out":
            kinds[prompt.kind].append(prompt)
    return [p for ps in kinds.values() for p in ps[first:first + per_kind]]


def kernels_at(revision: str, isa: str):
    """(compiled layers, blocked kernel) built from `revision`'s two sources, beside the shipped builds: the
    layers as bench.native_layers --against builds them, and the standalone kernel the LM head's product runs."""
    folder = sources_at(revision)
    flags = [*blocked_gemm.BUILD_FLAGS, *blocked_gemm.ISA_FLAGS[isa]]
    gemm = blocked_gemm.load(native.compile_library(folder / "blocked_gemm.cpp", f"blocked_gemm-ab-{isa}", flags), isa)
    return library_at(revision, folder), gemm


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, metavar="REV")
    parser.add_argument("--draft", default="eagle+lookup-tree")
    parser.add_argument("--k", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--first", type=int, default=5, help="skip this many prompts of each kind")
    parser.add_argument("--per-kind", type=int, default=2)
    parser.add_argument("--neighbour", type=int, default=0, metavar="MB", help="stream MB megabytes beside the runs")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_model(DEFAULT_MODEL, "cpu", "float32")
    isa = blocked_gemm.kernel().isa
    sides = {"this checkout": (native_layers.library(), blocked_gemm.kernel()),
             f"at {args.against}": kernels_at(args.against, isa)}

    def use(side):
        native_layers._BUILT[isa] = sides[side][0]
        blocked_gemm._BUILT[None] = blocked_gemm._BUILT[isa] = sides[side][1]

    prompts = tuning_prompts(args.first, args.per_kind)
    ids = [encode(engine, p) for p in prompts]
    totals, load_before = measure(engine, ids, list(sides), use, args)
    lines = [f"`python -m bench.decode_ab {' '.join(argv)}`".replace(" `", "`"),
             f"{engine.name} fp32, {args.threads} threads, {len(prompts)} prompts ({args.per_kind} of each kind after "
             f"the first {args.first}), {args.draft} at k = {args.k}, greedy, {args.tokens} tokens, "
             f"{args.repeats - 1} measured repeats; load average {load_before[0]:.2f} before, "
             f"{os.getloadavg()[0]:.2f} after"
             + (f", a neighbour streaming {args.neighbour} MB on one thread throughout" if args.neighbour else "")
             + ". Every run gave plain decoding's tokens.", "",
             "| kernels | speculative s | plain s | speedup (geometric mean) | head catch-up ms a round |",
             "|---|---|---|---|---|"]
    summary = summarise(totals, list(sides), lines)
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out + ".md").write_text(report + "\n", encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps({"command": lines[0].strip("`"), "args": vars(args),
                                                        "sides": summary}, indent=1) + "\n", encoding="utf-8")


def measure(engine, ids: list, sides: list[str], use, args: argparse.Namespace) -> tuple[tuple, tuple]:
    """Speculative then plain decoding of every prompt, the sides' kernels in turn (their order alternating), the
    first repeat a warm-up; the EAGLE head's catch-up timed by wrapping its `_feed`. Returns (ratios, seconds,
    rounds, catch-up seconds) by side, and the load average before the runs."""
    greedy = SamplingParams(temperature=0.0)
    feed, now = eagle.EagleDrafter._feed, {"side": None}
    catch_up: Counter = Counter()

    def timed_feed(self, committed, features):
        start = time.perf_counter()
        try:
            return feed(self, committed, features)
        finally:
            catch_up[now["side"]] += time.perf_counter() - start

    eagle.EagleDrafter._feed = timed_feed
    ratios, seconds, rounds = defaultdict(list), Counter(), Counter()
    neighbour = (subprocess.Popen([sys.executable, "-c", NEIGHBOUR.format(mb=args.neighbour)]) if args.neighbour
                 else None)
    load_before = os.getloadavg()
    try:
        for repeat in range(args.repeats):
            for index, x in enumerate(ids):
                for side in sides[::1 if (repeat + index) % 2 else -1]:
                    use(side)
                    now["side"] = side if repeat else None
                    start = time.perf_counter()
                    result = SpeculativeDecoder(engine.model, make_drafter(args.draft, engine, None)).generate(
                        x, k=args.k, max_new_tokens=args.tokens, sampling=greedy, display=False)
                    middle = time.perf_counter()
                    plain = autoregressive_generate(engine.model, x, max_new_tokens=args.tokens, sampling=greedy)
                    end = time.perf_counter()
                    assert result.tokens == plain.tokens, "speculative decoding left plain decoding's tokens"
                    if repeat:
                        ratios[side].append((end - middle) / (middle - start))
                        seconds[side, "speculative"] += middle - start
                        seconds[side, "plain"] += end - middle
                        rounds[side] += len(result.rounds)
    finally:
        eagle.EagleDrafter._feed = feed
        use("this checkout")
        if neighbour is not None:
            neighbour.kill()
    return (ratios, seconds, rounds, catch_up), load_before


def summarise(totals: tuple, sides: list[str], lines: list[str]) -> dict:
    """Each side's totals, speedup and catch-up per round: a table row appended to `lines`, and by side."""
    ratios, seconds, rounds, catch_up = totals
    summary = {}
    for side in sides:
        summary[side] = {"speculative_s": seconds[side, "speculative"], "plain_s": seconds[side, "plain"],
                         "speedup": statistics.geometric_mean(ratios[side]),
                         "catch_up_ms_per_round": 1e3 * catch_up[side] / rounds[side]}
        s = summary[side]
        lines.append(f"| {side} | {s['speculative_s']:.2f} | {s['plain_s']:.2f} | {s['speedup']:.3f}x | "
                     f"{s['catch_up_ms_per_round']:.3f} |")
    return summary


if __name__ == "__main__":
    main()
