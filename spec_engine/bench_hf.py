"""The engine against stock Hugging Face, measured the way a sceptic would (issue #27). Not a test: run it by hand.

    python -m spec_engine.bench_hf --threads 1 2 --set held-out --k 4 --tokens 64 --repeats 3 \
        --out bench/results/hf-stock-heldout

What a user would pick instead of the engine is transformers alone: the same weights in the same dtype, loaded by
`AutoModelForCausalLM.from_pretrained` (nothing of spec_engine applied: no lean forward, no packed products, no
engine attention), decoding with its own `generate()`. So the Hugging Face side here loads its own stock model
(`load_stock`) from where the engine read its weights, and runs both plain decoding and
`prompt_lookup_num_tokens=k, max_matching_ngram_size=3`; the engine runs plain decoding and its prompt lookup
(`--drafts`, default: the default policy; `NAME/full` drafts k every round, so `prompt-lookup:3/full` is
transformers' policy on the engine's forward).

For each prompt, each repeat and each thread count (torch.set_num_threads), the arms run back to back, their
order rotated by repeat, so a passing load on the shared machine touches them all alike; every cell is the median
over repeats with its min-max. Ratios are taken per repeat (the two runs were seconds apart), then the median.
Every run is timed end to end (prefill included) on the same chat-templated prompt ids, greedy, stopping at EOS;
each side's forwards are tallied (calls, rows, seconds), so the table of where the time goes is measured, not
modelled. Each engine arm's tokens are checked equal to stock plain decoding's (greedy identity).

`--profile` measures instead where an engine round's time goes (spec_engine/round_profile.py): per prompt and thread
count, plain decoding once (its step is the unit) and each `--drafts` arm once under the profile, then the parts of a
round (draft forwards, the EAGLE head's catch-up, tree building, the verify forward, sampling and the rule, the cache
trim, the event, bookkeeping) per round in plain steps, and the verify forward by row count. No stock model is loaded.

    python -m spec_engine.bench_hf --profile --threads 2 --prompts bench/data/six_kinds.json --per-kind 1 \
        --drafts eagle+lookup-tree@8 eagle+lookup@3 --repeats 1

Prompts come from bench/data/hf_compare_prompts.json: a tuning set (what the lookup policy was tuned on) and a
held-out set written for this comparison (edit, summarise, retrieval QA over a passage, chat). Headline
figures are the held-out set's; the tuning set is for trying policies.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from spec_engine.accel import lean_llama      # the engine's lean forward does not call the module: tally it apart
from spec_engine.bench import tree_gain
from spec_engine.core import speed
from spec_engine.core.decoder import SpeculativeDecoder, autoregressive_generate
from spec_engine.core.sampling import SamplingParams
from spec_engine.drafters import sizing
from spec_engine.drafters.registry import make_drafter
from spec_engine.models import DEFAULT_MODEL, load_model
from spec_engine.round_profile import PARTS as PARTS_ORDER
from spec_engine.round_profile import RoundProfile, plain_step_seconds, profile_table, rows_table

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "bench" / "data" / "hf_compare_prompts.json"
SETS = ("tuning", "held-out")
GROUNDED = ("edit", "summarise", "qa")     # the answer copies its input: where prompt lookup can pay
HF_NGRAM = 3                               # transformers' max_matching_ngram_size in the comparison (its default: 2)
GREEDY = SamplingParams(temperature=0.0)
HF_PLAIN, HF_LOOKUP, ENGINE_PLAIN = "hf-plain", "hf-lookup", "engine-plain"


@dataclass(frozen=True)
class Prompt:
    set: str          # "tuning" or "held-out"
    kind: str         # edit, summarise, qa, chat, code
    name: str
    text: str
    turns: tuple = ()  # a multi-turn chat: ({"role": ..., "content": ...}, ...), ending with the user's turn `text`


def load_prompts(path: Path = PROMPTS_FILE) -> list[Prompt]:
    """Both sets of the prompt file, tuning first; ValueError names the file and the entry that is malformed."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    prompts = []
    for key, set_name in (("tuning", "tuning"), ("held_out", "held-out")):
        for i, item in enumerate(data.get(key, [])):
            if isinstance(item, dict) and "name" not in item and isinstance(item.get("kind"), str):
                same_kind = sum(x.get('kind') == item['kind'] for x in data[key][:i])
                item = {**item, "name": f"{set_name}-{item['kind']}-{same_kind}"}
            if not all(isinstance(item.get(f), str) and item.get(f).strip() for f in ("kind", "name", "text")):
                raise ValueError(f"{path}: {key}[{i}] needs non-empty strings kind, name and text")
            turns = item.get("turns", [])
            if not isinstance(turns, list) or not all(isinstance(t, dict) and t.get("role") in ("user", "assistant")
                                                      and isinstance(t.get("content"), str) for t in turns) \
                    or (turns and turns[-1] != {"role": "user", "content": item["text"]}):
                raise ValueError(f"{path}: {key}[{i}].turns must be user / assistant turns ending with the user's text")
            prompts.append(Prompt(set_name, item["kind"], item["name"], item["text"], tuple(turns)))
    return prompts


