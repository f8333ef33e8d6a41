"""The speculative decoding loop and the plain autoregressive baseline.

The engine knows only token ids. It owns the target's KV cache and checks, every round, that the cache
holds exactly the committed text minus its newest token (see `cache.py`). Each round is five named steps:
draft, score (one target forward over [last committed, d_1..d_n]), verify, commit, trim; then one
`RoundEvent` is yielded. Randomness comes from one `torch.Generator` per run, seeded by the caller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from spec_engine.core.cache import (PREFILL_CHUNK, cache_len, check_invariant, forward_logits,
                                    keep_path, new_cache, prefill, trim_cache)
from spec_engine.core.drafting import Drafter, Proposal, ReportUnwarped, TreeProposal
from spec_engine.core.events import BaselineResult, GenerationResult, RoundEvent, run_stats
from spec_engine.core import timing
from spec_engine.core.sampling import SamplingParams, choose_token, make_generator, top_entries, warp
from spec_engine.core.packed import Segment, one_forward
from spec_engine.core.rule import EXACT, INVARIANT, Q_MISMATCH, position_noise, race
from spec_engine.core.tree_rule import TREE_RULES, WRONG_TREE
from spec_engine.core.verify import RULES, TreeVerdict, Verdict, drafted_probs, verify, verify_tree

MAX_K = 16
MAX_NEW_TOKENS = 2048
TARGET_TOP = 3


def context_length(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def validate_request(model, input_ids, k: int, max_new_tokens: int, sampling) -> list[int]:
    """Check a request before any compute; returns the prompt as a list of ids. ValueError says what to change."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("input_ids must be a LongTensor of shape [1, T] (one prompt)")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k (draft tokens per round) must be an integer in [1, {MAX_K}], got {k!r}")
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or not 1 <= max_new_tokens <= MAX_NEW_TOKENS):
        raise ValueError(f"max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS}], got {max_new_tokens!r}")
    if not isinstance(sampling, SamplingParams):
        raise ValueError("sampling must be a spec_engine.SamplingParams")
    prompt = input_ids[0].tolist()
    limit = context_length(model)
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise ValueError(
            f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's context "
            f"of {limit} tokens: shorten the prompt or lower max_new_tokens")
    vocab = model.get_output_embeddings().weight.shape[0]
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab}); "
                         "was the prompt encoded with this model's tokenizer?")
    return prompt


@dataclass(frozen=True)
class RoundClock:
    """Clock readings of one round (timing.clock: on CUDA after the queued work is done): its start, drafts
    proposed, verdict reached."""
    start: float
    drafted: float
    verified: float


def eos_set(eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    return frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)


def cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i + 1], True
    return tokens, False


@dataclass(frozen=True)
class Planned:
    """A round drafted and waiting for its target forward: the proposal, the rows to score, and when drafting began
    and ended (timing.clock)."""
    proposal: Proposal | TreeProposal
    segment: Segment
    start: float
    drafted: float


@dataclass
class DecodeState:
    """Everything one run owns: the committed ids, the target's KV cache and the run's generator."""

    committed: list[int]
    prompt_len: int
    target_cache: object
    generator: torch.Generator
    eos: frozenset[int]
    k: int
    max_new_tokens: int
    sampling: SamplingParams
    prefill_seconds: float
    display: bool = True            # build the events' display parts (p, q and the target's top entries)
    seed: int = 0                   # the run's seed: the generator's, and the drafter-invariant rule's noise key
    index: int = 0
    stop_reason: str | None = None

    @property
    def generated(self) -> int:
        return len(self.committed) - self.prompt_len


