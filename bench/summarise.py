"""Pivot benchmark JSON files (spec_engine.bench --out) into the compact tables of the README.

    python -m bench.summarise bench/results/prompt-lookup-fp32.json bench/results/prompt-lookup-bf16.json

One row per (file's dtype, draft, temperature, k), one column per prompt; a cell reads
"speedup vs plain · vs Hugging Face · realised / predicted", all measured in the same run (see spec_engine/bench.py).
A last column gives the median of realised / predicted over the row.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def cell(row: dict) -> str:
    hf = "–" if row.get("speedup_vs_hf") is None else f"{row['speedup_vs_hf']:.2f}"
    return f"{row['speedup_vs_plain']:.2f}x · {hf} · {row['realised_over_predicted']:.2f}"


def table(paths: list[Path]) -> str:
    groups: dict[tuple, dict[str, dict]] = {}
    prompts: list[str] = []
    for path in paths:
        blob = json.loads(Path(path).read_text())
        dtype = blob["meta"]["dtype"].removeprefix("torch.")
        for row in blob["rows"]:
            key = (dtype, row["draft"], row["temperature"], row["k"])
            groups.setdefault(key, {})[row["prompt"]] = row
            if row["prompt"] not in prompts:
                prompts.append(row["prompt"])
    head = "| dtype | draft | T | k | " + " | ".join(prompts) + " | realised / predicted (median) |"
    lines = [head, "|" + "---|" * (len(prompts) + 5)]
    for (dtype, draft, temperature, k), rows in groups.items():
        ratios = [r["realised_over_predicted"] for r in rows.values()]
        cells = [cell(rows[p]) if p in rows else "" for p in prompts]
        lines.append(f"| {dtype} | {draft} | {temperature:g} | {k} | " + " | ".join(cells)
                     + f" | {statistics.median(ratios):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]]))
