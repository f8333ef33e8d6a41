"""EAGLE (Li et al. 2024): a feature-level draft head distilled from the target, adapted to small targets on CPU.

The head reads the target's final hidden states (post-norm: what the LM head reads) and predicts the next one:

    pair t:  (feature f_t, embedding of token t+1)  ->  fc: Linear(2H -> H)  ->  one Llama decoder layer  ->  RMSNorm
             ->  predicted feature f^_{t+1}  ->  logits for token t+2 from the target's LM-head rows of a reduced
                 vocabulary

Feature f_t is the target's hidden state after reading token t, so it predicts token t+1. A head may also read
lower layers of the target (EAGLE-3, Li et al. 2025): its config lists `eagle_feature_layers`, e.g. (2, 15, 27, -1);
the target's states of those layers, each RMS-normalised, are fused by one more linear layer into f_t (initialised
to pass the final states through unchanged, so a single-layer head is its starting point). Only committed
positions have target states; past the first draft step the head reads its own predicted features, as before.

The head keeps its own KV cache, one position per pair; after every call it holds the pairs of every committed
token but the newest (`cache_ids == committed[:-1]`), all computed from *true* target features, which the engine
hands over at prefill and after each verification (no extra target work). Drafting rolls the head forward from its
predicted features; those speculative positions are dropped at rollback and the committed ones recomputed from the
true features.

The reduced vocabulary (the few thousand tokens the target emits most, as in FR-Spec) makes a draft step cheap:
the head scores only those rows of the target's tied embedding, selected by an index list stored with the weights.
Tokens outside it get q = 0, so the exact rule applies unchanged (they are simply never proposed).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from spec_engine.core import drafting, speed
from spec_engine.core.cache import additive_mask, cache_len, check_invariant, new_cache, trim_cache
from spec_engine.core.packed import Segment, packed_support, run_stack
from spec_engine.core.sampling import SamplingParams, choose_token, top_probability
from spec_engine.drafters.base import Drafter, Proposal, vocab_size, wants_unwarped
from spec_engine.drafters.sizing import reset_view, size_draft, sizing_view, verify_costs

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "eagle-smollm2-135m.safetensors"
HEAD_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_parameters", "rope_theta", "attention_bias",
             "mlp_bias")


def check_feature_layers(feature_layers, n_layers: int | None = None) -> list[int]:
    """Increasing hidden-state indices (below `n_layers`, the target's layer count, when given), then -1 (the final
    states, the space the head predicts into); ValueError otherwise."""
    layers = [int(layer) for layer in feature_layers]
    lower = layers[:-1]
    if not layers or layers[-1] != -1 or lower != sorted(set(lower)) or \
            not all(0 <= l < (n_layers if n_layers is not None else l + 1) for l in lower):
        bound = f"[0, {n_layers})" if n_layers is not None else ">= 0"
        raise ValueError(f"feature_layers must be increasing hidden-state indices in {bound}, then -1 "
                         f"(the final states), got {feature_layers!r}")
    return layers


def head_config(target_config, intermediate_size: int | None = None, feature_layers=(-1,)) -> LlamaConfig:
    """One Llama layer shaped like the target's (same width, heads and RoPE), with no vocabulary of its own,
    reading the target's hidden states `feature_layers` (indices into transformers' hidden_states, ending with -1)."""
    fields = {key: getattr(target_config, key) for key in HEAD_KEYS if getattr(target_config, key, None) is not None}
    if intermediate_size:
        fields["intermediate_size"] = intermediate_size
    layers = check_feature_layers(feature_layers, target_config.num_hidden_layers)
    return LlamaConfig(**fields, num_hidden_layers=1, vocab_size=1, pad_token_id=None, bos_token_id=None,
                       eos_token_id=None, tie_word_embeddings=False, eagle_feature_layers=layers)


class EagleHead(nn.Module):
    """(features [B, n, F], next-token embeddings [B, n, H]) -> predicted next features [B, n, H].

    F is H for the head's own predictions, or len(feature_layers) * H for the target's states, fused first."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.feature_layers = tuple(getattr(config, "eagle_feature_layers", None) or (-1,))
        if len(self.feature_layers) > 1:
            self.fuse_norms = nn.ModuleList(LlamaRMSNorm(hidden, config.rms_norm_eps) for _ in self.feature_layers[:-1])
            self.fuse = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
            with torch.no_grad():            # start as the single-layer head: pass the final states through
                self.fuse.weight.zero_()
                self.fuse.weight[:, -hidden:].copy_(torch.eye(hidden))
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.body = LlamaModel(config)          # its 1-row embedding is never used: the head reads inputs_embeds

    def fuse_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's states [..., len(feature_layers) * H] -> one feature [..., H] in the final states' space."""
        hidden = self.config.hidden_size
        if features.shape[-1] == hidden:
            return features
        assert features.shape[-1] == len(self.feature_layers) * hidden, (features.shape, self.feature_layers)
        lower = features[..., :-hidden].unflatten(-1, (-1, hidden))                   # [..., layers - 1, H]
        # Every lower layer's LlamaRMSNorm at once (their arithmetic, one fused op instead of ~7 per layer: this runs
        # in each round's catch-up), each with its own weight.
        weights = torch.stack([norm.weight for norm in self.fuse_norms])             # [layers - 1, H]
        eps = self.fuse_norms[0].variance_epsilon
        normed = weights * F.rms_norm(lower.float(), (hidden,), eps=eps).to(lower.dtype)
        return self.fuse(torch.cat([normed.flatten(-2), features[..., -hidden:]], dim=-1))   # [..., H]

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache=None, attention_mask: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> torch.Tensor:
        """`attention_mask`: training's padding mask [B, n]. `visible` [n, L] (bool): a tree's rows, each seeing
        the cache's positions it is True at (drafting a tree: eagle_tree.py), at `position_ids`."""
        features = self.fuse_features(features)
        assert features.shape == next_embeds.shape and features.dim() == 3, (features.shape, next_embeds.shape)
        fused = self.fc(torch.cat([features, next_embeds], dim=-1))                   # [B, n, H]
        if visible is not None:                                                       # a tree: a speed layer may run it
            found = speed.active().run_layers(self.body, fused, cache, positions=position_ids[0], visible=visible)
            if found is not None:
                return found
            attention_mask = additive_mask(visible, fused.dtype)                      # [1, 1, n, L]
        elif cache is not None and attention_mask is None:                    # drafting: a speed layer may run it
            assert position_ids is None or int(position_ids[0, 0]) == cache.get_seq_length(), "pairs follow the cache"
            found = speed.active().run_layers(self.body, fused, cache)                # [1, n, H] or None
            if found is not None:
                return found
        out = self.body(inputs_embeds=fused, position_ids=position_ids, cache=cache, use_cache=cache is not None,
                        attention_mask=attention_mask)
        return out.last_hidden_state                                                  # [B, n, H]

    def new_cache(self) -> DynamicCache:
        return new_cache(self)