def select_prompts(prompts: list[Prompt], set_name: str, kinds: list[str] | None = None,
                   per_kind: int | None = None) -> list[Prompt]:
    """The prompts of one set (optionally only some kinds, at most per_kind of each); ValueError names the field."""
    if set_name not in SETS:
        raise ValueError(f"--set must be one of {', '.join(SETS)}, got {set_name!r}")
    chosen = [p for p in prompts if p.set == set_name]
    known = sorted({p.kind for p in chosen})
    unknown = [k for k in kinds or [] if k not in known]
    if unknown:
        raise ValueError(f"--kinds: no {set_name} prompts of kind {', '.join(unknown)}; "
                         f"the kinds are {', '.join(known)}")
    if kinds:
        chosen = [p for p in chosen if p.kind in kinds]
    if per_kind is not None:
        chosen = [p for i, p in enumerate(chosen) if sum(q.kind == p.kind for q in chosen[:i]) < per_kind]
    return chosen


def interleaved(prompts: list[Prompt]) -> list[Prompt]:
    """The first prompt of each kind, then the second of each, ...: kinds in their first appearance's order."""
    rank = {p.name: sum(q.kind == p.kind for q in prompts[:i]) for i, p in enumerate(prompts)}
    kinds = list(dict.fromkeys(p.kind for p in prompts))
    return sorted(prompts, key=lambda p: (rank[p.name], kinds.index(p.kind)))


def load_stock(source: str, dtype: torch.dtype):
    """The engine's weights loaded again by transformers alone, from where `load_model` read them
    (`LoadedModel.source`: "cache:<dir>" is the plain safetensors checkpoint it dequantized from the packaged GGUF,
    "gguf:<file>" the GGUF itself, "local:" / "hub:" a directory or hub id). Nothing of spec_engine touches it."""
    from transformers import AutoModelForCausalLM, GgufConfig
    kind, _, where = source.partition(":")
    if kind in ("cache", "local", "hub"):
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    elif kind == "gguf":
        gguf = Path(where)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                     quantization_config=GgufConfig(dequantize=True))
    else:
        raise ValueError(f"cannot load a stock copy of a model whose source is {source!r}")
    return model.to("cpu").eval().requires_grad_(False)


def encode(engine, prompt: Prompt) -> torch.Tensor:
    """The prompt's ids [1, T]: one user turn (LoadedModel.encode_prompt), or the whole conversation of a multi-turn
    chat through the chat template, followed by the assistant header."""
    if not prompt.turns:
        return engine.encode_prompt(prompt.text)
    encoded = engine.tokenizer.apply_chat_template(list(prompt.turns), add_generation_prompt=True, tokenize=True,
                                                   return_dict=True, return_tensors="pt")
    return encoded["input_ids"].to(device=engine.device, dtype=torch.long)


