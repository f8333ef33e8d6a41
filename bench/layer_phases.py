"""Where a compiled forward's time goes, phase by phase, for one row and for a token tree of more: the shipped
csrc/lean_layers.cpp (or another revision's, `--against`) built once more with time-stamp counter reads between its
phases (inserted into a copy of the source at fixed lines; the build fails loudly if one of them moved), on the
offline default, interleaved in one process, medians over repeats.

    python -m bench.layer_phases --threads 2 --context 200 --rows 8 --repeats 30 \\
        --out bench/results/layer-phases-2threads

Each layer's phases in the order the source runs them (norm, q|k|v product, rotary and cache append, attention,
o product, residual and second norm, gate|up product, SiLU, down product, residual), summed over the layers; the
attention's own parts (scores, the softmax with the visible-position list, the weighted values, the last sums) are
thread time, both threads added. The final norm, the LM head and the Python around the call are the rest of the
forward's wall time. A forward whose one-row step ran faster than `--fast-below` ms counts as one in the host's fast
memory state (docs/benchmarks.md): the table gives both states where both occurred.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.native_layers import bushy_tree, sources_at
from spec_engine.accel import blocked_gemm, native_layers
from spec_engine.core import speed
from spec_engine.core.cache import forward_logits, forward_tree_logits, new_cache, prefill, trim_cache
from spec_engine.models import DEFAULT_MODEL, load_model

CSRC = Path(__file__).resolve().parents[1] / "spec_engine" / "accel" / "csrc"
FEATURES = (2, 15, 27, -1)
PHASES = ("norm", "q|k|v", "rotary + cache", "attention", "o", "residual + norm", "gate|up", "SiLU", "down", "residual")
PARTS = ("scores", "softmax", "weighted values", "last sums")
CLOCKS = r'''#include <x86intrin.h>
static double PHASE[16], PART[64][4];
extern "C" unsigned long long phase_clock() { return __rdtsc(); }
extern "C" void phase_times(double* out) {
  for (int i = 0; i < 16; i++) out[i] = PHASE[i], PHASE[i] = 0;
  for (int i = 0; i < 4; i++) {
    out[16 + i] = 0;
    for (int t = 0; t < 64; t++) out[16 + i] += PART[t][i], PART[t][i] = 0;
  }
}
#define TICK(i) { const unsigned long long now_ = __rdtsc(); PHASE[i] += (double)(now_ - last_); last_ = now_; }
#define PART_TICK(i) { const unsigned long long now_ = __rdtsc(); \
  PART[thread_ & 63][i] += (double)(now_ - part_); part_ = now_; }
'''
# (anchor, what replaces it): each anchor must occur exactly once in the source.
PROBES = [
    ("#include <vector>\n", "#include <vector>\n" + CLOCKS),
    ("  const int room = (L + 15) / 16 * 16;\n", "  const int room = (L + 15) / 16 * 16;\n"
     "  const int thread_ = omp_get_thread_num();\n  unsigned long long part_ = __rdtsc();\n"),
    ("  int longest = 0;\n", "  PART_TICK(0)\n  int longest = 0;\n"),
    ("  for (int i0 = 0; i0 < longest; i0 += KEY_CHUNK)\n",
     "  PART_TICK(1)\n  for (int i0 = 0; i0 < longest; i0 += KEY_CHUNK)\n"),
    ("  for (int u = 0; u < count; u++) {     // an odd list",
     "  PART_TICK(2)\n  for (int u = 0; u < count; u++) {     // an odd list"),
    ("VLOAD(odd + d)), inv));\n  }\n", "VLOAD(odd + d)), inv));\n  }\n  PART_TICK(3)\n"),
    ("  for (int l = 0; l < n_layers; l++) {\n",
     "  unsigned long long last_ = __rdtsc();\n  for (int l = 0; l < n_layers; l++) {\n"),
    ("    rms_norm(hidden, layer.input_norm, normed.data(), n, H, eps);\n",
     "    rms_norm(hidden, layer.input_norm, normed.data(), n, H, eps);\n    TICK(0)\n"),
    ("qkv.data(), n, H, qkv_width, threads);\n", "qkv.data(), n, H, qkv_width, threads);\n    TICK(1)\n"),
    ("#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && Hkv * slices > 1)\n",
     "    TICK(2)\n"
     "#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && Hkv * slices > 1)\n"),
    ("    product(layer, attended.data(), layer.o,", "    TICK(3)\n    product(layer, attended.data(), layer.o,"),
    ("delta.data(), n, Hq * D, H, threads);\n", "delta.data(), n, Hq * D, H, threads);\n    TICK(4)\n"),
    ("    product(layer, normed.data(), layer.gate_up,",
     "    TICK(5)\n    product(layer, normed.data(), layer.gate_up,"),
    ("gate_up.data(), n, H, 2 * I, threads);\n", "gate_up.data(), n, H, 2 * I, threads);\n    TICK(6)\n"),
    ("    product(layer, act.data(), layer.down,", "    TICK(7)\n    product(layer, act.data(), layer.down,"),
    ("delta.data(), n, I, H, threads);\n", "delta.data(), n, I, H, threads);\n    TICK(8)\n"),
    ("hidden[i] += delta[i];\n  }\n}", "hidden[i] += delta[i];\n    TICK(9)\n  }\n}"),
]


def instrumented(source: str) -> str:
    """`source` (lean_layers.cpp) with the clock reads of PROBES; ValueError naming an anchor that is not there
    exactly once."""
    for anchor, replacement in PROBES:
        if source.count(anchor) != 1:
            raise ValueError(f"lean_layers.cpp changed: {anchor.strip()[:60]!r} is there {source.count(anchor)} times")
        source = source.replace(anchor, replacement)
    return source


def build(revision: str | None, isa: str):
    """The compiled layers of this checkout (None) or of `revision` (bench.native_layers.sources_at), instrumented."""
    if revision is None:
        folder = Path(tempfile.mkdtemp(prefix="layer-phases-"))
        for name in ("lean_layers.cpp", "blocked_gemm.cpp"):
            shutil.copy(CSRC / name, folder / name)
    else:
        folder = sources_at(revision)
    source = folder / "lean_layers.cpp"
    source.write_text(instrumented(source.read_text()))
    library = native_layers.build(isa, source, folder / "blocked_gemm.cpp",
                                  name=f"lean_layers-phases-{revision or 'here'}")
    library.phase_times.argtypes = [ctypes.c_void_p]
    library.phase_clock.restype = ctypes.c_ulonglong
    return library


def ticks_per_ms(library) -> float:
    start, clock = library.phase_clock(), time.perf_counter()
    time.sleep(0.2)
    return (library.phase_clock() - start) / ((time.perf_counter() - clock) * 1e3)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rows", type=int, default=8, help="a tree of this many rows (the root and rows - 1 nodes)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--against", default=None, metavar="REV", help="also time REV's lean_layers.cpp, interleaved")
    parser.add_argument("--fast-below", type=float, default=8.5, help="one-row wall ms below which a pass is fast")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_model(DEFAULT_MODEL, "cpu", "float32")
    model = engine.model
    speed.active().warm(model)
    isa = blocked_gemm.kernel().isa
    sides = {"this checkout": build(None, isa)}
    if args.against:
        sides[f"at {args.against}"] = build(args.against, isa)
    ids = torch.randint(0, model.config.vocab_size, (args.context + args.rows,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    cache = new_cache(model)
    prefill(model, ids[:args.context], cache, FEATURES)
    parents, depths = bushy_tree(args.rows)

    def forward(rows: int) -> None:
        if rows == 1:
            forward_logits(model, ids[args.context:args.context + 1], cache, 1, FEATURES)
        else:
            forward_tree_logits(model, ids[args.context], ids[args.context + 1:args.context + rows], parents, depths,
                                cache, FEATURES)
        trim_cache(cache, args.context)

    load_before = os.getloadavg()
    passes = timed_passes(sides, isa, forward, args)
    lines = [f"`python -m bench.layer_phases {' '.join(argv)}`".replace(" `", "`"),
             f"{engine.name} fp32, {args.threads} threads, {args.context} cached tokens, one row against a tree of "
             f"{args.rows} rows, medians of {args.repeats} interleaved passes; load average {load_before[0]:.2f} "
             f"before, {os.getloadavg()[0]:.2f} after. Milliseconds per forward, layers summed."]
    summary = state_tables(passes, list(sides), args, lines)
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out + ".md").write_text(report + "\n", encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps({"command": lines[0].strip("`"), "args": vars(args),
                                                        "load before": load_before, "states": summary}, indent=1)
                                            + "\n", encoding="utf-8")


def timed_passes(sides: dict, isa: str, forward, args: argparse.Namespace) -> list[dict]:
    """Per pass, (side, rows) -> [wall ms, then each phase timer in ms]: the sides' libraries swapped in turn,
    their order alternating between passes; the first pass (a warm-up) dropped."""
    scale = ticks_per_ms(sides["this checkout"])
    shipped, times = native_layers._BUILT[isa], (ctypes.c_double * 20)()
    passes: list[dict] = []
    try:
        for repeat in range(args.repeats + 1):
            found = {}
            for side in list(sides)[::1 if repeat % 2 else -1]:
                native_layers._BUILT[isa] = sides[side]
                for rows in (1, args.rows):
                    sides[side].phase_times(times)
                    start = time.perf_counter()
                    forward(rows)
                    wall = (time.perf_counter() - start) * 1e3
                    sides[side].phase_times(times)
                    found[side, rows] = [wall] + [t / scale for t in times]
            if repeat:                  # the first pass warms up
                passes.append(found)
    finally:
        native_layers._BUILT[isa] = shipped
    return passes


def state_tables(passes: list[dict], sides: list[str], args: argparse.Namespace, lines: list[str]) -> dict:
    """One table of median phase times per memory state (fast or slow one-row passes), appended to `lines`;
    returns the same numbers by state."""
    names = ["forward (wall)", *PHASES, "the rest (final norm, LM head, Python)",
             *(f"attention: {p} (thread ms)" for p in PARTS)]
    summary = {}
    first = sides[0]
    for state, chosen in (("fast", lambda p: p[first, 1][0] < args.fast_below),
                          ("slow", lambda p: p[first, 1][0] >= args.fast_below)):
        group = [p for p in passes if chosen(p)]
        if not group:
            continue
        header = " | ".join(f"{side}: 1 row | {side}: {args.rows} rows" for side in sides)
        lines += ["", f"{state.capitalize()} memory state ({len(group)} passes, one-row wall "
                  f"{'below' if state == 'fast' else 'at or above'} {args.fast_below} ms):", "",
                  f"| phase | {header} |", "|---" * (1 + 2 * len(sides)) + "|"]
        table = {}
        for side in sides:
            for rows in (1, args.rows):
                values = [[p[side, rows][i] for p in group] for i in range(21)]
                medians = [statistics.median(v) for v in values]
                rest = medians[0] - sum(medians[1:11])
                table[side, rows] = medians[:11] + [rest] + medians[17:21]
        for i, name in enumerate(names):
            lines.append(f"| {name} | " + " | ".join(f"{table[side, rows][i]:.3f}" for side in sides
                                                      for rows in (1, args.rows)) + " |")
        summary[state] = {f"{side} / {rows}": dict(zip(names, table[side, rows])) for side in sides
                          for rows in (1, args.rows)}
    return summary


if __name__ == "__main__":
    main()
