"""What the engine's forward costs with its decoder layers compiled (spec_engine/accel/native_layers.py) and with the
lean path's torch operations (SPEC_ENGINE_NATIVE_LAYERS=0), on the offline default: a one-token step, a chain of n
tokens and a token tree of n nodes (each node's parent the one two before it: a bushy tree, as EAGLE grows them),
after a cached context, interleaved in one process, medians over repeats. Each row also in units of its own side's
one-token step: the verify-cost curve the drafters size their drafts by.

    python -m bench.native_layers --threads 2 --context 200 --repeats 25 --out bench/results/native-layers-2threads

`--against REV` compares the compiled layers with those of another git revision instead (its csrc/lean_layers.cpp
and blocked_gemm.cpp, built beside the shipped ones), both sides compiled, interleaved in one process:

    python -m bench.native_layers --threads 2 --context 1000 --rows 4 8 --against 57fda3e
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from spec_engine.accel import blocked_gemm, native_layers
from spec_engine.core import speed
from spec_engine.core.cache import forward_logits, forward_tree_logits, new_cache, prefill, trim_cache
from spec_engine.models import DEFAULT_MODEL, load_model

FEATURES = (2, 15, 27, -1)          # the shipped EAGLE head's layers: verify forwards hand them over
SIDES = {"compiled": "1", "torch": "0"}
CSRC = "spec_engine/accel/csrc"


def sources_at(revision: str) -> Path:
    """A new folder holding `revision`'s lean_layers.cpp and blocked_gemm.cpp (`git show`)."""
    folder = Path(tempfile.mkdtemp(prefix="lean-layers-"))
    root = Path(__file__).resolve().parents[1]
    for name in ("lean_layers.cpp", "blocked_gemm.cpp"):
        text = subprocess.run(["git", "show", f"{revision}:{CSRC}/{name}"], cwd=root, check=True,
                              capture_output=True).stdout
        (folder / name).write_bytes(text)
    return folder


def library_at(revision: str, folder: Path | None = None):
    """The compiled layers as `revision` had them: its two sources (`sources_at`, or `folder` holding them), built
    and loaded (native_layers.build)."""
    folder = folder or sources_at(revision)
    return native_layers.build(blocked_gemm.kernel().isa, folder / "lean_layers.cpp", folder / "blocked_gemm.cpp",
                               name="lean_layers-other")


def bushy_tree(n: int) -> tuple[list[int], list[int]]:
    """(parents, depths) of a tree of n rows, the root and n - 1 nodes, each node's parent the one two before it: a
    bushy tree, as EAGLE grows them."""
    parents = [-1] + [max(i - 2, -1) for i in range(1, n - 1)]
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return parents, depths


def arms(model, cache, context: int, ids: list[int], rows: list[int]) -> dict[str, callable]:
    def chain(n):
        def run():
            forward_logits(model, ids[context:context + n], cache, n, FEATURES)
            trim_cache(cache, context)
        return run

    def tree(n):
        parents, depths = bushy_tree(n)

        def run():
            forward_tree_logits(model, ids[context], ids[context + 1:context + n], parents, depths, cache, FEATURES)
            trim_cache(cache, context)
        return run
    found = {"step": chain(1)}
    for n in rows:
        found[f"chain {n}"], found[f"tree {n}"] = chain(n), tree(n)
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 4, 6, 8, 12, 16])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--against", default=None, metavar="REV",
                        help="time another revision's compiled layers as the second side instead of torch's operations")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_model(DEFAULT_MODEL, "cpu", "float32")
    model = engine.model
    speed.active().warm(model)
    ids = torch.randint(0, model.config.vocab_size, (args.context + 32,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    cache = new_cache(model)
    prefill(model, ids[:args.context], cache, FEATURES)
    runs = arms(model, cache, args.context, ids, args.rows)
    shipped, isa = native_layers.library(), blocked_gemm.kernel().isa
    other = f"at {args.against}" if args.against else "torch"
    libraries = {"compiled": shipped, other: library_at(args.against)} if args.against else None
    seconds = {(side, name): [] for side in ("compiled", other) for name in runs}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for side in ("compiled", other):
            if libraries:
                native_layers._BUILT[isa] = libraries[side]
            else:
                os.environ["SPEC_ENGINE_NATIVE_LAYERS"] = SIDES[side]
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[(side, name)].append(time.perf_counter() - start)
    os.environ.pop("SPEC_ENGINE_NATIVE_LAYERS", None)
    native_layers._BUILT[isa] = shipped
    median = {key: statistics.median(values) for key, values in seconds.items()}
    lines = [f"`python -m bench.native_layers {' '.join(argv or [])}`".replace(" `", "`"),
             f"{engine.name} fp32, {args.threads} threads, {args.context} cached tokens, medians of {args.repeats}; "
             f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.", "",
             f"| forward | compiled ms | {other} ms | compiled / {other} | compiled, in its steps "
             f"| {other}, in its steps |",
             "|---|---|---|---|---|---|"]
    for name in runs:
        c, t = median[("compiled", name)], median[(other, name)]
        c_steps = c / median[("compiled", "step")]
        lines.append(f"| {name} | {1e3 * c:.2f} | {1e3 * t:.2f} | {c / t:.2f} | {c_steps:.2f} | "
                     f"{t / median[(other, 'step')]:.2f} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(report + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            {"command": lines[0].strip("`"), "threads": args.threads, "context": args.context,
             "load before": load_before, "median seconds": {f"{side}/{name}": value
                                                            for (side, name), value in median.items()}}, indent=1))


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
