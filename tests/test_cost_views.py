"""Drafts sized by a real, non-flat verify-cost curve (spec_engine/drafters/sizing.py), not the suite's flat default.

Every registered draft mode, built by `make_drafter` from tiny models (the EAGLE modes with an untrained head in
place of the shipped one), decodes under conftest's CURVED_VERIFY: greedy output stays plain decoding's, a decoder
run twice sizes its rounds alike (its cost view's paused rounds reset when a run begins), and a drafter built with a
run's `drafter_sizing` sizes as that run did after the session's forwards corrected the curve ("measure again").
"""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.drafters import registry, sizing
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.eagle_tree import EagleTreeDrafter
from spec_engine.drafters.lookup import PromptLookupDrafter
from spec_engine.drafters.sizing import CostCurve, CostView
from conftest import CURVED_VERIFY
from tiny import DRAFT_PIECES, TARGET_PIECES, ToyTokenizer, tiny_llama

GREEDY = se.SamplingParams(temperature=0)
PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 6, 1, 2, 3]])
TOKENS = 20
# The modes whose drafts are sized by the verify-cost curve (the others draft k, or what they found).
SIZED = {"prompt-lookup", "eagle", "eagle+lookup", "eagle-tree", "eagle+lookup-tree", "suffix", "eagle+suffix"}
DRAFT_NAMES = {"same-tokenizer": "tiny-draft", "cross-tokenizer": "tiny-other:cross-tokenizer",
               "naive-ids": "tiny-other:naive-ids"}
SKIP = {"layer-skip": [1], "layer-skip-tree": [1]}


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab=len(TARGET_PIECES), layers=3, seed=0)
    same = tiny_llama(vocab=len(TARGET_PIECES), layers=1, seed=1)
    other = tiny_llama(vocab=len(DRAFT_PIECES), layers=1, seed=3)
    head = random_eagle_drafter(target, seed=1, scale=3.0)
    return SimpleNamespace(
        target=SimpleNamespace(model=target, tokenizer=ToyTokenizer(TARGET_PIECES)),
        same=SimpleNamespace(model=same, tokenizer=ToyTokenizer(TARGET_PIECES)),
        other=SimpleNamespace(model=other, tokenizer=ToyTokenizer(DRAFT_PIECES)), head=head,
        plain=se.autoregressive_generate(target, PROMPT, max_new_tokens=TOKENS, sampling=GREEDY).tokens)


@pytest.fixture
def build(models, monkeypatch):
    """mode, sizing -> a drafter from make_drafter; the EAGLE modes get the tiny target's untrained head."""
    head = models.head
    monkeypatch.setattr(registry, "shipped_eagle", lambda spec, target, fixed_length: se.EagleDrafter(
        head.head, target.model, head.vocab_index))
    monkeypatch.setattr(registry, "shipped_eagle_tree", lambda spec, target, fixed_length: EagleTreeDrafter(
        head.head, target.model, head.vocab_index, width=2, depth=3))

    def make(mode, sizing=None):
        draft = models.other if mode in ("cross-tokenizer", "naive-ids") else models.same
        return se.make_drafter(DRAFT_NAMES.get(mode, mode), models.target, draft if mode in DRAFT_NAMES else None,
                               skip_layers=SKIP.get(mode), sizing=sizing)
    return make


def shapes(result) -> list:
    """What a run drafted, round by round: the tokens, the tree's parents and the drafter's note."""
    return [(r.drafted, r.tree_parents, r.note) for r in result.rounds]


def corrected(curve: CostCurve) -> None:
    """The session's own forwards: one-row steps, then every larger verify three times dearer than measured."""
    for _ in range(3):
        curve.observe(1, 0.01)
    for rows in range(2, len(curve)):
        curve.observe(rows, 0.03 * curve.measured[rows])


def test_every_registered_mode_is_listed_here():
    assert set(registry.modes()) == {"layer-skip", "layer-skip-tree", "early-exit", "prompt-lookup", "lookup-tree",
                                     "eagle", "eagle+lookup", "same-tokenizer", "cross-tokenizer", "naive-ids",
                                     "eagle-tree", "eagle+lookup-tree", "suffix", "eagle+suffix", "quantized-self"}