class SpeculativeDecoder:
    """Draft with `drafter`, verify with `target_model` under `rule`: a name of `rule.RULE_INFO` ("exact"; "strict",
    exact too; "typical", lossy; the deliberate mistakes for demos). Chain proposals take the chain rules, tree
    proposals the tree rules ("exact", "tree_best_sibling"); another rule on a tree round is a ValueError.

    A drafter instance holds one run's draft state, so concurrent runs need their own drafters; the models
    themselves are only read and can be shared. The prompt is prefilled `prefill_chunk` tokens per forward, with
    `should_stop` asked between two (cache.prefill).
    """

    prefill_chunk = PREFILL_CHUNK

    def __init__(self, target_model, drafter: Drafter, rule: str = "exact"):
        if rule not in RULES + WRONG_TREE:
            raise ValueError(f"rule must be one of {RULES + WRONG_TREE}, got {rule!r}")
        drafter.check_target(target_model)
        self.target = target_model
        self.drafter = drafter
        self.rule = rule
        # Where the target is, looked up once: transformers' `model.device` walks the parameters (~36 us a call on
        # SmolLM2), and a round asked it five times. Models move only when they load (models/loading.py).
        self.device = target_model.device

    def stream(self, input_ids: torch.Tensor, k: int = 4, max_new_tokens: int = 64,
               sampling: SamplingParams | None = None, seed: int = 0, eos_token_id=None,
               should_stop: Callable[[], bool] | None = None, display: bool = True) -> Iterator[RoundEvent]:
        """Rounds until max_new_tokens, EOS, or `should_stop()` turns true. Validates and prefills at call time,
        so bad input raises here rather than at the first `next()`; stopped during the prefill, it yields no round.
        `display=False`: the events leave out what only a view reads (`RoundEvent.target_probs`, `draft_probs`,
        `target_top`), for a run nobody draws, e.g. one timed; the tokens and every decision are the same."""
        state = self.start(input_ids, k, max_new_tokens, sampling, seed, eos_token_id, should_stop, display)
        return self._rounds(state, should_stop)

    def _rounds(self, state: DecodeState, should_stop) -> Iterator[RoundEvent]:
        while state.stop_reason is None:
            yield self.step(state, should_stop)

    def start(self, input_ids: torch.Tensor, k: int = 4, max_new_tokens: int = 64,
              sampling: SamplingParams | None = None, seed: int = 0, eos_token_id=None,
              should_stop: Callable[[], bool] | None = None, display: bool = True) -> DecodeState:
        """Validate, prefill the target (all prompt tokens but the last, in chunks) and the drafter. If
        `should_stop()` turns true between two chunks, the state comes back finished ("cancelled", no round to
        step) and the drafter is never begun."""
        sampling = sampling or SamplingParams()
        committed = validate_request(self.target, input_ids, k, max_new_tokens, sampling)
        device = self.device
        generator = make_generator(device, seed)
        begin = timing.clock(device)
        target_cache = new_cache(self.target)
        features, stopped = None, False
        if len(committed) > 1:
            out = prefill(self.target, committed[:-1], target_cache, self.drafter.feature_layers, should_stop,
                          self.prefill_chunk)
            stopped = out is None
            features = None if stopped else out[1]                                 # [T - 1, F] or None
        if not stopped:
            self.drafter.begin(committed, features)
        return DecodeState(committed, len(committed), target_cache, generator, eos_set(eos_token_id), k,
                           max_new_tokens, sampling, prefill_seconds=timing.clock(device) - begin, display=display,
                           seed=seed, stop_reason="cancelled" if stopped else None)

    def step(self, state: DecodeState, should_stop: Callable[[], bool] | None = None) -> RoundEvent:
        """One round: draft, score, verify, commit, trim."""
        planned = self.plan(state)
        scored = one_forward(self.target, planned.segment, self.drafter.feature_layers)
        return self.settle(state, planned, scored, should_stop)

    def draft_params(self, sampling: SamplingParams) -> SamplingParams:
        """What `propose` is given: the run's sampling, which under q_mismatch also asks for the draft's distributions
        before warping (the bug reads them as q), so the rule's need travels with the call."""
        return ReportUnwarped.of(sampling) if self.rule == Q_MISMATCH else sampling

    def plan(self, state: DecodeState, k: int | None = None) -> Planned:
        """Draft a round (at most `k` tokens, the run's k by default; a batch may ask for fewer) and lay out the rows
        the target scores: [last committed, drafts...] after the target's cache."""
        assert state.stop_reason is None, "this run has finished"
        round_start = timing.clock(self.device)
        committed = state.committed
        limit = state.k if k is None else min(k, state.k)
        n_draft = min(limit, state.max_new_tokens - state.generated - 1)     # a round emits up to n_draft + 1
        params = self.draft_params(state.sampling)
        proposal = self.drafter.propose(committed, n_draft, params, state.generator) if n_draft else Proposal([], None)
        if isinstance(proposal, TreeProposal):
            tree = proposal.tree
            segment = Segment([committed[-1], *tree.tokens], state.target_cache, len(tree.tokens) + 1,
                              list(tree.parents), tree.depths())
        else:
            segment = Segment(committed[-1:] + proposal.tokens, state.target_cache, len(proposal.tokens) + 1)
        return Planned(proposal, segment, round_start, timing.clock(self.device))

    def settle(self, state: DecodeState, planned: Planned, scored, should_stop: Callable[[], bool] | None = None,
               report: bool = True) -> RoundEvent:
        """The round after its target forward: verify, commit, trim, and the event. `scored`: the segment's logits
        [n + 1, vocab] (with the drafter's feature layers: (logits, features [n + 1, F])). `report`: feed this
        forward's time to the cost curve (timing.report_forward); a batch reports its packed forward once itself."""
        if isinstance(planned.proposal, TreeProposal):
            return self.tree_step(state, planned, scored, should_stop, report)
        proposal, device, committed = planned.proposal, self.device, state.committed
        drafted = torch.tensor(proposal.tokens, dtype=torch.long, device=device)                       # [n]
        # target_logits [n + 1, vocab], features [n + 1, F]
        target_logits, features = scored if self.drafter.feature_layers else (scored, None)
        verdict, target_probs, target_members = verify(self.chain_rule(proposal), state.sampling, drafted,
                                                       proposal.probs, target_logits, state.generator,
                                                       proposal.unwarped, state.display,
                                                       self.noise(state, len(proposal.tokens) + 1))
        verify_done = timing.clock(device)
        if report:
            timing.report_forward(self.target, len(proposal.tokens) + 1, verify_done - planned.drafted)
        emitted, hit_eos = cut_at_eos(proposal.tokens[:verdict.accepted] + [verdict.next_token], state.eos)
        committed += emitted
        target_before, draft_before = cache_len(state.target_cache), self.drafter.cache_len()
        trim_cache(state.target_cache, len(committed) - 1)
        self.drafter.rollback(committed, None if features is None else features[:len(emitted)])   # [m, F]
        check_invariant(state.target_cache, len(committed) - 1, "target")
        state.stop_reason = ("eos" if hit_eos else "max_new_tokens" if state.generated >= state.max_new_tokens
                             else "cancelled" if should_stop is not None and should_stop() else None)
        clock = RoundClock(planned.start, planned.drafted, verify_done)
        event = self._event(state, proposal, verdict, drafted, target_probs, target_members, emitted,
                            (target_before, draft_before), clock)
        state.index += 1
        return event

    def noise(self, state: DecodeState, rows: int) -> torch.Tensor | None:
        """The drafter-invariant rule's Gumbel noise for the next `rows` positions [rows, vocab] (rule.py
        `position_noise`: a function of the seed and the position alone), or None under the other rules."""
        if self.rule != INVARIANT or state.sampling.greedy:
            return None
        vocab = self.target.get_output_embeddings().weight.shape[0]
        first = len(state.committed)                         # the position the round's first emitted token takes
        return position_noise(state.seed, range(first, first + rows), vocab, self.device)

    def chain_rule(self, proposal: Proposal) -> str:
        """The rule a chain round runs. The wrong tree rule judges trees only; a round with no drafts (the last one,
        with room for one token) emits from p under every rule, so it runs the exact one."""
        if self.rule not in WRONG_TREE:
            return self.rule
        if proposal.tokens:
            raise ValueError(f"rule {self.rule!r} judges draft trees; {self.drafter.name} proposes chains")
        return EXACT

    def tree_step(self, state: DecodeState, planned: Planned, scored, should_stop: Callable[[], bool] | None,
                  report: bool = True) -> RoundEvent:
        """A tree round after its forward (tree attention: every node in one forward): verify on the tree, commit
        the accepted path and the token after it, move the path's KV entries into place and drop the rest."""
        if self.rule not in TREE_RULES:
            raise ValueError(f"rule {self.rule!r} is not implemented on draft trees and {self.drafter.name} proposes "
                             f"them: a tree round's rule must be one of {TREE_RULES}")
        proposal = planned.proposal
        tree, committed = proposal.tree, state.committed
        start = len(committed)            # the cache holds committed[:-1]; the accepted path's entries go here
        # target_logits [n + 1, vocab], features [n + 1, F]
        target_logits, features = scored if self.drafter.feature_layers else (scored, None)
        verdict, target_rows = verify_tree(self.rule, state.sampling, tree, proposal.probs, target_logits,
                                           state.generator, state.display,
                                           self.noise(state, max(tree.depths(), default=0) + 1))
        verified = timing.clock(self.device)
        if report:
            timing.report_forward(self.target, len(tree.tokens) + 1, verified - planned.drafted)   # the sizing's curve
        emitted, hit_eos = cut_at_eos([tree.tokens[i] for i in verdict.accepted] + [verdict.next_token], state.eos)
        committed += emitted
        target_before, draft_before = cache_len(state.target_cache), self.drafter.cache_len()
        keep_path(state.target_cache, start, [start + i for i in verdict.accepted])
        trim_cache(state.target_cache, len(committed) - 1)           # EOS may end the round inside the path
        path_rows = [0] + [1 + node for node in verdict.accepted][:len(emitted) - 1]   # the root, then the kept nodes
        self.drafter.rollback(committed, None if features is None else features[path_rows])      # [m, F]
        check_invariant(state.target_cache, len(committed) - 1, "target")
        state.stop_reason = ("eos" if hit_eos else "max_new_tokens" if state.generated >= state.max_new_tokens
                             else "cancelled" if should_stop is not None and should_stop() else None)
        event = self._tree_event(state, proposal, verdict, target_rows, emitted, (target_before, draft_before),
                                 RoundClock(planned.start, planned.drafted, verified))
        state.index += 1
        return event

    def _tree_event(self, state: DecodeState, proposal: TreeProposal, verdict: TreeVerdict, target_rows: torch.Tensor,
                    emitted: list[int], caches_before: tuple[int, int | None], clock: RoundClock) -> RoundEvent:
        """A tree round as an event: `drafted` lists every node, `tree_parents` / `tree_path` say how they hang and
        which were kept; p and q of each node are read under its parent's row."""
        tree = proposal.tree
        accepted = min(len(verdict.accepted), len(emitted))
        tail = emitted[accepted:]
        last = verdict.accepted[-1] if verdict.accepted else -1
        rejected_all = bool(tree.children(last))                      # the token is a correction, not a bonus
        p_nodes, q_nodes, target_top = self._tree_display(proposal, target_rows) if state.display else ([], [], [])
        target_before, draft_before = caches_before
        return RoundEvent(
            index=state.index, drafted=list(tree.tokens), accepted=accepted, emitted=emitted,
            correction=tail[0] if tail and rejected_all else None, bonus=tail[0] if tail and not rejected_all else None,
            target_probs=p_nodes, draft_probs=q_nodes, accept_probs=verdict.accept_probs, uniforms=verdict.uniforms,
            next_top=verdict.next_probs_top, target_top=target_top, k=state.k, target_cache_len_before=target_before,
            target_cache_len=cache_len(state.target_cache),
            draft_cache_len_before=draft_before, draft_cache_len=self.drafter.cache_len(),
            committed_len=len(state.committed), draft_seconds=clock.drafted - clock.start,
            verify_seconds=clock.verified - clock.drafted, round_seconds=timing.clock(self.device) - clock.start,
            prefill_seconds=state.prefill_seconds if state.index == 0 else 0.0,
            finished=state.stop_reason is not None, stop_reason=state.stop_reason, note=proposal.note,
            tree_parents=list(tree.parents), tree_path=verdict.accepted[:accepted], tree_tried=verdict.tried,
            drafter=proposal.source or self.drafter.name)

    @staticmethod
    def _tree_display(proposal: TreeProposal, target_rows: torch.Tensor) -> tuple[list[float], list[float], list]:
        """What a view reads of a tree round: each node's p and q under its parent's row, and the target's top
        entries of every row; target_rows [n + 1, vocab]."""
        tree = proposal.tree
        n = len(tree.tokens)
        rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=target_rows.device)
        ids = torch.tensor(tree.tokens, dtype=torch.long, device=target_rows.device)
        p_nodes = target_rows[rows, ids].tolist() if n else []
        q_nodes = [1.0] * n if proposal.probs is None else proposal.probs[rows.to(proposal.probs.device),
                                                                           ids.to(proposal.probs.device)].tolist()
        top_values, top_ids = top_entries(target_rows, TARGET_TOP)                               # [n + 1, m]
        return p_nodes, q_nodes, [list(zip(ids_row, values_row))
                                  for ids_row, values_row in zip(top_ids.tolist(), top_values.tolist())]

    @staticmethod
    def _chain_display(proposal: Proposal, verdict: Verdict, drafted: torch.Tensor, target_probs: torch.Tensor,
                       target_members) -> tuple[list[float], list[float], list]:
        """What a view reads of a chain round: p and q of each draft and the target's top entries of every row,
        read from the device in one transfer; drafted [n], target_probs [n + 1, vocab]."""
        n = len(proposal.tokens)
        top_values, top_ids = top_entries(target_probs, TARGET_TOP, target_members)               # [n + 1, m]
        parts = [top_values.flatten(), top_ids.flatten().to(top_values.dtype)]
        known = len(verdict.drafted_p) == n            # a sampled verdict carries p(x_i) and q(x_i) already
        if not known:
            parts.append(drafted_probs(target_probs[:n], drafted))
            if proposal.probs is not None:
                parts.append(drafted_probs(proposal.probs, drafted).to(top_values.dtype))
        host = torch.cat(parts).tolist()               # one device-to-host transfer for the whole event
        m = top_values.numel()
        top_values, top_ids = host[:m], [int(i) for i in host[m:2 * m]]
        if known:
            p_drafted, q = verdict.drafted_p, verdict.drafted_q
        else:
            p_drafted = host[2 * m:2 * m + n]
            q = [1.0] * n if proposal.probs is None else host[2 * m + n:]
        width = min(TARGET_TOP, target_probs.shape[-1])
        return p_drafted, q, [list(zip(top_ids[i:i + width], top_values[i:i + width])) for i in range(0, m, width)]

    def _event(self, state: DecodeState, proposal: Proposal, verdict: Verdict, drafted: torch.Tensor,
               target_probs: torch.Tensor, target_members, emitted: list[int], caches_before: tuple[int, int | None],
               clock: RoundClock) -> RoundEvent:
        """The round as an event: the verdict plus what the display shows (`_chain_display`, unless the run was
        started with display=False). `caches_before`: (target, draft) lengths before trimming."""
        n = len(proposal.tokens)
        accepted = min(verdict.accepted, len(emitted))                # EOS can end the round inside the drafts
        tail = emitted[accepted:]
        correction = tail[0] if tail and verdict.accepted < n else None
        bonus = tail[0] if tail and verdict.accepted == n else None
        p_drafted, q, target_top = (self._chain_display(proposal, verdict, drafted, target_probs, target_members)
                                    if state.display else ([], [], []))
        target_before, draft_before = caches_before
        return RoundEvent(
            index=state.index, drafted=list(proposal.tokens), accepted=accepted, emitted=emitted,
            correction=correction, bonus=bonus, target_probs=p_drafted, draft_probs=q,
            accept_probs=verdict.accept_probs, uniforms=verdict.uniforms, next_top=verdict.next_probs_top,
            target_top=target_top, k=state.k, target_cache_len_before=target_before,
            target_cache_len=cache_len(state.target_cache),
            draft_cache_len_before=draft_before, draft_cache_len=self.drafter.cache_len(),
            committed_len=len(state.committed), draft_seconds=clock.drafted - clock.start,
            verify_seconds=clock.verified - clock.drafted, round_seconds=timing.clock(drafted.device) - clock.start,
            prefill_seconds=state.prefill_seconds if state.index == 0 else 0.0,
            finished=state.stop_reason is not None, stop_reason=state.stop_reason, note=proposal.note,
            drafter=proposal.source or self.drafter.name)

    def generate(self, input_ids: torch.Tensor, k: int = 4, max_new_tokens: int = 64,
                 sampling: SamplingParams | None = None, seed: int = 0, eos_token_id=None,
                 should_stop: Callable[[], bool] | None = None, display: bool = True) -> GenerationResult:
        """The whole run; `display` as in `stream`."""
        device = self.device
        start = timing.clock(device)
        state = self.start(input_ids, k, max_new_tokens, sampling, seed, eos_token_id, should_stop, display)
        rounds = list(self._rounds(state, should_stop))
        total = timing.clock(device) - start
        return GenerationResult(
            tokens=[t for r in rounds for t in r.emitted], rounds=rounds, prompt_len=int(input_ids.shape[1]),
            prefill_seconds=state.prefill_seconds, total_seconds=total,
            stop_reason=rounds[-1].stop_reason if rounds else state.stop_reason, stats=run_stats(rounds, total))


