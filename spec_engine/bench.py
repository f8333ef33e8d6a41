"""Benchmark harness: speculative decoding vs plain decoding vs Hugging Face assisted generation, measured
in one process, interleaved per prompt and repeat, medians reported. Not a test: run it by hand.

    python -m spec_engine.bench --drafts prompt-lookup eagle --k 2 4 6 8 --temperatures 0 0.7 \
        --repeats 3 --tokens 96 --threads 1 --out bench/results/offline

For each (draft, sampling, k, prompt, repeat) it runs plain decoding, the engine and, where transformers has
an equivalent (`prompt_lookup_num_tokens`, `assistant_model`, `assistant_tokenizer`), `generate()` with the same
models and settings. Ratios are per prompt and repeat (same machine state), then the median over repeats.
Its Hugging Face column runs `generate()` on the engine's own loaded model (the CPU speed layer's modules and
attention), which is not what a user would run instead: the comparison against transformers alone, on its own stock
model, is `python -m spec_engine.bench_hf` (issue #27), and only that one is quoted against Hugging Face.
Runs stop at EOS like a user's would (`--no-eos` forces exactly --tokens tokens).

Every row also carries the cost model of the run: c_draft = draft time per draft token and c_verify = time of a
verify round's target forward, both relative to one plain-decoding step (c_target), and the speedup that the
textbook formula predicts from the measured acceptance a and those measured costs:
    predicted = E[tokens per round](a, n) * c_target / (mean round time),  E = (1 - a^(n+1)) / (1 - a)
averaged over the rounds' draft lengths n, with prefill added to both sides; a is the judged acceptance
(accepted / judged drafts, `spec_engine.core.metrics.judged_acceptance`). `realised / predicted` shows how
far the i.i.d.-acceptance model is from the measured run (bursty drafters such as prompt lookup beat it).

`--target random-llama-1b` (also random-smollm2-135m, random-llama-3b, random-llama-8b, usable as draft names too)
builds a seeded random-weight Llama of that shape with SmolLM2's tokenizer: no download, for the memory-bound regime on
a GPU.
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from spec_engine.accel import lean_llama      # the harness times the CPU's lean forward apart (ForwardClock)
from spec_engine.core import speed
from spec_engine.core.decoder import SpeculativeDecoder, autoregressive_generate
from spec_engine.drafters import PROMPT_LOOKUP_MAX_NGRAM
from spec_engine.drafters.registry import make_drafter, parse_draft
from spec_engine.core.metrics import expected_tokens_per_round
from spec_engine.models import DEFAULT_MODEL, LoadedModel, load_model
from spec_engine.core.sampling import SamplingParams

PROMPTS = {
    "chat": "Give me three practical tips for staying focused while studying.",
    "code": "Write a Python function that merges two sorted lists into one sorted list, with a docstring.",
    "summarise": ("Summarise the following text in two sentences.\n\nThe city council met on Tuesday to discuss the "
                  "new bicycle lanes on Main Street. The council approved the plan to build protected bicycle lanes on "
                  "Main Street, starting in March. The lanes will connect the train station to the university. Local "
                  "shop owners worried about parking, so the council agreed to add a new parking area behind the "
                  "library. The project will cost 2.4 million dollars and should be finished by the end of the year."),
    "edit": ("Fix the spelling mistakes in this text and return the corrected text only.\n\nThe quick brown fox jumpd "
             "over the lazy dog. The dog was not amused, and it barkd loudly at the fox. The fox ran away into the "
             "forrest, where it met a friendly rabbit. Together they walked along the river until the sun went down."),
}


HELD_OUT_FILE = Path(__file__).resolve().parents[1] / "bench" / "data" / "eagle_prompts.json"


def held_out_prompts(n: int, kinds: list[str] | None = None) -> dict[str, str]:
    """The first n held-out prompts of the EAGLE head's prompt set (topics never in its training data), named
    held-out-0 ...; with `kinds`, the first n of each of those kinds (held-out-chat-0 ...)."""
    if n <= 0:
        return {}
    items = json.loads(HELD_OUT_FILE.read_text(encoding="utf-8"))["held_out"]
    if not kinds:
        return {f"held-out-{i}": item["text"] for i, item in enumerate(items[:n])}
    known = sorted({item["kind"] for item in items})
    unknown = [kind for kind in kinds if kind not in known]
    if unknown:
        raise ValueError(f"no held-out prompts of kind {', '.join(unknown)}; the kinds are {', '.join(known)}")
    return {f"held-out-{kind}-{i}": text for kind in kinds
            for i, text in enumerate([item["text"] for item in items if item["kind"] == kind][:n])}


def prompt_group(prompt: str) -> str:
    """held-out-chat-3 -> held-out-chat, held-out-3 -> held-out; a benchmark prompt is its own group."""
    head, _, tail = prompt.rpartition("-")
    return head if prompt.startswith("held-out-") and tail.isdigit() else prompt


@dataclass
class Row:
    draft: str
    temperature: float
    top_p: float
    k: int
    prompt: str
    acceptance: float
    judged_acceptance: float   # accepted / judged drafts: the per-token a of the textbook formula
    accepted_per_round: float
    tokens_per_forward: float
    draft_share: float
    verify_share: float
    overhead_share: float      # time outside model forwards (sampling, verify math, trimming, events, Python)
    spec_tok_s: float
    plain_tok_s: float
    hf_tok_s: float | None
    speedup_vs_plain: float
    speedup_vs_hf: float | None
    new_tokens: int
    c_target_ms: float         # one plain-decoding step (a 1-token target forward + sampling)
    c_draft: float             # draft time per draft token / c_target
    c_verify: float            # verify time per round (target forward over n + 1 tokens + rule) / c_target
    predicted_speedup: float   # textbook formula from measured acceptance and measured costs (see module doc)
    realised_over_predicted: float
    tree_longer_share: float | None = None     # greedy tree rounds whose accepted path beat their top-1 spine's
    tree_path_per_round: float | None = None   # accepted nodes per tree round ...
    spine_per_round: float | None = None       # ... and what the top-1 spine alone would have had accepted
    tree_nodes: float | None = None            # nodes per tree round


def hf_kwargs(spec, k: int, target, draft, hf_assistant) -> dict | None:
    """The `generate()` arguments of transformers' own equivalent of this draft, or None if it has none."""
    if spec.mode == "prompt-lookup":
        return {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": spec.arg or PROMPT_LOOKUP_MAX_NGRAM}
    if spec.mode == "same-tokenizer":
        return {"assistant_model": hf_assistant}
    if spec.mode == "cross-tokenizer":
        return {"assistant_model": hf_assistant, "tokenizer": target.tokenizer, "assistant_tokenizer": draft.tokenizer}
    return None


def hf_assistant_for(spec, draft):
    """transformers' universal assisted generation rewires the assistant model it is given (measured here:
    our own later forwards on the same Gemma object then fail), so HF gets its own copy."""
    if spec.mode == "cross-tokenizer":
        return copy.deepcopy(draft.model)
    return draft.model if draft is not None else None


def hf_generate(target, prompt_ids, sampling: SamplingParams, tokens: int, seed: int, extra: dict, k: int,
                eos: bool) -> tuple[float, int]:
    if "assistant_model" in extra:
        extra["assistant_model"].generation_config.num_assistant_tokens = k
        extra["assistant_model"].generation_config.num_assistant_tokens_schedule = "constant"
    sample = {"do_sample": False} if sampling.greedy else {
        "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
    torch.manual_seed(seed)
    start = time.perf_counter()
    stop = {"eos_token_id": target.tokenizer.eos_token_id} if eos else {"min_new_tokens": tokens}
    out = target.model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=tokens,
                                pad_token_id=target.tokenizer.eos_token_id, **stop, **sample, **extra)
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    return time.perf_counter() - start, int(out.shape[1] - prompt_ids.shape[1])


class ForwardClock:
    """Wall time spent inside the forwards of the given modules (forward hooks, and the engine's lean forwards of
    them, which do not call the module), so the engine's own overhead (sampling math, trimming, events, Python)
    is total time minus model time."""

    def __init__(self, modules):
        self.seconds, self._start, self._handles = 0.0, {}, []
        # A layer-skip view is a shallow copy of the target and shares its hook dicts: hook those once.
        hooked = {id(m._forward_hooks): m for m in modules if m is not None}
        for module in hooked.values():
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))
        self._lean_forward = lean_llama.forward_logits
        lean_llama.forward_logits = self._timed_lean_forward(set(hooked))

    def _timed_lean_forward(self, hooked: set[int]):
        lean_forward = self._lean_forward

        def timed(model, *args, **kwargs):
            start = time.perf_counter()
            try:
                return lean_forward(model, *args, **kwargs)
            finally:
                if id(model._forward_hooks) in hooked:
                    self.seconds += time.perf_counter() - start
        return timed

    def _pre(self, module, args):
        self._start[id(module)] = time.perf_counter()

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._start.pop(id(module), time.perf_counter())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        lean_llama.forward_logits = self._lean_forward