@pytest.mark.parametrize("mode", registry.MODES)
def test_every_mode_under_a_curved_verify_cost_is_exact_and_sized_alike_again(mode, models, build,
                                                                               curved_verify_costs):
    drafter = build(mode)
    decoder = se.SpeculativeDecoder(models.target.model, drafter)
    first = decoder.generate(PROMPT, k=6, max_new_tokens=TOKENS, sampling=GREEDY)
    assert first.tokens == models.plain
    pinned = se.drafter_sizing(drafter)
    assert (pinned is not None) == (mode in SIZED)
    if mode not in SIZED:
        return
    assert pinned.costs == sizing.sane(CURVED_VERIFY) and pinned.source == "measured at start-up"
    assert decoder.generate(PROMPT, k=6, max_new_tokens=TOKENS, sampling=GREEDY).rounds and \
        shapes(decoder.generate(PROMPT, k=6, max_new_tokens=TOKENS, sampling=GREEDY)) == shapes(first)
    corrected(curved_verify_costs[id(models.target.model)])
    fresh = build(mode)
    se.SpeculativeDecoder(models.target.model, fresh)
    assert se.drafter_sizing(fresh) != pinned                  # the curve did move: a fresh build sizes by it
    again = build(mode, sizing=pinned)                         # "measure again": the first pass's curve
    result = se.SpeculativeDecoder(models.target.model, again).generate(PROMPT, k=6, max_new_tokens=TOKENS,
                                                                        sampling=GREEDY)
    assert se.drafter_sizing(again) == pinned
    assert shapes(result) == shapes(first) and result.tokens == models.plain


def test_the_curved_costs_change_what_a_sized_drafter_drafts(models, build, curved_verify_costs):
    """Not a flat curve in disguise: prompt lookup under it drafts fewer tokens than under free verify rows."""
    curved = se.SpeculativeDecoder(models.target.model, build("prompt-lookup")).generate(
        PROMPT, k=8, max_new_tokens=TOKENS, sampling=GREEDY)
    free = se.SpeculativeDecoder(models.target.model, se.make_drafter("prompt-lookup", models.target,
                                                                     sizing=sizing.Sizing((0.0,) + (1.0,) * 17, "")))
    flat = free.generate(PROMPT, k=8, max_new_tokens=TOKENS, sampling=GREEDY)
    assert sum(map(len, (r.drafted for r in curved.rounds))) < sum(map(len, (r.drafted for r in flat.rounds)))


# ------------------------------------------------------------------------- a cost view across runs

# Each verify row a whole forward: no draft pays here, though a typical machine's curve would draft.
DEAR = (0.0,) + tuple(float(r) for r in range(1, 18))
REPEATING = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4]


def lookup_lengths(drafter, rounds: int) -> list[tuple[int, bool]]:
    """One run of `rounds` proposals on a repeating text: (draft length, a note given) each."""
    drafter.begin(REPEATING)
    out = []
    for _ in range(rounds):
        proposal = drafter.propose(REPEATING, 6, GREEDY, None)
        out.append((len(proposal.tokens), proposal.note is not None))
        drafter.rollback(REPEATING)
    return out


def test_prompt_lookup_pauses_and_probes_at_the_same_rounds_in_every_run():
    drafter = PromptLookupDrafter()
    drafter.costs = CostView(DEAR, "given", probe_every=2)
    first = lookup_lengths(drafter, 5)
    assert [length for length, _ in first] == [0, 0, first[2][0], 0, 0] and first[2][0] > 0   # the third probes
    assert all(note for _, note in first)
    assert lookup_lengths(drafter, 5) == first                  # begin() reset the paused count


def test_a_decoder_run_twice_under_a_dear_curve_pauses_alike(models, build, curved_verify_costs):
    curved_verify_costs[id(models.target.model)] = CostCurve(DEAR, probe_every=2)
    decoder = se.SpeculativeDecoder(models.target.model, build("prompt-lookup"))
    runs = [decoder.generate(PROMPT, k=6, max_new_tokens=TOKENS, sampling=GREEDY) for _ in range(2)]
    assert any(r.note and r.note.startswith(sizing.PAUSED) for r in runs[0].rounds)
    assert any(r.note and r.note.startswith(sizing.PROBE) for r in runs[0].rounds)
    assert shapes(runs[1]) == shapes(runs[0]) and runs[0].tokens == models.plain


def test_a_pinned_sizing_of_another_length_is_not_used():
    curve = CostCurve(CURVED_VERIFY)
    view = sizing.sizing_view(curve, sizing.Sizing((0.0, 1.0, 1.0), "short"))
    assert tuple(view) == tuple(curve) and view.source == "measured at start-up"
    pinned = sizing.sizing_view(curve, sizing.Sizing(tuple(DEAR), "pinned"))
    assert tuple(pinned) == DEAR and pinned.source == "pinned"