class ForwardTally:
    """Calls, rows (tokens fed) and wall seconds of the forwards of `model`: its module hooks (transformers'
    forward: the stock model, or the engine's when the lean path declines) and the engine's lean forward of it.
    The first call (the prefill over the prompt) is kept apart, so the rest describes decoding."""

    def __init__(self, model):
        self.calls, self.rows, self.seconds = 0, 0, 0.0
        self.prefill_rows, self.prefill_seconds = 0, 0.0
        self._model, self._start = model, None
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         model.register_forward_hook(self._post)]
        self._lean = lean_llama.forward_logits
        lean_llama.forward_logits = self._timed_lean

    def _count(self, input_ids) -> None:
        self.calls += 1
        self.rows += int(input_ids.shape[-1]) if input_ids is not None else 0
        if self.calls == 1:
            self.prefill_rows = self.rows

    def _add(self, seconds: float) -> None:
        self.seconds += seconds
        if self.calls == 1:
            self.prefill_seconds = seconds

    def _pre(self, module, args, kwargs):
        self._count(kwargs.get("input_ids", args[0] if args else None))
        self._start = time.perf_counter()

    def _post(self, module, args, output):
        self._add(time.perf_counter() - self._start)

    def _timed_lean(self, model, input_ids, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._lean(model, input_ids, *args, **kwargs)
        finally:
            if model is self._model:
                self._count(input_ids)
                self._add(time.perf_counter() - start)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        lean_llama.forward_logits = self._lean


@dataclass(frozen=True)
class Run:
    arm: str
    seconds: float
    tokens: list[int]
    forward_calls: int          # prefill included
    forward_rows: int
    forward_seconds: float
    prefill_rows: int
    prefill_seconds: float
    rounds: int | None = None          # an engine draft arm's rounds, drafted and accepted tokens
    drafted: int | None = None
    accepted: int | None = None
    tree: dict | None = None           # its greedy tree rounds (bench.tree_gain), when it drafted trees

    @property
    def tok_s(self) -> float:
        return len(self.tokens) / self.seconds


def run_arm(arm: str, engine, stock, prompt_ids, k: int, tokens: int, eos_id: int) -> Run:
    """One timed run of one arm, end to end, with its forwards tallied."""
    model = stock if arm.startswith("hf-") else engine.model
    tally = ForwardTally(model)
    try:
        start = time.perf_counter()
        if arm.startswith("hf-"):
            extra = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": HF_NGRAM} if arm == HF_LOOKUP else {}
            out = stock.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=tokens,
                                 do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id, **extra)
            new = out[0, prompt_ids.shape[1]:].tolist()
        elif arm == ENGINE_PLAIN:
            new = autoregressive_generate(engine.model, prompt_ids, max_new_tokens=tokens, sampling=GREEDY,
                                          eos_token_id=eos_id).tokens
        else:
            name, k = arm_k(arm, k)
            name, _, full = name.partition("/")
            drafter = make_drafter(name, engine, None, fixed_length=full == "full")
            result = SpeculativeDecoder(engine.model, drafter).generate(
                prompt_ids, k=k, max_new_tokens=tokens, sampling=GREEDY, eos_token_id=eos_id, display=False)
            new = result.tokens
        seconds = time.perf_counter() - start
    finally:
        tally.close()
    stats = {}
    if arm not in (HF_PLAIN, HF_LOOKUP, ENGINE_PLAIN):
        gain = tree_gain(result.rounds, result.tokens)
        stats = {"rounds": result.stats.rounds, "drafted": result.stats.drafted, "accepted": result.stats.accepted,
                 "tree": gain if gain["tree_nodes"] is not None else None}
    return Run(arm, seconds, list(new), tally.calls, tally.rows, tally.seconds, tally.prefill_rows,
               tally.prefill_seconds, **stats)


def arm_k(arm: str, k: int) -> tuple[str, int]:
    """An engine arm NAME@K drafts with k = K (a tree's node budget, say), NAME with the run's --k."""
    name, _, own = arm.rpartition("@")
    return (name, int(own)) if name and own.isdigit() else (arm, k)