def writes_in_place(full: torch.Tensor) -> bool:
    """Whether q's rows can be written in place with numpy (members, when a search reported them, are CPU ids)."""
    return full.device.type == "cpu"


def reduced_rows(target_model, vocab_index: torch.Tensor) -> torch.Tensor:
    """The target's LM-head rows of the reduced vocabulary [N, H] (gathered once: N/vocab of the LM head)."""
    weight = target_model.get_output_embeddings().weight.detach()                    # [vocab, H]
    return weight[vocab_index.to(device=weight.device, dtype=torch.long)]


class ReducedLMHead(nn.Module):
    """features [..., H] -> logits [..., N] over the reduced vocabulary (a module, so that profilers and the
    benchmark's forward clock count it as draft-model time). Its product is a linear layer, so that a speed layer's
    products can serve it."""

    def __init__(self, rows: torch.Tensor):
        super().__init__()
        self.proj = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
        self.proj.weight = nn.Parameter(rows, requires_grad=False)                    # [N, H]

    @property
    def rows(self) -> torch.Tensor:
        return self.proj.weight                                                       # [N, H]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features)                                                    # [..., N]


def head_dtype(target_model) -> torch.dtype:
    """The dtype the shipped head drafts in for `target_model`: what the speed layer prefers (bf16 beside an fp32
    target on a CPU that has bf16 dot products, accel/cpu_gemm.py), else the target's dtype.

    Why: a draft step reads the head's weights and its LM-head rows (~22 MB in fp32) from memory, and bf16 halves
    that. Measured on an AMD EPYC, one thread, beside the fp32 SmolLM2-135M (`python -m bench.eagle_head_cost
    --threads 1 --rounds 5`): the reduced LM head 1.61 -> 0.85 ms, a head step 1.59 -> 1.04 ms (again with the
    engine's kernels for both, 2026-12-03, a busy host: 1.95 -> 1.34 ms and 1.48 -> 0.86 ms); in the benchmark, draft
    time per draft token 0.11 -> 0.08 of a plain step on chat, acceptance at k = 3 on chat / code 0.73 / 0.66 with the
    fp32 head and 0.72 / 0.65 with bf16 (`SPEC_ENGINE_EAGLE_DTYPE=float32` or `bfloat16` forces one, for such an A/B
    run). The draft's numerics cannot change the output (the target verifies every token and q is what the head
    drew from), only how often its guesses are accepted."""
    override = os.environ.get("SPEC_ENGINE_EAGLE_DTYPE")       # e.g. float32, for an A/B measurement
    if override:
        from spec_engine.models import resolve_dtype          # the project's dtype names (loaded lazily: GGUF code)
        try:
            return resolve_dtype(override, target_model.device)
        except ValueError as error:
            raise ValueError(f"SPEC_ENGINE_EAGLE_DTYPE: {error}") from None
    return speed.active().draft_dtype(target_model) or target_model.dtype


