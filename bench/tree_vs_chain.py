"""Draft trees against chains at equal settings (issue #26): tokens per target forward of the EAGLE head's chain and
of its EAGLE-2 tree, both fixed-size (every sizing off: a chain of exactly k drafts, a tree of exactly k nodes, so
both verify k + 1 rows a round), greedy, on held-out prompts; and, per tree round, whether the accepted path was
longer than what its top-1 spine (the chain of the head's first choices, as deep as the tree kept it) had accepted.
Timing-free, so a loaded machine gives the same numbers; not a test. `--widths` and `--depths` grow the EAGLE tree
at each pair (`eagle-tree w4 d5`), the sweep its defaults were chosen by.

    python -m bench.tree_vs_chain --kinds chat --per-kind 8 --k 4 8 --tokens 48 \\
        --out bench/results/tree-vs-chain-heldout-chat
    python -m bench.tree_vs_chain --kinds chat --per-kind 6 --k 4 8 12 16 --drafts eagle eagle-tree --widths 3 4 \
        --threads 1 --out bench/results/eagle-tree-shape-heldout-chat
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from spec_engine.bench import tree_gain
from spec_engine.bench_hf import encode, load_prompts, select_prompts
from spec_engine.core.decoder import SpeculativeDecoder, autoregressive_generate
from spec_engine.core.sampling import SamplingParams
from spec_engine.drafters.eagle_tree import EAGLE_TREE_DEPTH, EAGLE_TREE_WIDTH, load_eagle_tree_drafter
from spec_engine.drafters.registry import make_drafter
from spec_engine.models import DEFAULT_MODEL, load_model

GREEDY = SamplingParams(0.0)
HELD_OUT = Path(__file__).resolve().parent / "data" / "eagle_prompts.json"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tree_vs_chain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default=str(HELD_OUT))
    parser.add_argument("--kinds", nargs="+", default=["chat"])
    parser.add_argument("--per-kind", type=int, default=8)
    parser.add_argument("--k", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--drafts", nargs="+", default=["eagle", "eagle-tree"])
    parser.add_argument("--widths", nargs="+", type=int, default=None, help="EAGLE tree widths to sweep")
    parser.add_argument("--depths", nargs="+", type=int, default=None, help="EAGLE tree depths to sweep")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load_model(DEFAULT_MODEL, "cpu", "float32")
    prompts = select_prompts(load_prompts(Path(args.prompts)), "held-out", args.kinds, args.per_kind)
    eos = target.tokenizer.eos_token_id
    drafts = shaped(args.drafts, args.widths, args.depths)
    rows = []
    for prompt in prompts:
        ids = encode(target, prompt)
        plain = autoregressive_generate(target.model, ids, max_new_tokens=args.tokens, sampling=GREEDY,
                                        eos_token_id=eos).tokens
        for k in args.k:
            for draft, build in drafts.items():
                result = SpeculativeDecoder(target.model, build(target)).generate(
                    ids, k=k, max_new_tokens=args.tokens, sampling=GREEDY, eos_token_id=eos)
                s = result.stats
                row = {"prompt": prompt.name, "draft": draft, "k": k, "tokens_per_forward": s.tokens_per_round,
                       "acceptance": s.acceptance_rate, "identical": result.tokens == plain,
                       **tree_gain(result.rounds, result.tokens)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = ["| draft | k | prompts | tokens per forward (mean) | acceptance | tree rounds whose path beat the top-1 "
             "spine | accepted per tree round: path / spine | same tokens as plain |",
             "|---|---|---|---|---|---|---|---|"]
    for k in args.k:
        for draft in drafts:
            rs = [r for r in rows if r["k"] == k and r["draft"] == draft]
            trees = [r for r in rs if r["tree_longer_share"] is not None]
            tree = (f"{statistics.fmean(r['tree_longer_share'] for r in trees):.0%} | "
                    f"{statistics.fmean(r['tree_path_per_round'] for r in trees):.2f} / "
                    f"{statistics.fmean(r['spine_per_round'] for r in trees):.2f}") if trees else "– | –"
            lines.append(f"| {draft} | {k} | {len(rs)} | {statistics.fmean(r['tokens_per_forward'] for r in rs):.2f} | "
                         f"{statistics.fmean(r['acceptance'] for r in rs):.2f} | {tree} | "
                         f"{'yes' if all(r['identical'] for r in rs) else '**no**'} |")
    command = "python -m bench.tree_vs_chain " + " ".join(argv or [])
    text = (f"`{command}` ({target.name}, fp32, greedy, fixed-size drafts, up to {args.tokens} tokens)\n\n"
            + "\n".join(lines))
    print(text)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))


def shaped(names: list[str], widths: list[int] | None, depths: list[int] | None) -> dict:
    """Each draft name -> a builder of its fixed-size drafter; with widths or depths, `eagle-tree` becomes one arm per
    (width, depth) pair, the others' defaults filling in what is not swept."""
    arms = {}
    for name in names:
        if name == "eagle-tree" and (widths or depths):
            for width in widths or [EAGLE_TREE_WIDTH]:
                for depth in depths or [EAGLE_TREE_DEPTH]:
                    arms[f"eagle-tree w{width} d{depth}"] = lambda target, w=width, d=depth: load_eagle_tree_drafter(
                        target.model, fixed_length=True, width=w, depth=d)
        else:
            arms[name] = lambda target, name=name: make_drafter(name, target, fixed_length=True)
    return arms


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
