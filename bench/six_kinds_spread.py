"""The spread of repeated runs of one `spec_engine.bench_hf` command, from the runs' own JSON files.

    python -m bench.six_kinds_spread bench/results/six-kinds-quiet-2threads-*.json \
        --out bench/results/six-kinds-quiet-2threads-spread.md

One row per file: the engine's plain decoding (tok/s, the range of the medians by kind), and per arm the geometric
mean over prompts of its median speedup over the engine's plain decoding, with its tokens per target forward (mean
over prompts of the median over repeats), both computed as `bench_hf.kind_table` computes its "all" row; then the
minimum, median and maximum of each arm over the runs. Nothing is timed here: it only reads the files.
"""
import argparse
import json
import statistics
from pathlib import Path

ENGINE_PLAIN = "engine-plain"


def median_speedup(result: dict, arm: str) -> float:
    pairs = zip(result["runs"][arm], result["runs"][ENGINE_PLAIN])
    return statistics.median(a["tok_s"] / b["tok_s"] for a, b in pairs)


def tokens_per_forward(run: dict) -> float:
    return len(run["tokens"]) / max(run["rounds"], 1)


def run_figures(path: Path) -> dict:
    """What one results file says: its arms' geometric-mean speedups and tokens per forward, plain decoding's rate."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = doc["rows"]
    arms = [arm for arm in rows[0]["runs"] if not arm.startswith("hf-") and arm != ENGINE_PLAIN]
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).extend(x["tok_s"] for x in r["runs"][ENGINE_PLAIN])
    plain = [statistics.median(v) for v in by_kind.values()]
    figures = {arm: (statistics.geometric_mean([median_speedup(r, arm) for r in rows]),
                     statistics.fmean(statistics.median(tokens_per_forward(x) for x in r["runs"][arm]) for r in rows))
               for arm in arms}
    return {"name": path.stem, "prompts": len(rows), "identical": all(r["identical"] for r in rows),
            "plain": (min(plain), max(plain)), "arms": figures,
            "load": doc["meta"].get("load average before (1, 5, 15 min)")}


def report(runs: list[dict]) -> str:
    arms = list(dict.fromkeys(arm for run in runs for arm in run["arms"]))
    head = ["run", "prompts", "load before", "engine plain tok/s (medians by kind)", *arms, "plain decoding's tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [f"`{run['name']}`", str(run["prompts"]), f"{run['load'][0]:.2f}" if run["load"] else "–",
                 "{:.0f}-{:.0f}".format(*run["plain"])]
        cells += [f"{run['arms'][arm][0]:.2f}x · {run['arms'][arm][1]:.2f}" if arm in run["arms"] else "–"
                  for arm in arms]
        cells.append("yes" if run["identical"] else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| arm | runs | lowest | median | highest |", "|---|---|---|---|---|"]
    for arm in arms:
        values = [run["arms"][arm][0] for run in runs if arm in run["arms"]]
        lines.append(f"| {arm} | {len(values)} | {min(values):.2f}x | {statistics.median(values):.2f}x | "
                     f"{max(values):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench_hf results (.json) of one command, repeated")
    parser.add_argument("--out", type=Path, help="write the table here (markdown) instead of printing it")
    args = parser.parse_args(argv)
    runs = [run_figures(path) for path in sorted(args.files)]
    names = " ".join(str(path) for path in sorted(args.files))
    text = (f"`python -m bench.six_kinds_spread {names}`: the spread of {len(runs)} runs of one command, from their "
            "own files (each cell: the geometric mean over the prompts of the speedup over the engine's plain "
            "decoding · tokens per target forward).\n\n" + report(runs))
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