class EagleDrafter(Drafter):
    """Drafts by rolling an EagleHead forward from the target's features (see the module docstring).

    Greedy: argmax of the head's reduced logits, probs None. Sampling: draws from the warped reduced
    distribution (same temperature / top-k / top-p) and reports it over the full target vocabulary.
    With `min_confidence` > 0 a round drafts fewer than k tokens when the head's own top probability (softmax of
    its logits) drops below it; with `min_path_confidence` > 0 it stops before the next head step once the product
    of those probabilities so far (the odds that the next draft is even reached, the score EAGLE-2 expands its
    tree by) drops below it, which saves the step and its LM-head rows in rounds whose first draft is a guess
    (bench/eagle_path_stop.py). With `size_by_cost` (the default) the round then proposes the prefix with the
    most expected tokens per verify cost (`costs.best_draft_length`, the top probabilities as the odds, the
    target's measured cost curve): drafts unlikely to pay for their verify row are dropped. Measured at k = 3
    (chat / code, greedy): acceptance 0.58 / 0.59 -> 0.62 / 0.62 at the same tokens per forward and speed. Either
    way the draft length depends on the draft alone, so the output stays exact.
    """

    name = "eagle"

    def __init__(self, head: EagleHead, target_model, vocab_index: torch.Tensor, name: str = "eagle",
                 min_confidence: float = 0.0, size_by_cost: bool = True, min_path_confidence: float = 0.0,
                 lm_head: "ReducedLMHead | None" = None):
        for label, value in (("min_confidence", min_confidence), ("min_path_confidence", min_path_confidence)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{label} must be in [0, 1), got {value!r}")
        self.min_confidence = min_confidence       # stop drafting when the head's top probability falls below it
        self.min_path_confidence = min_path_confidence   # ... or before a step, once their product falls below it
        self.size_by_cost = size_by_cost
        self.costs: tuple[float, ...] | None = None  # the target's verify-cost curve, from check_target
        self.pinned_sizing = None                   # sizing.pin_sizing: a run's earlier curve
        self.head = head.eval()
        layer = speed.active()
        layer.adopt(self.head)          # a speed layer's preparation (the CPU's: packed products, lean steps),
        layer.warm(self.head)           # made here, not inside the run
        self.feature_layers = head.feature_layers                                      # what the engine hands over
        self.target = target_model
        self.name = name
        self.dtype = next(head.parameters()).dtype      # may differ from the target's (head_dtype)
        self._vocab_ids = vocab_index.tolist()             # the same on the host: a draw's id without a tensor op
        self.embed = target_model.get_input_embeddings().weight                        # [vocab, H], shared
        self.vocab_index = vocab_index.to(device=self.embed.device, dtype=torch.long)  # [N] target ids, on its device
        if lm_head is None:                             # `shared_head` hands over one made for this target
            lm_head = ReducedLMHead(reduced_rows(target_model, self.vocab_index).to(self.dtype))   # [N, H] rows
            layer.adopt(lm_head)
            layer.warm(lm_head)
        self.lm_head = lm_head
        self.cache = None
        self.cache_ids: list[int] = []
        self._predicted = None          # [H] the head's predicted feature of the newest committed token
        self._true_len = 0              # cache positions computed from true target features

    def check_target(self, target_model) -> None:
        if target_model is not self.target:
            raise ValueError("an EagleDrafter drafts for the model it was built from; build one for this target")
        if self.head.config.hidden_size != target_model.config.hidden_size:
            raise ValueError(f"head width {self.head.config.hidden_size} != target hidden size "
                             f"{target_model.config.hidden_size}")
        n_states = target_model.config.num_hidden_layers + 1
        if not all(-n_states <= layer < n_states for layer in self.feature_layers):
            raise ValueError(f"the head reads hidden states {self.feature_layers}, but the target has only {n_states}")
        if int(self.vocab_index.max()) >= vocab_size(target_model):
            raise ValueError("the head's vocabulary index lists ids beyond the target's vocabulary")
        if self.size_by_cost:
            self.costs = sizing_view(verify_costs(target_model), self.pinned_sizing)

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        gathering = _waiting_feed(self)
        if gathering is not None:
            gathering.jobs.pop(self)                # rows gathered for the cache this begin replaces
        self.cache = self.head.new_cache()
        self.cache_ids, self._predicted, self._true_len = [], None, 0
        reset_view(self.costs)
        if len(prompt_ids) > 1:
            width = len(self.feature_layers) * self.head.config.hidden_size
            assert target_features is not None and target_features.shape == (len(prompt_ids) - 1, width), \
                "EagleDrafter needs the target's features for prompt[:-1]"
            self._feed(prompt_ids, target_features)

    @torch.inference_mode()
    def _step(self, features: torch.Tensor, next_ids: list[int], start: int) -> torch.Tensor:
        """Run the head over pairs (features [n, F], next_ids) at positions start.. ; returns predictions [n, H]."""
        next_embeds = self.embed[torch.tensor(next_ids, device=self.embed.device)].to(self.dtype)   # [n, H]
        assert start == self.cache.get_seq_length(), "pairs follow the cache"
        position_ids = torch.arange(start, start + len(next_ids), device=self.embed.device)[None]      # [1, n]
        with speed.active().products():
            return self.head(features.to(self.dtype)[None], next_embeds[None], position_ids, self.cache)[0]

    def _feed(self, committed: list[int], features: torch.Tensor) -> None:
        """Append the pairs of `features` [m, F], the true features of committed[true_len : true_len + m]. Inside
        `feeding_together()` the head forward waits for the others' (the bookkeeping is done now)."""
        start, m = self._true_len, features.shape[0]
        assert start + m == len(committed) - 1, "features must cover every committed token but the newest"
        next_ids = committed[start + 1:start + m + 1]
        gathering = _gathering()
        if gathering is not None:
            gathering.add(self, features, next_ids)
            self._predicted = None                  # set when the gathered forward runs
        else:
            self._predicted = self._step(features, next_ids, start)[-1]                   # [H]
        self.cache_ids += committed[start:start + m]
        self._true_len = start + m

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        if self._predicted is None or k == 0:
            return Proposal([], None)
        assert self.cache_ids == committed[:-1], "the head cache must hold committed[:-1] before drafting"
        feature, tokens, probs, confidences, members, unwarped = self._predicted, [], [], [], [], []
        path = 1.0                      # the product of the confidences so far: the odds that a next draft is reached
        for i in range(k):
            with speed.active().products():
                logits = self.lm_head(feature).to(self.target.dtype)                          # [N]
            confidence, best = top_probability(logits)              # the head's top probability and its pick
            if i and confidence < self.min_confidence:
                break       # dynamic draft length: decided from the head's own distribution only, so still exact
            confidences.append(confidence)
            path *= confidence
            index, reduced_probs = (best, None) if params.greedy else choose_token(logits, params, generator, members)
            tokens.append(self._vocab_ids[index])
            probs.append(reduced_probs)
            if wants_unwarped(params) and not params.greedy:                    # q_mismatch: before T, top-k, top-p
                unwarped.append(torch.softmax(logits.to(reduced_probs.dtype), dim=-1))
            if i + 1 == k or path < self.min_path_confidence:
                break           # the last draft, or the next one is unlikely to be reached: skip its head step
            previous = committed[-1] if i == 0 else tokens[-2]
            feature = self._step(feature[None], tokens[-1:], len(committed) - 1 + i)[-1]
            self.cache_ids.append(previous)
        # The cache now also holds pairs built from predicted features (committed[-1], d_1, ...): rollback drops them.
        note = None
        if self.costs is not None:      # keep the prefix worth its verify rows, the head's confidences as odds
            keep, note = size_draft(confidences, self.costs)
            tokens, probs, unwarped = tokens[:keep], probs[:keep], unwarped[:keep]
        if not tokens:
            return Proposal([], None, note=note)
        if params.greedy:
            return Proposal(tokens, None, note=note)
        full = torch.zeros(len(tokens), vocab_size(self.target), dtype=probs[0].dtype, device=probs[0].device)
        if len(members) >= len(tokens) and writes_in_place(full):     # members (a CPU search's): write only those
            rows, vocab_index = full.numpy(), self.vocab_index.numpy()
            for row, reduced, ids in zip(rows, probs, members):
                row[vocab_index[ids]] = reduced.numpy()[ids]
        else:
            full[:, self.vocab_index] = torch.stack(probs)                                        # [k, vocab]
        if not unwarped:
            return Proposal(tokens, full, note=note)
        before = torch.zeros_like(full)
        before[:, self.vocab_index] = torch.stack(unwarped)            # the head's reduced vocabulary, zeros elsewhere
        return Proposal(tokens, full, unwarped=before, note=note)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        if _waiting_feed(self) is None:             # (else the cache holds the true pairs only, until the feed runs)
            trim_cache(self.cache, self._true_len)  # predicted-feature positions go, even if their tokens were kept
        del self.cache_ids[self._true_len:]
        if target_features is not None and target_features.shape[0]:
            self._feed(committed, target_features)
        if _waiting_feed(self) is None:
            check_invariant(self.cache, len(self.cache_ids), f"draft ({self.name})")


_GATHERING = threading.local()          # .feeds: the open feeding_together() gatherings of this thread, innermost last


def _gathering() -> "FeedTogether | None":
    """The innermost open feeding_together() of this thread, or None."""
    gatherings = getattr(_GATHERING, "feeds", None)
    return gatherings[-1] if gatherings else None


def _waiting_feed(drafter: EagleDrafter) -> "FeedTogether | None":
    """The gathering that holds rows of `drafter` not yet run, or None."""
    gathering = _gathering()
    return gathering if gathering is not None and drafter in gathering.jobs else None


class FeedTogether:
    """The catch-ups of several EAGLE drafters (their heads' forwards over the target's true features, after a
    round) gathered, then run as ONE packed head forward per shared head (core/packed.py: each sequence's rows after
    its own head cache, seeing only it). Made by `feeding_together()`.

    Why: in a batch (core/batch.py) every drafting sequence's head catches up every round, and one head forward per
    sequence cost up to ~3 ms against a ~21 ms packed target forward at batch 4 (docs/benchmarks.md), charged to
    drafting by the batch's sizing. Batching shares the head's weight read as the target's forward shares the
    target's. The head's numbers may then differ from a lone run's in the last bits (other kernels for more rows), so
    only drafts change, never what the target accepts: a lone drafter (one job) runs the lone step."""

    def __init__(self):
        self.jobs: dict[EagleDrafter, tuple[list[torch.Tensor], list[int]]] = {}   # drafter -> (features, next ids)

    def add(self, drafter: EagleDrafter, features: torch.Tensor, next_ids: list[int]) -> None:
        parts, ids = self.jobs.setdefault(drafter, ([], []))
        parts.append(features)
        ids.extend(next_ids)

    def run(self) -> None:
        groups: dict[int, list[EagleDrafter]] = {}
        for drafter in self.jobs:
            groups.setdefault(id(drafter.head), []).append(drafter)
        for drafters in groups.values():
            if len(drafters) == 1 or packed_support(drafters[0].head.body) is not None:
                for drafter in drafters:            # one sequence: the lone step, as a lone run feeds it
                    parts, ids = self.jobs[drafter]
                    drafter._predicted = drafter._step(torch.cat(parts), ids, cache_len(drafter.cache))[-1]
            else:
                self._packed(drafters)
            for drafter in drafters:
                check_invariant(drafter.cache, len(drafter.cache_ids), f"draft ({drafter.name})")

    @torch.inference_mode()
    def _packed(self, drafters: list[EagleDrafter]) -> None:
        head, first = drafters[0].head, drafters[0]
        features = torch.cat([part for d in drafters for part in self.jobs[d][0]]).to(first.dtype)   # [N, F]
        ids = [t for d in drafters for t in self.jobs[d][1]]
        embeds = first.embed[torch.tensor(ids, device=first.embed.device)].to(first.dtype)           # [N, H]
        segments = [Segment(self.jobs[d][1], d.cache, len(self.jobs[d][1])) for d in drafters]
        with speed.active().products():
            fused = head.fc(torch.cat([head.fuse_features(features), embeds], dim=-1))[None]        # [1, N, H]
            predicted, _ = run_stack(head.body, fused, segments)                                    # [1, N, H]
        end = 0
        for drafter, segment in zip(drafters, segments):
            end += len(segment.tokens)
            drafter._predicted = predicted[0, end - 1]                                              # [H]


@contextlib.contextmanager
def feeding_together():
    """Within it, EAGLE drafters' catch-ups (`rollback` with features, `begin`) wait; on leaving they run together
    (FeedTogether). Nothing may draft inside it."""
    gathering = FeedTogether()
    stack = _GATHERING.__dict__.setdefault("feeds", [])
    stack.append(gathering)
    try:
        yield gathering
    finally:
        stack.pop()
    gathering.run()


drafting.TOGETHER.append(feeding_together)       # core/batch.py's rounds catch every EAGLE head up in one forward


# ---- weights: fp16 safetensors + a JSON record, checked by sha256 at load time ----

def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_head(head: EagleHead, vocab_index: torch.Tensor, path: Path, record: dict) -> dict:
    """Write the head (fp16) and its vocabulary index to `path`, and `path`.json with the sha256 and `record`."""
    from safetensors.torch import save_file
    tensors = {f"head.{k}": v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()
               if not k.startswith("body.embed_tokens")}
    tensors["vocab_index"] = vocab_index.to(torch.int32).contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"config": json.dumps(head.config.to_dict())})
    record = {**record, "file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size,
              "parameters": sum(v.numel() for k, v in tensors.items() if k != "vocab_index")}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_head(path: Path = DEFAULT_WEIGHTS, dtype: torch.dtype = torch.float32, device="cpu",
              check_sha256: bool = True) -> tuple[EagleHead, torch.Tensor]:
    """(head in `dtype` on `device`, vocab_index [N]); ValueError if the file does not match its JSON record."""
    from safetensors import safe_open
    path = Path(path)
    record_path = path.with_suffix(".json")
    if check_sha256:
        if not record_path.exists():
            raise ValueError(f"{record_path} is missing: it records the sha256 of {path.name}")
        expected, actual = json.loads(record_path.read_text())["sha256"], sha256_file(path)
        if expected != actual:
            raise ValueError(f"{path} has sha256 {actual}, but {record_path.name} records {expected}: "
                             "retrain or restore it")
    with safe_open(str(path), framework="pt") as f:
        config = LlamaConfig(**json.loads(f.metadata()["config"]))
        state = {k[len("head."):]: f.get_tensor(k) for k in f.keys() if k.startswith("head.")}
        vocab_index = f.get_tensor("vocab_index").to(torch.long)
    head = EagleHead(config)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("body.embed_tokens") for k in missing):
        raise ValueError(f"{path}: weights do not fit the head (missing {missing}, unexpected {unexpected})")
    for p in head.parameters():
        p.requires_grad_(False)
    return head.to(device=device, dtype=dtype).eval(), vocab_index.to(device)


