"""What the KV cache's bookkeeping costs around the forwards, on the offline default's cache (30 layers) after 200
cached tokens: a compiled forward's append of n positions to every layer (GrowingLayer.reserve + extend, what
accel/native_layers.py does around its one call), a round's trim back, and a tree round's keep_path with a path
that stays in place and one that moves. Medians of many repeats, microseconds; one thread of Python, no model
forward timed. Not a test: timings are its output.

    python -m bench.cache_ops --against c74e8c9 --passes 2 --out bench/results/cache-ops

`--against REV` runs this same file again on REV's engine (a temporary git worktree of REV on the path, this
file's timing code unchanged), alternating the two sides `--passes` times, so only the engine differs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("append 6 rows", "append 6 rows, trim them", "keep_path, path in place", "keep_path, path moves")


def measure(repeats: int) -> dict[str, float]:
    """Each case's median in microseconds, on this interpreter's spec_engine."""
    import torch

    from spec_engine.core import speed
    from spec_engine.core.cache import cache_len, forward_logits, keep_path, new_cache, trim_cache
    from spec_engine.models import DEFAULT_MODEL, load_model

    torch.set_num_threads(1)
    model = load_model(DEFAULT_MODEL, "cpu", "float32").model
    speed.active().warm(model)
    cache = new_cache(model)
    forward_logits(model, list(range(100, 300)), cache, 1)
    base = cache_len(cache)

    def append(rows: int) -> None:
        for layer in cache.layers:
            layer.reserve(layer.keys, rows)
            layer.extend(rows)

    cases = {CASES[0]: (lambda: append(6), lambda: trim_cache(cache, base)),
             CASES[1]: (lambda: (append(6), trim_cache(cache, base)), lambda: None),
             CASES[2]: (lambda: (append(6), keep_path(cache, base, [base, base + 1])), lambda: trim_cache(cache, base)),
             CASES[3]: (lambda: (append(6), keep_path(cache, base, [base + 2, base + 4])),
                        lambda: trim_cache(cache, base))}
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(repeats):
        for case, (timed, reset) in cases.items():
            start = time.perf_counter()
            timed()
            seconds[case].append(time.perf_counter() - start)
            reset()
    return {case: 1e6 * statistics.median(values) for case, values in seconds.items()}


def run_side(root: Path, repeats: int) -> dict[str, float]:
    """measure() in a fresh interpreter whose spec_engine is `root`'s."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, __file__, "--measure", "--repeats", str(repeats)], cwd=root, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default=None, metavar="REV")
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.repeats)))
        return
    sides = {"this checkout": ROOT}
    worktree = None
    if args.against:
        worktree = Path(tempfile.mkdtemp(prefix="cache-ops-")) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.against], cwd=ROOT, check=True,
                       capture_output=True)
        sides[f"at {args.against}"] = worktree
    load = os.getloadavg()
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    try:
        for index in range(args.passes):
            for side in list(sides)[::1 if index % 2 == 0 else -1]:
                results[side].append(run_side(sides[side], args.repeats))
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)
    table = {side: {case: statistics.median(r[case] for r in runs) for case in CASES} for side, runs in results.items()}
    lines = [f"`python -m bench.cache_ops {' '.join(argv)}`".replace(" `", "`"),
             f"smollm2-135m-instruct fp32, its KV cache after 200 tokens, one thread; medians of {args.repeats} "
             f"repeats, the median of {args.passes} passes a side (alternating); load average {load[0]:.2f} before, "
             f"{os.getloadavg()[0]:.2f} after. Microseconds.", "",
             "| case | " + " | ".join(sides) + " |", "|---|" + "---|" * len(sides)]
    lines += [f"| {case} | " + " | ".join(f"{table[side][case]:.0f}" for side in sides) + " |" for case in CASES]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n")
        Path(args.out + ".json").write_text(json.dumps({"meta": {"command": lines[0].strip("`"), "load": load},
                                                        "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