def rotated(arms: list[str], repeat: int) -> list[str]:
    """The arms in the order of this repeat: rotated by one each repeat, so no arm always runs first."""
    shift = repeat % len(arms)
    return arms[shift:] + arms[:shift]


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def fmt_spread(values: list[float], unit: str = "") -> str:
    mid, low, high = spread(values)
    return f"{mid:.2f}{unit} [{low:.2f}-{high:.2f}]"


def ratios(runs: dict[str, list[Run]], top: str, bottom: str) -> list[float]:
    """top's tok/s over bottom's, per repeat (runs of one repeat are seconds apart)."""
    return [a.tok_s / b.tok_s for a, b in zip(runs[top], runs[bottom])]


def cell_rows(results: list[dict], lookups: list[str]) -> str:
    """One row per (threads, prompt): each arm's tok/s and the ratios, median [min-max] over repeats."""
    head = ["threads", "prompt", "HF plain tok/s", "HF lookup tok/s", "engine plain tok/s"]
    head += [f"{arm} tok/s" for arm in lookups] + ["HF lookup / HF plain", "engine plain / HF plain"]
    head += [f"**{arm} / HF lookup**" for arm in lookups] + ["same tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        runs = r["runs"]
        cells = [str(r["threads"]), r["prompt"]]
        cells += [fmt_spread([x.tok_s for x in runs[arm]]) for arm in [HF_PLAIN, HF_LOOKUP, ENGINE_PLAIN, *lookups]]
        cells += [fmt_spread(ratios(runs, HF_LOOKUP, HF_PLAIN), "x"),
                  fmt_spread(ratios(runs, ENGINE_PLAIN, HF_PLAIN), "x")]
        cells += [fmt_spread(ratios(runs, arm, HF_LOOKUP), "x") for arm in lookups]
        cells.append("yes" if r["identical"] else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_ratio(result: dict, top: str, bottom: str) -> float:
    return statistics.median(ratios(result["runs"], top, bottom))


def summary(results: list[dict], lookups: list[str]) -> str:
    """Per thread count and group (each kind, grounded = edit + summarise + qa, all): the geometric mean over
    prompts of the median ratios, and the lowest prompt."""
    lines = ["| threads | group (prompts) | ratio | geometric mean | lowest prompt | highest prompt |",
             "|---|---|---|---|---|---|"]
    pairs = [(arm, HF_LOOKUP) for arm in lookups] + [(HF_LOOKUP, HF_PLAIN), (ENGINE_PLAIN, HF_PLAIN)]
    pairs += [(arm, ENGINE_PLAIN) for arm in lookups]
    for threads in sorted({r["threads"] for r in results}):
        at = [r for r in results if r["threads"] == threads]
        kinds = sorted({r["kind"] for r in at})
        groups = [(kind, [r for r in at if r["kind"] == kind]) for kind in kinds]
        groups += [("grounded", [r for r in at if r["kind"] in GROUNDED]), ("all", at)]
        for name, members in groups:
            if not members:
                continue
            for top, bottom in pairs:
                values = [median_ratio(r, top, bottom) for r in members]
                bold = "**" if top in lookups and bottom == HF_LOOKUP else ""
                lines.append(f"| {threads} | {name} ({len(members)}) | {top} / {bottom} | "
                             f"{bold}{statistics.geometric_mean(values):.2f}x{bold} | {min(values):.2f}x | "
                             f"{max(values):.2f}x |")
    return "\n".join(lines)


def tokens_per_forward(run: Run) -> float:
    """Tokens per target forward after the prefill: an engine arm's tokens per round (its prefill reads prompt[:-1]
    and emits nothing); generate()'s prefill emits the first token, so its later forwards get the rest."""
    if run.rounds is not None:
        return len(run.tokens) / max(run.rounds, 1)
    decoding = run.forward_calls - 1
    return (len(run.tokens) - 1) / decoding if decoding > 0 else 1.0


def kind_table(results: list[dict], lookups: list[str]) -> str:
    """Per thread count, kind and arm (and over all prompts): the speedup over plain decoding (an engine arm over
    the engine's plain decoding, Hugging Face's lookup over its own plain decoding), geometric mean over prompts of
    the per-prompt medians over repeats; tokens per target forward and acceptance, means over prompts."""
    lines = ["| threads | kind (prompts) | arm | vs plain (geometric mean) | vs plain (range) | tokens per forward "
             "| acceptance |", "|---|---|---|---|---|---|---|"]
    pairs = [(HF_LOOKUP, HF_PLAIN)] + [(arm, ENGINE_PLAIN) for arm in lookups]
    for threads in sorted({r["threads"] for r in results}):
        at = [r for r in results if r["threads"] == threads]
        groups = [(kind, [r for r in at if r["kind"] == kind]) for kind in dict.fromkeys(r["kind"] for r in at)]
        for name, members in groups + [("all", at)]:
            for top, bottom in pairs:
                speedups = [median_ratio(r, top, bottom) for r in members]
                tpf = statistics.fmean(statistics.median(tokens_per_forward(x) for x in r["runs"][top])
                                       for r in members)
                runs = [x for r in members for x in r["runs"][top]]
                drafted = sum(x.drafted or 0 for x in runs)
                acceptance = f"{sum(x.accepted or 0 for x in runs) / drafted:.2f}" if drafted else "–"
                bold = "**" if name == "all" else ""
                lines.append(f"| {threads} | {name} ({len(members)}) | {top} | "
                             f"{bold}{statistics.geometric_mean(speedups):.2f}x{bold} | "
                             f"{min(speedups):.2f}-{max(speedups):.2f}x | {tpf:.2f} | {acceptance} |")
    return "\n".join(lines)


def tree_table(results: list[dict], lookups: list[str]) -> str:
    """Arms that drafted trees, per kind: nodes per tree round, accepted per tree round along the kept path and along
    the top-1 spine alone (what a chain of first choices as deep would have had accepted), the share of tree rounds
    whose path beat the spine; "" when no arm drafted a tree."""
    lines = ["| threads | kind | arm | nodes per tree round | accepted per tree round (path) | (top-1 spine) "
             "| rounds where the path beat the spine |", "|---|---|---|---|---|---|---|"]
    for threads in sorted({r["threads"] for r in results}):
        at = [r for r in results if r["threads"] == threads]
        for kind in [*dict.fromkeys(r["kind"] for r in at), "all"]:
            members = [r for r in at if kind in ("all", r["kind"])]
            for arm in lookups:
                trees = [x.tree for r in members for x in r["runs"][arm] if x.tree]
                if trees:
                    mean = lambda f: statistics.fmean(t[f] for t in trees)
                    lines.append(f"| {threads} | {kind} | {arm} | {mean('tree_nodes'):.1f} | "
                                 f"{mean('tree_path_per_round'):.2f} | {mean('spine_per_round'):.2f} | "
                                 f"{mean('tree_longer_share'):.0%} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def time_split(results: list[dict], arms: list[str]) -> str:
    """Where the time goes, per thread count, kind and arm, medians over prompts and repeats: the prefill, then
    decoding's forwards (after the prefill) per new token, rows per forward (1 for plain decoding, 1 + drafts for
    a verify forward), milliseconds per forward, and milliseconds outside the forwards per decoding forward
    (generate()'s or the engine's own work: drafting, the rule, cache trims, Python)."""
    lines = ["| threads | kind | arm | tok/s | prefill ms | forwards per token | rows per forward | ms per forward "
             "| other ms per forward | forward share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for threads in sorted({r["threads"] for r in results}):
        for kind in sorted({r["kind"] for r in results}):
            members = [r for r in results if r["threads"] == threads and r["kind"] == kind]
            for arm in arms:
                runs = [x for r in members for x in r["runs"][arm]]
                if not runs:
                    continue
                med = lambda f: statistics.median(f(x) for x in runs)
                calls = lambda x: max(x.forward_calls - 1, 1)
                lines.append(f"| {threads} | {kind} | {arm} | {med(lambda x: x.tok_s):.1f} "
                             f"| {med(lambda x: 1e3 * x.prefill_seconds):.1f} "
                             f"| {med(lambda x: (x.forward_calls - 1) / max(len(x.tokens), 1)):.2f} "
                             f"| {med(lambda x: (x.forward_rows - x.prefill_rows) / calls(x)):.2f} "
                             f"| {med(lambda x: 1e3 * (x.forward_seconds - x.prefill_seconds) / calls(x)):.2f} "
                             f"| {med(lambda x: 1e3 * (x.seconds - x.forward_seconds) / calls(x)):.2f} "
                             f"| {med(lambda x: x.forward_seconds / x.seconds):.0%} |")
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                    platform.processor() or platform.machine())
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or platform.machine()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m spec_engine.bench_hf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--prompts", default=str(PROMPTS_FILE), dest="prompts_file",
                        help="the prompt file (default bench/data/hf_compare_prompts.json; bench/data/six_kinds.json "
                             "holds issue #26's six kinds of task, all held out)")
    parser.add_argument("--set", default="held-out", choices=SETS, dest="set_name")
    parser.add_argument("--kinds", nargs="+", default=None)
    parser.add_argument("--per-kind", type=int, default=None, help="at most N prompts of each kind")
    parser.add_argument("--drafts", nargs="+", default=["prompt-lookup"],
                        help="engine lookup arms; NAME/full drafts k every round (prompt-lookup:3/full = HF's policy); "
                             "NAME@K drafts with k = K instead of --k (eagle-tree@8)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    parser.add_argument("--profile", action="store_true",
                        help="profile the draft arms' rounds against a plain step instead of comparing with HF")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more (a median with a spread needs at least 3)")
    if any(n < 1 for n in args.threads):
        parser.error("--threads: thread counts must be 1 or more")
    try:
        prompts = select_prompts(load_prompts(Path(args.prompts_file)), args.set_name, args.kinds, args.per_kind)
    except ValueError as error:
        parser.error(str(error))
    prompts = interleaved(prompts)   # a run stopped early (its report is written after each prompt) covers every kind
    load_before = os.getloadavg()
    engine = load_model(args.model, "cpu", args.dtype)
    if args.profile:
        print(profile_main(args, argv, engine, prompts, load_before))
        return
    stock = load_stock(engine.source, engine.dtype)
    if stock is engine.model:
        raise AssertionError("the stock model must be transformers' own object, not the engine's")
    eos_id = engine.tokenizer.eos_token_id
    lookups = list(args.drafts)
    arms = [HF_PLAIN, HF_LOOKUP, ENGINE_PLAIN, *lookups]
    first = encode(engine, prompts[0])
    for threads in args.threads:           # warm every arm (and measure the verify-cost curve) at each count
        torch.set_num_threads(threads)
        speed.active().warm(engine.model)
        for arm in arms:
            run_arm(arm, engine, stock, first, args.k, 8, eos_id)
    results = []
    for prompt in prompts:
        ids = encode(engine, prompt)
        runs = {threads: {arm: [] for arm in arms} for threads in args.threads}
        for repeat in range(args.repeats):
            for threads in args.threads:
                torch.set_num_threads(threads)
                for arm in rotated(arms, repeat):
                    runs[threads][arm].append(run_arm(arm, engine, stock, ids, args.k, args.tokens, eos_id))
        for threads in args.threads:
            reference = runs[threads][HF_PLAIN][0].tokens
            identical = all(x.tokens == reference for arm in arms for x in runs[threads][arm])
            results.append({"threads": threads, "prompt": prompt.name, "kind": prompt.kind, "runs": runs[threads],
                            "identical": identical})
            print(cell_rows(results[-1:], lookups).splitlines()[-1], flush=True)
        report = write_report(args, argv, engine, results, lookups, arms, load_before, len(prompts))
    print("\n" + report)


def profile_run(arm: str, engine, prompt_ids, k: int, tokens: int, eos_id: int) -> tuple[RoundProfile, object]:
    """One engine run of a draft arm under the round profile: (the profile, the GenerationResult)."""
    name, k = arm_k(arm, k)
    name, _, full = name.partition("/")
    decoder = SpeculativeDecoder(engine.model, make_drafter(name, engine, None, fixed_length=full == "full"))
    with RoundProfile(decoder) as profile:           # decoded as the timed arms are: nothing built for a view
        result = decoder.generate(prompt_ids, k=k, max_new_tokens=tokens, sampling=GREEDY, eos_token_id=eos_id,
                                  display=False)
    return profile, result


def profile_main(args, argv, engine, prompts: list[Prompt], load_before) -> str:
    """--profile: per thread count, plain decoding and each draft arm on every prompt, `--repeats` times, the arms'
    rounds profiled; the parts summed over prompts and repeats, in plain steps of the same prompts' plain runs. The
    report is rewritten after every prompt (a run stopped early leaves what it measured, marked partial)."""
    eos_id = engine.tokenizer.eos_token_id
    first = encode(engine, prompts[0])
    done: list[str] = []
    text = ""
    for threads in args.threads:
        torch.set_num_threads(threads)
        speed.active().warm(engine.model)
        for arm in args.drafts:                                  # warm-up, and the verify-cost curve at this count
            profile_run(arm, engine, first, args.k, 8, eos_id)
        totals = {arm: {"arm": arm, "rounds": 0, "tokens": 0, "parts": dict.fromkeys(PARTS_ORDER, 0.0)}
                  for arm in args.drafts}
        plain = {"seconds": 0.0, "steps": 0, "identical": True}
        rows = {arm: {} for arm in args.drafts}
        for measured, prompt in enumerate(prompts, 1):
            profile_prompt(args, engine, encode(engine, prompt), eos_id, totals, plain, rows)
            print(f"threads {threads}: {prompt.name} profiled", flush=True)
            partial = "" if measured == len(prompts) else f" **Partial: {measured} of {len(prompts)} prompts.**"
            section = profile_section(threads, totals, plain, rows) + partial
            text = profile_write(args, argv, engine, prompts, load_before, done + [section])
        done.append(section)
    return text


def profile_prompt(args, engine, ids, eos_id: int, totals: dict, plain: dict, rows: dict) -> None:
    """One prompt's plain runs and profiled arm runs, `--repeats` times, added to the running sums."""
    for repeat in range(args.repeats):
        baseline = autoregressive_generate(engine.model, ids, max_new_tokens=args.tokens, sampling=GREEDY,
                                           eos_token_id=eos_id)
        steps = max(len(baseline.tokens) - 1, 1)
        plain["seconds"] += plain_step_seconds(baseline) * steps
        plain["steps"] += steps
        for arm in rotated(list(args.drafts), repeat):
            profile, result = profile_run(arm, engine, ids, args.k, args.tokens, eos_id)
            plain["identical"] &= result.tokens == baseline.tokens
            total = totals[arm]
            total["rounds"] += profile.rounds
            total["tokens"] += len(result.tokens)
            for part, seconds in profile.parts().items():
                total["parts"][part] += seconds
            for n, values in profile.verify_rows.items():
                rows[arm].setdefault(n, []).extend(values)


def profile_section(threads: int, totals: dict, plain: dict, rows: dict) -> str:
    step = plain["seconds"] / max(plain["steps"], 1)
    for total in totals.values():
        total["plain_step"] = step
    return "\n\n".join([f"Threads {threads}: one plain step {1e3 * step:.1f} ms (decoding time per token of plain "
                         f"decoding over the same prompts); each part per round, in plain steps; every run gave plain "
                         f"decoding's tokens: {'yes' if plain['identical'] else '**no**'}.",
                         profile_table(list(totals.values())), "The verify forward by row count:",
                         rows_table(rows, {arm: step for arm in totals})])


def profile_write(args, argv, engine, prompts, load_before, sections: list[str]) -> str:
    load_after = os.getloadavg()
    command = "python -m spec_engine.bench_hf " + " ".join(argv or [])
    text = "\n\n".join([f"`{command}`: {cpu_model()}, {engine.name} {engine.dtype}, greedy, k = {args.k}, up to "
                         f"{args.tokens} new tokens, {len(prompts)} prompts x {args.repeats} repeats; load average "
                         f"{load_before[0]:.2f} before, {load_after[0]:.2f} after.", *sections])
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    return text


def cost_curves(model, thread_counts: list[int]) -> dict[str, dict]:
    """The verify-cost curve the draft arms sized their trees and drafts by, per thread count: as measured at start-up
    (the warm-up before the first prompt) and as corrected since by the run's timed forwards. Runs of the same code
    differ in tree size mostly by this curve (docs/benchmarks.md, "Runs g to j"), so the report keeps it."""
    threads_now, curves = torch.get_num_threads(), {}
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            curve = sizing.kept_curve(model)
            if curve is not None:
                curves[str(threads)] = {"start-up": [round(c, 3) for c in curve.measured[1:]],
                                        "now": [round(c, 3) for c in curve[1:]], "source": curve.source()}
    finally:
        torch.set_num_threads(threads_now)
    return curves


def curves_text(curves: dict[str, dict]) -> str:
    """The curves as report lines: the cost of 1..17 rows in one-row forwards."""
    lines = [f"Verify-cost curve, {threads} thread{'s' if threads != '1' else ''} (cost of 1, 2, ... rows in one-row "
             f"forwards; trees and drafts are sized by it): at start-up "
             f"{' '.join(f'{c:.2f}' for c in c_['start-up'])}; "
             f"at the end {' '.join(f'{c:.2f}' for c in c_['now'])} ({c_['source']})."
             for threads, c_ in curves.items()]
    return "\n\n".join(lines) if lines else "No verify-cost curve was measured (no arm sized by cost)."


def write_report(args, argv, engine, results: list[dict], lookups: list[str], arms: list[str], load_before,
                 planned: int) -> str:
    """The tables of the prompts measured so far, written to OUT.md / OUT.json after every prompt (a long run on a
    shared machine can be stopped and still leave what it measured, marked partial)."""
    load_after = os.getloadavg()
    done = len({r["prompt"] for r in results})
    meta = {"command": "python -m spec_engine.bench_hf " + " ".join(argv or []), "cpu": cpu_model(),
            "threads": args.threads, "model": engine.name, "dtype": str(engine.dtype), "engine source": engine.source,
            "k": args.k, "tokens": args.tokens, "repeats": args.repeats, "set": args.set_name,
            "prompts": args.prompts_file,
            "prompts measured": done, "prompts planned": planned,
            "hf": f"generate(prompt_lookup_num_tokens={args.k}, max_matching_ngram_size={HF_NGRAM}) on a stock model",
            "load average before (1, 5, 15 min)": load_before, "load average after": load_after,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "verify-cost curves": cost_curves(engine.model, args.threads)}
    partial = "" if done == planned else f" **Partial: {done} of {planned} prompts measured.**"
    text = "\n\n".join([f"`{meta['command']}`: {meta['cpu']}, threads {args.threads}, {engine.name} {engine.dtype}, "
                        f"greedy, k = {args.k}, up to {args.tokens} new tokens (EOS stops), {args.repeats} interleaved "
                        f"repeats; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after.{partial}",
                        "Each cell: median [min-max] over repeats.", cell_rows(results, lookups),
                        summary(results, lookups),
                        "Per kind: speedup over plain decoding, tokens per target forward, acceptance:",
                        kind_table(results, lookups), tree_table(results, lookups),
                        "Where the time goes (medians over prompts and repeats):",
                        time_split(results, arms), curves_text(meta["verify-cost curves"]), json.dumps(meta)])
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        rows = [{**{k: v for k, v in r.items() if k != "runs"},
                 "runs": {arm: [{**x.__dict__, "tok_s": x.tok_s} for x in xs] for arm, xs in r["runs"].items()}}
                for r in results]
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1), encoding="utf-8")
    return text

if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