def measure(target, draft, spec, prompt_ids, sampling, k, tokens, seed, hf_assistant, with_hf: bool,
            eos: bool = True) -> dict:
    eos_id = target.tokenizer.eos_token_id if eos else None
    plain = autoregressive_generate(target.model, prompt_ids, max_new_tokens=tokens, sampling=sampling, seed=seed,
                                    eos_token_id=eos_id)
    drafter = make_drafter(spec, target, draft)
    decoder = SpeculativeDecoder(target.model, drafter)
    clock = ForwardClock([target.model] + drafter.model_modules())
    try:
        result = decoder.generate(prompt_ids, k=k, max_new_tokens=tokens, sampling=sampling, seed=seed,
                                  eos_token_id=eos_id, display=False)
    finally:
        clock.close()
    hf = None
    extra = hf_kwargs(spec, k, target, draft, hf_assistant) if with_hf else None
    if extra is not None:
        hf_seconds, hf_tokens = hf_generate(target, prompt_ids, sampling, tokens, seed, extra, k, eos)
        hf = hf_tokens / hf_seconds
    s = result.stats
    return {"acceptance": s.acceptance_rate, "judged_acceptance": s.judged_acceptance,
            "accepted_per_round": s.accepted / max(s.rounds, 1),
            "tokens_per_forward": s.tokens_per_round, "draft_share": s.draft_seconds / result.total_seconds,
            "verify_share": s.verify_seconds / result.total_seconds,
            "overhead_share": 1 - clock.seconds / result.total_seconds, "spec_tok_s": s.tokens_per_second,
            "plain_tok_s": plain.tokens_per_second, "hf_tok_s": hf,
            "speedup_vs_plain": s.tokens_per_second / plain.tokens_per_second,
            "speedup_vs_hf": None if hf is None else s.tokens_per_second / hf, "new_tokens": s.new_tokens,
            **cost_model(result, plain),
            **(tree_gain(result.rounds, result.tokens) if sampling.greedy else tree_gain([], []))}


