"""Three ways to share a weight read, measured side by side on one target in one process.

Decoding one token reads every weight once, so a small model's tokens per second are bound by bytes read per token.
Three ways cut that: **quantization** reads fewer bytes per weight (and changes the model: its text may differ from
the full-precision model's), **batching** shares one read across users (B sequences, one forward), **speculation**
shares one read across future positions of one user (drafted tokens verified in one forward; the text is the plain
model's, greedy identity checked here). `measure` runs the arms interleaved (plain, batch, speculation, each quantized
copy; then again, `repeats` times) so that a slow spell of a shared machine touches every arm alike, and yields the
rows so far after every run: medians with min-max spreads, all from runs, nothing assumed.

Every arm decodes greedily exactly `tokens` new tokens (no end-of-text stop), so their texts compare position by
position. The defaults (16 tokens, 8 sequences, 3 repeats) are sized to keep a measurement of the 135M offline model
under a minute on two idle CPU cores; on a shared, loaded machine it takes several times longer.
"""
from __future__ import annotations

import statistics
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from spec_engine.core import speed
from spec_engine.core.batch import BatchDecoder, Idle, Request
from spec_engine.core.decoder import SpeculativeDecoder, autoregressive_generate
from spec_engine.core.drafting import Drafter
from spec_engine.core.sampling import SamplingParams

SCHEMES = ("bf16", "int8", "int4")
DEFAULT_TOKENS = 16
DEFAULT_BATCH = 8
DEFAULT_REPEATS = 3
WAYS = {"plain": "none", "batch": "batching", "speculation": "speculation",
        **{scheme: "quantization" for scheme in SCHEMES}, "batch+speculation": "combination",
        "self-draft": "combination"}
SELF_DRAFT_K = 3                    # the quantized self-draft's chain: a bf16 copy agrees with fp32 on most tokens
GREEDY = SamplingParams(0.0)
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # target -> {scheme: (copy, reason)}
_COPIES_LOCK = threading.Lock()


@dataclass(frozen=True)
class Sample:
    """One run of one arm: every sequence's new tokens, the wall seconds, one sequence's seconds, and the target
    forwards that produced the tokens (the weight reads)."""
    tokens: list[list[int]]
    seconds: float
    latency: float
    forwards: int
    drafted: int = 0                    # draft tokens proposed; each read the draft model once (a self-draft's copy)