_SHARED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()   # target -> {key: head parts}
_SHARED_LOCK = threading.Lock()


def shared_head(target_model, path: Path = DEFAULT_WEIGHTS) -> tuple[EagleHead, torch.Tensor, ReducedLMHead]:
    """(head, vocab_index, reduced LM head) for `target_model` in `head_dtype(target_model)` on its device, loaded
    and prepared once per target, weights file and dtype, and kept while the target lives.

    Why: loading is not a run's work. Reading and checking the file, building the module and gathering and packing
    the LM-head rows took 65-84 ms per drafter (AMD EPYC, 2 threads), about 5% of a 64-token run that the
    benchmark and the app time end to end, and an engine loads its draft model once, as it loads its target. The
    parts are only read while drafting (each drafter keeps its own cache and state), so concurrent runs share them
    as they share the target. A file changed on disk (its size or modification time) is loaded and checked again."""
    path = Path(path)
    stat = path.stat()
    dtype = head_dtype(target_model)
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, dtype, str(target_model.device))
    with _SHARED_LOCK:
        parts = _SHARED.setdefault(target_model, {})
        if key not in parts:
            parts.clear()                   # another file or dtype for this target: keep one set of parts
            parts[key] = head_parts(target_model, path, dtype)
        return parts[key]


def head_parts(target_model, path: Path, dtype: torch.dtype) -> tuple[EagleHead, torch.Tensor, ReducedLMHead]:
    """(head, vocab_index, reduced LM head) from the weights at `path`, in `dtype` on `target_model`'s device, handed
    to the speed layer (its modules, packed weights): what `shared_head` keeps once per target, and what
    bench/eagle_head_cost.py builds in each dtype it compares."""
    head, vocab_index = load_head(path, dtype=dtype, device=target_model.device)
    lm_head = ReducedLMHead(reduced_rows(target_model, vocab_index).to(dtype))               # [N, H] rows
    layer = speed.active()
    for module in (head, lm_head):
        layer.adopt(module)
        layer.warm(module)
    return head, vocab_index, lm_head