def spine_accepted(event, continuation: list[int]) -> int:
    """Greedy tree round: how many nodes of its top-1 spine (the first child of the root, then of that node, ...)
    match the target's argmax, i.e. what a chain of the drafter's first choices, as deep as the spine, would have had
    accepted. `continuation`: the run's tokens from this round on, which under greedy decoding are the target's
    argmax after each matched node (so the measure needs no display part of the event: `display=False` runs too)."""
    parents = event.tree_parents
    node, accepted = -1, 0
    while True:
        child = next((i for i, parent in enumerate(parents) if parent == node), None)
        if child is None or accepted >= len(continuation) or event.drafted[child] != continuation[accepted]:
            return accepted
        node, accepted = child, accepted + 1


def tree_gain(rounds, tokens: list[int]) -> dict:
    """Over a greedy run's tree rounds (`rounds`, and the run's new `tokens`): the share whose accepted path was
    longer than its top-1 spine's accepted prefix (a second choice somewhere paid off), the accepted tokens per round
    of the path and of the spine, and the mean node count; Nones when the run had no tree rounds."""
    trees, spines, offset = [], [], 0
    for r in rounds:
        if r.tree_parents:
            trees.append(r)
            spines.append(spine_accepted(r, tokens[offset:]))
        offset += len(r.emitted)
    if not trees:
        return {"tree_longer_share": None, "tree_path_per_round": None, "spine_per_round": None, "tree_nodes": None}
    return {"tree_longer_share": statistics.fmean(len(r.tree_path) > s for r, s in zip(trees, spines)),
            "tree_path_per_round": statistics.fmean(len(r.tree_path) for r in trees),
            "spine_per_round": statistics.fmean(spines), "tree_nodes": statistics.fmean(len(r.drafted) for r in trees)}


