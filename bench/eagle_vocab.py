"""Whether the EAGLE head's reduced vocabulary holds back its drafts, and whether more rows help without training.

The shipped head scores 8,192 of the target's 49,152 tokens (spec_engine/drafters/eagle.py: the LM-head rows of the
tokens its training answers used most); a token outside them is never drafted. Two measurements, on the six-kind
set's tuning part (the prompts after the first five of each kind, which the issue's benchmark leaves out) and the
app's default prompt (presets/scenarios.yaml `chat-sky`):

1. **Coverage**: the share of the first 64 tokens the target decodes greedily (plain decoding; like bench/decode_ab.py
   it does not stop at the end of an answer) outside the vocabulary, by kind, for the shipped vocabulary, for it
   grown to N tokens (the lowest other token ids: a BPE tokenizer's earliest, most frequent merges), and for either
   plus the prompt's own tokens.
2. **Drafting with more rows**: `eagle+lookup-tree` at k = 12, greedy, with the shipped vocabulary and with grown ones
   (each added row is the target's own LM-head row, as the shipped ones are; the head never trained against them),
   sides alternating by repeat in one process, every run checked against plain decoding's tokens: tokens per round
   and the speedup over plain decoding (geometric mean of per-prompt ratios, each from runs seconds apart).

    python -m bench.eagle_vocab --repeats 3 --out bench/results/eagle-vocab-2threads
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from spec_engine import SamplingParams, SpeculativeDecoder, autoregressive_generate
from bench.decode_ab import tuning_prompts
from spec_engine.bench_hf import Prompt, encode
from spec_engine.drafters import eagle
from spec_engine.drafters.registry import make_drafter
from spec_engine.models import DEFAULT_MODEL, load_model

DEFAULT_PROMPT = Prompt("tuning", "default prompt", "chat-sky",
                        "Explain in three short sentences why the sky is blue.", ())
SIZES = (12288, 16384, 24576, 32768)


def grown(vocab: list[int], size: int, vocab_size: int) -> list[int]:
    """`vocab` and then the lowest ids not in it, up to `size` tokens."""
    held = set(vocab)
    return vocab + [i for i in range(vocab_size) if i not in held][:max(0, size - len(vocab))]


def coverage(answers: dict[str, tuple[list[int], list[int], str]], vocab: list[int], vocab_size: int) -> list[str]:
    """Markdown rows: the share of answer tokens outside each vocabulary, by kind."""
    kinds = list(dict.fromkeys(kind for _, _, kind in answers.values()))
    lines = ["| vocabulary | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for size in (len(vocab),) + SIZES:
        held = set(grown(vocab, size, vocab_size))
        for with_prompt in (False, True):
            missed, total = defaultdict(int), defaultdict(int)
            for prompt_ids, answer, kind in answers.values():
                known = held | set(prompt_ids) if with_prompt else held
                missed[kind] += sum(t not in known for t in answer)
                total[kind] += len(answer)
            label = (("shipped" if size == len(vocab) else f"grown to {size}")
                     + (" + the prompt's tokens" if with_prompt else ""))
            lines.append(f"| {label} | " + " | ".join(f"{missed[k] / total[k]:.3f}" for k in kinds) + " |")
    return lines


def tuning_setup(parser: argparse.ArgumentParser, argv=None):
    """(args, argv, engine, prompts, their ids) for a head benchmark (this one, bench/eagle_ab.py): the options they
    share added to `parser` and parsed, the offline default loaded at --threads, the six-kind set's tuning prompts
    (--per-kind after the first --first of each kind) and the app's default prompt."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="the first warms up and is dropped")
    parser.add_argument("--first", type=int, default=5, help="skip this many prompts of each kind")
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--out", default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_model(DEFAULT_MODEL, "cpu", "float32")
    prompts = tuning_prompts(args.first, args.per_kind) + [DEFAULT_PROMPT]
    return args, argv, engine, prompts, [encode(engine, p) for p in prompts]