def recommended_settings(path: Path = DEFAULT_WEIGHTS) -> dict:
    """The head's measured best settings, from its JSON record: {"draft": ..., "k": ..., "min_confidence": ...,
    "source": ...} (written after benchmarking; {} when the record has none). "draft" is the playground's default
    draft name for this head's target (`eagle` or `eagle+lookup`)."""
    record_path = Path(path).with_suffix(".json")
    return dict(json.loads(record_path.read_text()).get("recommended", {})) if record_path.exists() else {}


def load_eagle_drafter(target_model, path: Path = DEFAULT_WEIGHTS, min_confidence: float | None = None,
                       min_path_confidence: float | None = None, fixed_length: bool = False) -> EagleDrafter:
    """The shipped head for `target_model`, on its device, in `head_dtype(target_model)`. Either stop left None takes
    the measured recommendation of the head's record (0, no early stop, when there is none). `fixed_length` turns
    every sizing off (no stop, no cost sizing): each round drafts exactly k, as the i.i.d. formula assumes."""
    head, vocab_index, lm_head = shared_head(target_model, path)
    if fixed_length:
        return EagleDrafter(head, target_model, vocab_index, size_by_cost=False, lm_head=lm_head)
    recommended = recommended_settings(path)
    if min_confidence is None:
        min_confidence = float(recommended.get("min_confidence", 0.0))
    if min_path_confidence is None:
        min_path_confidence = float(recommended.get("min_path_confidence", 0.0))
    return EagleDrafter(head, target_model, vocab_index, min_confidence=min_confidence,
                        min_path_confidence=min_path_confidence, lm_head=lm_head)


def random_eagle_drafter(target_model, vocab_index: torch.Tensor | None = None, seed: int = 0,
                         scale: float = 1.0, feature_layers=(-1,)) -> EagleDrafter:
    """An untrained head (for exactness tests: the rule must be exact whatever the head proposes), on the target's
    device and in its dtype. Its weights are drawn on the CPU, so a seed gives the same head on every device."""
    generator = torch.Generator().manual_seed(seed)
    head = EagleHead(head_config(target_model.config, feature_layers=feature_layers))
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=generator) * scale / p.shape[-1] ** 0.5)
    for p in head.parameters():
        p.requires_grad_(False)
    if vocab_index is None:
        vocab_index = torch.arange(vocab_size(target_model))
    return EagleDrafter(head.to(device=target_model.device, dtype=target_model.dtype).eval(), target_model, vocab_index)
