"""Exact enumeration of one batched round: two sequences' rows in one packed forward (core/packed.py), each verified
by the engine's rule over every draft of its drafter and every cell of its random draws (test_verify_enumeration's
`round_outcomes`). Each sequence's round, completed by the target's own continuation, must emit the target's joint
distribution, and the two sequences independently: a row that read the wrong sequence's cache, or the wrong row of
the packed logits, moves the distribution."""
import copy
import itertools

import torch

from spec_engine.core import packed
from spec_engine.core.cache import new_cache, prefill
from spec_engine.core.sampling import SamplingParams, warp
from test_verify_enumeration import VOCAB, round_outcomes, total_variation
from tiny import tiny_llama

PARAMS = SamplingParams(0.9)
CONTEXTS = ([1, 2, 3, 1], [2, 0])        # the two sequences' committed tokens
DRAFTS = (2, 1)                          # their drafts this round


SEEN: dict = {}


@torch.inference_mode()
def probs(model, context: tuple) -> torch.Tensor:
    """The warped next-token distribution after `context`, by a lone forward over the whole text (memoised)."""
    key = (id(model), context)
    if key not in SEEN:
        SEEN[key] = warp(model(torch.tensor([list(context)])).logits[0, -1].double(), PARAMS)
    return SEEN[key]


def joint(model, context: tuple, length: int) -> dict:
    """The target's distribution of the next `length` tokens after `context`."""
    out = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        p = 1.0
        for i, y in enumerate(seq):
            p *= float(probs(model, context + seq[:i])[y])
        out[seq] = p
    return out


def test_a_batched_round_emits_each_sequences_target_distribution_independently():
    target = tiny_llama(vocab=VOCAB, layers=2, seed=7, hidden=64)
    draft = tiny_llama(vocab=VOCAB, layers=1, seed=8, hidden=64)
    caches = []
    for context in CONTEXTS:
        cache = new_cache(target)
        prefill(target, context[:-1], cache)
        caches.append(cache)
    completions = [joint(target, tuple(c), n + 1) for c, n in zip(CONTEXTS, DRAFTS)]
    found: dict = {}
    for drafts in itertools.product(*[itertools.product(range(VOCAB), repeat=n) for n in DRAFTS]):
        segments = [packed.Segment([c[-1], *d], copy.deepcopy(cache), len(d) + 1)
                    for c, d, cache in zip(CONTEXTS, drafts, caches)]
        scored = packed.forward_packed(target, segments)                                         # [n + 1, vocab] each
        per_sequence = []
        for context, d, logits in zip(CONTEXTS, drafts, scored):
            context = tuple(context)
            q_rows = torch.stack([probs(draft, context + d[:i]) for i in range(len(d))])      # [n, vocab]
            chance = float(torch.prod(q_rows[torch.arange(len(d)), torch.tensor(d)]))
            outcomes = round_outcomes(d, q_rows, warp(logits.double(), PARAMS), "exact", None)
            completed = {}
            for (accepted, token), weight in outcomes.items():
                emitted = d[:accepted] + (token,)
                rest = joint(target, context + emitted, len(d) - accepted) if accepted < len(d) else {(): 1.0}
                for tail, p in rest.items():
                    completed[emitted + tail] = completed.get(emitted + tail, 0.0) + chance * weight * p
            per_sequence.append(completed)
        for (a, pa), (b, pb) in itertools.product(*[c.items() for c in per_sequence]):
            found[(a, b)] = found.get((a, b), 0.0) + pa * pb
    expected = {(a, b): pa * pb for (a, pa), (b, pb) in itertools.product(*[c.items() for c in completions])}
    assert abs(sum(found.values()) - 1.0) < 1e-9
    assert total_variation(found, expected) < 1e-4