def autoregressive_generate(target_model, input_ids: torch.Tensor, max_new_tokens: int = 64,
                            sampling: SamplingParams | None = None, seed: int = 0, eos_token_id=None,
                            should_stop: Callable[[], bool] | None = None,
                            prefill_chunk: int = PREFILL_CHUNK, invariant: bool = False) -> BaselineResult:
    """Plain decoding, one target forward per token, with the same warping and sampling code as the engine. Every
    clock read waits for the device first (timing.clock), as the speculative loop's do, so a step's seconds are its
    forward's on CUDA too, not the launch's. The prompt is prefilled as the engine does it (cache.prefill): stopped
    between two chunks, the result has no token and stop_reason "cancelled". `invariant`: sample each token by the
    drafter-invariant rule's race under the noise of (seed, position) (rule.py), the text every drafter reaches under
    rule "invariant" with the same seed."""
    sampling = sampling or SamplingParams()
    prompt = validate_request(target_model, input_ids, 1, max_new_tokens, sampling)
    device = target_model.device
    generator = make_generator(device, seed)
    eos = eos_set(eos_token_id)
    start = timing.clock(device)
    cache = new_cache(target_model)
    filled = prefill(target_model, prompt, cache, should_stop=should_stop, chunk=prefill_chunk)
    if filled is None:
        seconds = timing.clock(device) - start
        return BaselineResult(tokens=[], prompt_len=len(prompt), prefill_seconds=seconds, total_seconds=seconds,
                              step_seconds=[], stop_reason="cancelled")
    logits = filled[0][-1]                                                                  # [vocab]
    prefill_seconds = timing.clock(logits.device) - start          # the logits' device: the last of a split model
    tokens, step_seconds, stop_reason = [], [], "max_new_tokens"
    while True:
        if invariant and not sampling.greedy:
            position = len(prompt) + len(tokens)
            token = race(warp(logits[None], sampling)[0], position_noise(seed, [position], logits.shape[-1])[0])
        else:
            token, _ = choose_token(logits, sampling, generator)
        tokens.append(token)
        if token in eos:
            stop_reason = "eos"
            break
        if len(tokens) >= max_new_tokens:
            break
        if should_stop is not None and should_stop():
            stop_reason = "cancelled"
            break
        step_start = timing.clock(device)
        logits = forward_logits(target_model, [token], cache, logits_to_keep=1)[-1]
        step_seconds.append(timing.clock(logits.device) - step_start)
        timing.report_forward(target_model, 1, step_seconds[-1])
    return BaselineResult(tokens=tokens, prompt_len=len(prompt), prefill_seconds=prefill_seconds,
                          total_seconds=timing.clock(device) - start, step_seconds=step_seconds,
                          stop_reason=stop_reason)