def cost_model(result, plain) -> dict:
    """Measured unit costs of the run and the speedup the i.i.d.-acceptance formula predicts from them."""
    rounds = result.rounds
    c_target = statistics.median(plain.step_seconds) if plain.step_seconds else plain.total_seconds
    drafted = sum(len(r.drafted) for r in rounds)
    c_draft = sum(r.draft_seconds for r in rounds) / max(drafted, 1)
    c_verify = statistics.mean(r.verify_seconds for r in rounds)
    a = result.stats.judged_acceptance
    expected = statistics.mean(expected_tokens_per_round(a, len(r.drafted)) for r in rounds)
    round_seconds = statistics.mean(r.round_seconds for r in rounds)
    predicted_seconds = result.prefill_seconds + result.stats.new_tokens / expected * round_seconds
    predicted = (result.stats.new_tokens / predicted_seconds) / plain.tokens_per_second
    realised = result.stats.tokens_per_second / plain.tokens_per_second
    return {"c_target_ms": c_target * 1e3, "c_draft": c_draft / c_target, "c_verify": c_verify / c_target,
            "predicted_speedup": predicted, "realised_over_predicted": realised / predicted}


def median_row(samples: list[dict]) -> dict:
    out = {}
    for key in samples[0]:
        values = [s[key] for s in samples if s[key] is not None]
        out[key] = statistics.median(values) if values else None
    return out


def group_summary(rows: list[Row]) -> str:
    """Per (draft, T, k, group of two or more prompts): geometric mean and range of the speedup vs plain, and
    mean acceptance and tokens per forward; "" when no group has two prompts."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.draft, r.temperature, r.top_p, r.k, prompt_group(r.prompt)), []).append(r)
    lines = [f"| {draft} | {t:g} / {top_p:g} | {k} | {group} ({len(rs)}) | "
             f"{statistics.fmean(r.acceptance for r in rs):.2f} | "
             f"{statistics.fmean(r.tokens_per_forward for r in rs):.2f} | "
             f"**{statistics.geometric_mean(r.speedup_vs_plain for r in rs):.2f}x** | "
             f"{min(r.speedup_vs_plain for r in rs):.2f}-{max(r.speedup_vs_plain for r in rs):.2f}x |"
             for (draft, t, top_p, k, group), rs in groups.items() if len(rs) > 1]
    if not lines:
        return ""
    return "\n".join(["| draft | T / top-p | k | group (prompts) | mean acceptance | mean tokens/forward "
                      "| vs plain (geometric mean) | vs plain (range) |", "|---|---|---|---|---|---|---|---|"] + lines)


def tree_summary(rows: list[Row]) -> str:
    """Per (draft, k, group) with greedy tree rounds: mean nodes per round, accepted per round along the path kept and
    along the top-1 spine alone, and the share of rounds in which the tree's path was the longer; "" when none."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.tree_longer_share is not None:
            groups.setdefault((r.draft, r.k, prompt_group(r.prompt)), []).append(r)
    if not groups:
        return ""
    mean = lambda rs, f: statistics.fmean(getattr(r, f) for r in rs)
    return "\n".join(["| draft | k | group (prompts) | nodes per round | accepted per round (path) | accepted per "
                      "round (top-1 spine) | rounds where the path beat the spine |", "|---|---|---|---|---|---|---|"] +
                     [f"| {draft} | {k} | {group} ({len(rs)}) | {mean(rs, 'tree_nodes'):.1f} | "
                      f"{mean(rs, 'tree_path_per_round'):.2f} | {mean(rs, 'spine_per_round'):.2f} | "
                      f"{mean(rs, 'tree_longer_share'):.0%} |" for (draft, k, group), rs in groups.items()])