@dataclass(frozen=True)
class WayRow:
    arm: str                            # "plain", "batch", "speculation" or a quantization scheme
    way: str                            # "none" | "batching" | "speculation" | "quantization"
    label: str
    reason: str = ""                    # why the arm did not run ("not available: ..."); "" when it ran
    runs: int = 0
    tokens_per_second: float = 0.0      # median over the runs (all sequences' tokens)
    low: float = 0.0                    # min and max over the runs
    high: float = 0.0
    speedup: float = 0.0                # median of tokens_per_second / plain's, paired by repeat
    latency: float = 0.0                # median seconds one sequence waits for its tokens
    tokens_per_read: float = 0.0        # new tokens per target forward (one read of every weight)
    bytes_per_token: float = 0.0        # weight bytes read per new token = weight bytes / tokens_per_read
    bytes_per_weight: float = 0.0
    same_text: bool | None = None       # every sequence of every run decoded plain fp32 decoding's text
    first_divergence: int | None = None  # the first position (0-based) that differed from it; None: none did
    top1: float | None = None           # a quantized copy on held-out text: the share of positions whose argmax is
    kl: float | None = None             # the full model's, and the mean KL(full || copy) in nats (teacher-forced)

    @property
    def available(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class Update:
    rows: list[WayRow]
    done: int                           # runs finished
    total: int
    text: str
    samples: dict = field(default_factory=dict, repr=False)


def weight_bytes(model) -> int:
    """Weight bytes one decoding forward reads (`read_per_forward`)."""
    return read_per_forward(model)[0]


def weight_count(model) -> int:
    """Weights one decoding forward reads, counted as `weight_bytes` counts their bytes."""
    return read_per_forward(model)[1]


def read_per_forward(model) -> tuple[int, int]:
    """(bytes, elements) one decoding forward reads: every parameter and buffer once (tied tensors once), and of the
    input embedding table one row (unless it is also the LM head, read whole)."""
    embedding = model.get_input_embeddings().weight
    head = getattr(model.get_output_embeddings(), "weight", None)
    rows_only = head is None or embedding.data_ptr() != head.data_ptr()
    seen = {embedding.data_ptr()} if rows_only else set()
    size, count = (embedding[0].numel() * embedding.element_size(), embedding[0].numel()) if rows_only else (0, 0)
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_meta or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        size += tensor.numel() * tensor.element_size()
        count += tensor.numel()
    return size, count


def quantized_target(model, scheme: str):
    """(a quantized copy of `model` under `scheme`, "") or (None, "not available: <reason>"). The one place this
    module calls the engine's quantization (spec_engine.models.quantize.quantized_copy), prepared by the speed layer
    as a loaded model is (bf16 keeps the lean forward). Copies are kept per target and scheme, all three at once (the
    quantized self-draft's shared copy keeps one scheme), so measuring again does not quantize again."""
    with _COPIES_LOCK:
        cache = _COPIES.setdefault(model, {})
        if scheme not in cache:
            cache[scheme] = _quantize(model, scheme)
        return cache[scheme]


def _quantize(model, scheme: str):
    try:
        from spec_engine.models.quantize import quantized_copy
    except ImportError as exc:
        return None, f"not available: this engine has no quantized targets ({exc})"
    try:
        if scheme == "bf16":        # the quantized self-draft's own copy: one bf16 copy in memory, not two
            from spec_engine.drafters.quantized import shared_copy
            return shared_copy(model, "bf16"), ""
        copy = quantized_copy(model, scheme)
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        return None, f"not available: {exc}"
    layer = speed.active()
    layer.adopt(copy)
    layer.warm(copy)
    return copy, ""


@torch.inference_mode()
def agreement(model, reference, texts: list[torch.Tensor]) -> tuple[float, float]:
    """How `model` (a quantized copy) changed from `reference` on held-out `texts` ([1, T] ids each), teacher-forced:
    (share of positions whose argmax is the reference's, mean KL(reference || model) in nats per position)."""
    same, kl, positions = 0, 0.0, 0
    for ids in texts:
        ref = torch.log_softmax(reference(input_ids=ids).logits[0].double(), dim=-1)       # [T, vocab]
        out = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        same += int((ref.argmax(-1) == out.argmax(-1)).sum())
        kl += float((ref.exp() * (ref - out)).sum())
        positions += ids.shape[1]
    return same / positions, kl / positions


def run_plain(model, input_ids: torch.Tensor, tokens: int) -> Sample:
    result = autoregressive_generate(model, input_ids, tokens, GREEDY)
    return Sample([result.tokens], result.total_seconds, result.total_seconds, 1 + len(result.step_seconds))


def run_batch(model, input_ids: torch.Tensor, tokens: int, batch: int,
              make_drafter: Callable[[], Drafter] | None = None, k: int = 1) -> Sample:
    """`batch` sequences of the same prompt decoded together: one forward per round for all. Without `make_drafter`
    none drafts (plain batching); with it each drafts as it would alone (draft_length "fixed"), every sequence's
    drafts verified in that one forward."""
    decoder = BatchDecoder(model, draft_length="off" if make_drafter is None else "fixed")
    clock = _clock(model)
    start = clock()
    results = decoder.run([Request(i, input_ids, make_drafter() if make_drafter else Idle("none"), k=k,
                                   max_new_tokens=tokens, sampling=GREEDY) for i in range(batch)])
    seconds = clock() - start
    ordered = [results[i] for i in range(batch)]
    forwards = max(len(r.rounds) for r in ordered)      # every token comes from a round (the prefill feeds prompt[:-1])
    return Sample([r.tokens for r in ordered], seconds, statistics.median(r.total_seconds for r in ordered),
                  forwards)


def run_speculation(model, input_ids: torch.Tensor, tokens: int, drafter: Drafter, k: int) -> Sample:
    result = SpeculativeDecoder(model, drafter).generate(input_ids, k=k, max_new_tokens=tokens, sampling=GREEDY,
                                                         display=False)
    return Sample([result.tokens], result.total_seconds, result.total_seconds, len(result.rounds),
                  sum(len(r.drafted) for r in result.rounds))


def _clock(model) -> Callable[[], float]:
    from spec_engine.core import timing
    device = model.device
    return lambda: timing.clock(device)


LABELS = {"plain": "plain decoding (fp32, 1 user)", "batch": "batching ({batch} users)",
          "speculation": "speculation ({draft})", "bf16": "quantization: bf16", "int8": "quantization: int8",
          "int4": "quantization: int4", "batch+speculation": "batching + speculation ({batch} users, {draft})",
          "self-draft": "speculation, a bf16 copy of the target as its draft"}


def measure(target, input_ids: torch.Tensor, make_drafter: Callable[[], Drafter], k: int, draft: str = "draft",
            tokens: int = DEFAULT_TOKENS, batch: int = DEFAULT_BATCH, repeats: int = DEFAULT_REPEATS,
            schemes=SCHEMES, should_stop: Callable[[], bool] | None = None,
            quantize=quantized_target, make_self_draft: Callable[[], Drafter] | None = None,
            held_out: list[torch.Tensor] = ()) -> Iterator[Update]:
    """Measure the arms interleaved, `repeats` passes (module docstring); an Update after every run. `make_drafter`
    gives a fresh drafter for each speculative run; `quantize(target, scheme)` -> (model or None, reason). Two
    combinations run too: speculation inside the batch, and, given `make_self_draft` (a quantized copy of the target
    as its draft), speculation by it: the full-precision text at whatever pace the copy's drafts give. `held_out`:
    texts ([1, T] ids) on which each quantized copy's top-1 agreement and KL with the target are measured."""
    if tokens < 2 or batch < 2 or repeats < 1:
        raise ValueError(f"need tokens >= 2, batch >= 2 and repeats >= 1, got {tokens}, {batch}, {repeats}")
    arms: dict[str, Callable[[], Sample] | None] = {
        "plain": lambda: run_plain(target, input_ids, tokens),
        "batch": lambda: run_batch(target, input_ids, tokens, batch),
        "speculation": lambda: run_speculation(target, input_ids, tokens, make_drafter(), k),
        "batch+speculation": lambda: run_batch(target, input_ids, tokens, batch, make_drafter, k)}
    warm_ups = {"plain": lambda: run_plain(target, input_ids, 2), "batch": lambda: run_batch(target, input_ids, 2, 2),
                "speculation": lambda: run_speculation(target, input_ids, 2, make_drafter(), k),
                "batch+speculation": lambda: run_batch(target, input_ids, 2, 2, make_drafter, k)}
    if make_self_draft is not None:
        arms["self-draft"] = lambda: run_speculation(target, input_ids, tokens, make_self_draft(), SELF_DRAFT_K)
        warm_ups["self-draft"] = lambda: run_speculation(target, input_ids, 2, make_self_draft(), SELF_DRAFT_K)
    order = [arm for arm in arms if WAYS[arm] != "combination"] + list(schemes) + \
        [arm for arm in arms if WAYS[arm] == "combination"]
    labels = {arm: LABELS[arm].format(batch=batch, draft=draft) for arm in order}
    bytes_read = {arm: weight_bytes(target) for arm in arms}
    draft_read: dict[str, int] = {}                 # a self-draft's copy, read once per draft token
    changed: dict[str, tuple[float, float]] = {}    # a quantized copy's (top-1 agreement, KL) on held-out text
    reasons: dict[str, str] = {}
    for scheme in schemes:
        yield Update([], 0, 0, f"Making the {scheme} copy of the target (once per target)…")
        copy, reason = quantize(target, scheme)
        if copy is None:
            reasons[scheme] = reason or "not available"
            continue
        arms[scheme] = (lambda m: lambda: run_plain(m, input_ids, tokens))(copy)
        warm_ups[scheme] = (lambda m: lambda: run_plain(m, input_ids, 2))(copy)
        bytes_read[scheme] = weight_bytes(copy)
        if held_out:
            changed[scheme] = agreement(copy, target, list(held_out))
        if scheme == "bf16" and "self-draft" in arms:
            draft_read["self-draft"] = weight_bytes(copy)
    yield Update([], 0, 0, "Warming up: one short untimed run of each arm (first-use costs stay out of the timings)…")
    for warm in warm_ups.values():      # two tokens each: weights packed, kernels compiled, a draft head loaded
        warm()
    samples: dict[str, list[Sample]] = {arm: [] for arm in arms}
    total, done = repeats * len(arms), 0
    for repeat in range(repeats):
        for arm, run in arms.items():
            if should_stop is not None and should_stop():
                return
            samples[arm].append(run())
            done += 1
            rows = table(samples, labels, reasons, bytes_read, weight_count(target), draft_read, changed)
            yield Update(rows, done, total, f"{labels[arm]}: run {repeat + 1} of {repeats}", samples)


def table(samples: dict[str, list[Sample]], labels: dict[str, str], reasons: dict[str, str],
          bytes_read: dict[str, int], weights: int, draft_read: dict[str, int] | None = None,
          changed: dict[str, tuple[float, float]] | None = None) -> list[WayRow]:
    """One row per arm in `labels` order, from the runs so far (an arm with no run yet is left out)."""
    plain = samples.get("plain", [])
    reference = plain[0].tokens[0] if plain else None
    rows = []
    for arm, label in labels.items():
        if arm in reasons:
            rows.append(WayRow(arm, WAYS[arm], label, reason=reasons[arm]))
        elif samples.get(arm):
            row = way_row(arm, label, samples[arm], plain, reference, bytes_read[arm], weights,
                          (draft_read or {}).get(arm, 0))
            if arm in (changed or {}):
                row = replace(row, top1=changed[arm][0], kl=changed[arm][1])
            rows.append(row)
    return rows


def way_row(arm: str, label: str, runs: list[Sample], plain: list[Sample], reference, read: int,
            weights: int, draft_read: int = 0) -> WayRow:
    """`read`: this arm's model's weight bytes per forward; `weights`: the full-precision target's weights read;
    `draft_read`: the bytes a draft token reads (a self-draft's copy; an EAGLE head's small reads are left out)."""
    rates = [sum(len(t) for t in s.tokens) / s.seconds for s in runs]
    plain_rates = [sum(len(t) for t in s.tokens) / s.seconds for s in plain]
    paired = [r / p for r, p in zip(rates, plain_rates)]
    per_read = statistics.median(sum(len(t) for t in s.tokens) / s.forwards for s in runs)
    per_token = statistics.median((read * s.forwards + draft_read * s.drafted) / sum(len(t) for t in s.tokens)
                                  for s in runs)
    divergence = None
    if reference is not None:
        firsts = [first_difference(t, reference) for s in runs for t in s.tokens]
        found = [d for d in firsts if d is not None]
        divergence = min(found) if found else None
    return WayRow(arm, WAYS[arm], label, runs=len(runs), tokens_per_second=statistics.median(rates), low=min(rates),
                  high=max(rates), speedup=statistics.median(paired) if paired else 0.0,
                  latency=statistics.median(s.latency for s in runs), tokens_per_read=per_read,
                  bytes_per_token=per_token, bytes_per_weight=read / weights,
                  same_text=None if reference is None else divergence is None, first_divergence=divergence)


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where `tokens` and `reference` differ (a shorter one differs where it ends); None if equal."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))