@contextlib.contextmanager
def drafting_with(now: dict):
    """Inside, the registry's EAGLE drafters draft with the head parts `now["parts"]` (as `eagle.head_parts` builds
    them) instead of the shipped head's, so a benchmark can switch heads between runs without another registry."""
    shared_head = eagle.shared_head
    eagle.shared_head = lambda target, path=eagle.DEFAULT_WEIGHTS: now["parts"]
    try:
        yield
    finally:
        eagle.shared_head = shared_head


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 24576], help="grown vocabularies drafted with")
    args, argv, engine, prompts, ids = tuning_setup(parser, argv)
    model, greedy = engine.model, SamplingParams(temperature=0.0)
    vocab_size = model.get_output_embeddings().weight.shape[0]

    shipped = eagle.shared_head(model)
    vocab = shipped[1].tolist()
    answers = {p.name: (x[0].tolist(), autoregressive_generate(model, x, max_new_tokens=64, sampling=greedy).tokens,
                        p.kind) for p, x in zip(prompts, ids)}

    # Each side is the shipped head with another reduced LM head: the same weights, more rows of the target's.
    dtype, load_head = eagle.head_dtype(model), eagle.load_head
    sides = {"shipped (8192)": shipped}
    for size in args.sizes:
        eagle.load_head = lambda *a, size=size, **k: (lambda head, v: (head, torch.tensor(
            grown(v.tolist(), size, vocab_size), dtype=v.dtype)))(*load_head(*a, **k))
        sides[f"grown to {size}"] = eagle.head_parts(model, eagle.DEFAULT_WEIGHTS, dtype)
    eagle.load_head = load_head
    now = {"parts": shipped}
    ratios, tokens, rounds = defaultdict(list), defaultdict(int), defaultdict(int)
    by_kind = defaultdict(lambda: [0, 0])
    load_before = os.getloadavg()
    with drafting_with(now):
        for repeat in range(args.repeats):
            for side in list(sides)[::1 if repeat % 2 else -1]:
                now["parts"] = sides[side]
                for p, x in zip(prompts, ids):
                    start = time.perf_counter()
                    result = SpeculativeDecoder(model, make_drafter("eagle+lookup-tree", engine, None)).generate(
                        x, k=12, max_new_tokens=64, sampling=greedy, display=False)
                    middle = time.perf_counter()
                    plain = autoregressive_generate(model, x, max_new_tokens=64, sampling=greedy)
                    end = time.perf_counter()
                    assert result.tokens == plain.tokens, "speculative decoding left plain decoding's tokens"
                    if repeat:
                        ratios[side].append((end - middle) / (middle - start))
                        tokens[side] += len(result.tokens)
                        rounds[side] += len(result.rounds)
                        by_kind[side, p.kind][0] += len(result.tokens)
                        by_kind[side, p.kind][1] += len(result.rounds)
    kinds = list(dict.fromkeys(p.kind for p in prompts))
    lines = [f"`python -m bench.eagle_vocab {' '.join(argv)}`".replace(" `", "`"),
             f"{engine.name} fp32, {args.threads} threads, {len(prompts)} prompts ({args.per_kind} of each kind after "
             f"the first {args.first}, and the app's default prompt), greedy, 64 tokens; load average "
             f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.", "",
             "Share of the target's answer tokens outside the head's vocabulary:", "",
             *coverage(answers, vocab, vocab_size), "",
             f"`eagle+lookup-tree`, k = 12, {args.repeats - 1} measured repeats, sides alternating; every run gave "
             "plain decoding's tokens. Tokens per round, all prompts and by kind, and the speedup over plain decoding:",
             "", "| vocabulary | speedup | tokens per round | " + " | ".join(kinds) + " |",
             "|---" * (len(kinds) + 3) + "|"]
    summary = {}
    for side in sides:
        summary[side] = {"speedup": statistics.geometric_mean(ratios[side]),
                         "tokens_per_round": tokens[side] / rounds[side],
                         "by_kind": {k: by_kind[side, k][0] / by_kind[side, k][1] for k in kinds}}
        s = summary[side]
        lines.append(f"| {side} | {s['speedup']:.3f}x | {s['tokens_per_round']:.3f} | "
                     + " | ".join(f"{s['by_kind'][k]:.2f}" for k in kinds) + " |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out + ".md").write_text(report + "\n", encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps({"command": lines[0].strip("`"), "args": vars(args),
                                                        "load before": load_before, "sides": summary}, indent=1) + "\n",
                                            encoding="utf-8")


if __name__ == "__main__":
    main()