def markdown(rows: list[Row]) -> str:
    head = ("| draft | T / top-p | k | prompt | acceptance | tokens/forward | draft cost | verify cost | spec tok/s "
            "| plain tok/s | HF tok/s | vs plain | vs HF | predicted | overhead |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f="{:.2f}": "–" if v is None else f.format(v)
    lines = [f"| {r.draft} | {r.temperature:g} / {r.top_p:g} | {r.k} | {r.prompt} | {r.acceptance:.2f} | "
             f"{r.tokens_per_forward:.2f} | {r.c_draft:.2f} | {r.c_verify:.2f} | {r.spec_tok_s:.1f} | "
             f"{r.plain_tok_s:.1f} | {fmt(r.hf_tok_s, '{:.1f}')} | **{r.speedup_vs_plain:.2f}x** | "
             f"{fmt(r.speedup_vs_hf, '{:.2f}x')} | {r.predicted_speedup:.2f}x | {r.overhead_share:.1%} |" for r in rows]
    return "\n".join([head] + lines)


# real shapes, random weights: SmolLM2-135M, SmolLM2-1.7B, a 3B of the Llama-3.2 shape, Llama-3.1-8B's layers (its
# vocabulary is SmolLM2's 49152 here, not 128256)
RANDOM_SIZES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, tie_word_embeddings=True),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                     num_key_value_heads=32, tie_word_embeddings=True),
    "llama-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                     num_key_value_heads=8, tie_word_embeddings=False),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
}
RANDOM_PREFIX = "random-"


def random_tokenizer():
    """SmolLM2's tokenizer: from $SPEC_TOKENIZER_DIR (bench/gpu_prepare.sh saves it there for machines without
    the packaged GGUF), else from the offline default."""
    import os
    if os.environ.get("SPEC_TOKENIZER_DIR"):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(os.environ["SPEC_TOKENIZER_DIR"])
    return load_model(DEFAULT_MODEL, device="cpu", dtype="float32").tokenizer


def random_target(name: str, device=None, dtype=None, tokenizer=None) -> LoadedModel:
    """`random-llama-1b`: a seeded random-weight Llama of a real shape with SmolLM2's tokenizer (vocabulary 49152).
    Its text is noise, but a forward costs what a real model of the size costs: the memory-bound regime of a GPU
    without a download. The same name always gives the same weights, so `--drafts random-smollm2-135m` with
    `--target random-smollm2-135m` is a self-draft (acceptance 1 under greedy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from spec_engine.models import resolve_device, resolve_dtype
    size = name.removeprefix(RANDOM_PREFIX)
    if size not in RANDOM_SIZES:
        raise ValueError(f"unknown random model {name!r}; "
                         f"choose from {', '.join(RANDOM_PREFIX + k for k in RANDOM_SIZES)}")
    tokenizer = tokenizer or random_tokenizer()
    device = resolve_device(device)
    config = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **RANDOM_SIZES[size])
    if dtype is None and device.type != "cpu":      # the size decides the default on an accelerator, as for load_model
        with torch.device("meta"):
            dtype = resolve_dtype(None, device, sum(p.numel() for p in LlamaForCausalLM(config).parameters()))
    dtype = resolve_dtype(dtype, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype=dtype).eval().requires_grad_(False)
    speed.use_from_env().adopt(model)    # as load_model does
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, source=f"random weights, {size} shape",
                       device=device, dtype=dtype, load_seconds=0.0)


def load_any(name: str, device, dtype) -> LoadedModel:
    return random_target(name, device, dtype) if name.startswith(RANDOM_PREFIX) else load_model(name, device, dtype)


COLUMNS = """Columns: acceptance = accepted / drafted; tokens/forward = tokens per target verify forward; draft cost =
draft time per draft token and verify cost = verify time per round, both in units of one plain-decoding step;
vs plain / vs HF = tokens/s ratios measured in the same process (median over repeats); predicted = the textbook
speedup from the measured acceptance and costs; overhead = share of engine time outside model forwards."""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m spec_engine.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "--target", dest="model", default=DEFAULT_MODEL,
                        help="preset, directory, hub id, or random-smollm2-135m / random-llama-1b / random-llama-3b / "
                             "random-llama-8b")
    parser.add_argument("--drafts", nargs="+", default=["prompt-lookup", "eagle", "layer-skip"])
    parser.add_argument("--k", nargs="+", type=int, default=[2, 4, 6, 8])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    parser.add_argument("--top-p", type=float, default=0.9, help="used with temperatures > 0")
    parser.add_argument("--prompts", nargs="*", default=list(PROMPTS), choices=list(PROMPTS))
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="also the first N held-out prompts of bench/data/eagle_prompts.json (held-out-0 ...)")
    parser.add_argument("--held-out-kinds", nargs="+", default=None, metavar="KIND",
                        help="with --held-out N: the first N held-out prompts of each kind (chat, code, explain, list, "
                             "rewrite, creative), named held-out-KIND-0 ...; a table per kind follows the rows")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face assisted generation")
    parser.add_argument("--no-eos", action="store_true", help="always generate --tokens tokens, ignoring EOS")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    try:
        held_out = held_out_prompts(args.held_out, args.held_out_kinds)
    except ValueError as error:
        parser.error(str(error))
    prompts = {name: PROMPTS[name] for name in args.prompts} | held_out
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_any(args.model, args.device, args.dtype)
    speed.active().warm(target.model)    # the speed layer's lazy state made now, not inside a measured run
    drafts = {}
    for name in args.drafts:
        spec = parse_draft(name)
        draft = load_any(spec.model, target.device, target.dtype) if spec.needs_model else None
        if draft is not None:
            speed.active().warm(draft.model)
        drafts[name] = (spec, draft, hf_assistant_for(spec, draft))
    rows, eos = [], not args.no_eos
    for name, (spec, draft, hf_assistant) in drafts.items():
        for temperature in args.temperatures:
            sampling = SamplingParams(temperature, 0, args.top_p if temperature > 0 else 1.0)
            for k in args.k:
                for prompt_name, prompt_text in prompts.items():
                    prompt_ids = target.encode_prompt(prompt_text)
                    measure(target, draft, spec, prompt_ids, sampling, k, 8, 0, hf_assistant, not args.no_hf,
                            eos)  # warm-up
                    samples = [measure(target, draft, spec, prompt_ids, sampling, k, args.tokens, seed, hf_assistant,
                                       not args.no_hf, eos)
                               for seed in range(args.repeats)]
                    rows.append(Row(name, temperature, sampling.top_p, k, prompt_name, **median_row(samples)))
                    print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    table = markdown(rows)
    summary = group_summary(rows)
    if summary:
        table += "\n\n" + summary
    trees = tree_summary(rows)
    if trees:
        table += "\n\n" + trees
    meta = {"model": target.name, "dtype": str(target.dtype), "device": str(target.device), "tokens": args.tokens,
            "eos": eos, "repeats": args.repeats, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": platform.machine(),
            "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None,
            "command": "python -m spec_engine.bench " + " ".join(argv or [])}
    print("\n" + table)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(f"{table}\n\n{COLUMNS}\n\n{json.dumps(meta)}\n")
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
