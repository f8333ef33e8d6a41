"""Suffix decoding's numbers (spec_engine/drafters/suffix.py): each node's score, the learned odds after a round,
which rounds go to the fallback, and the tree's size under a verify-cost curve. Identity tests cannot see these:
a wrong score or odds count changes the drafts' sizes, never the text."""
import pytest
import torch

import spec_engine as se
from spec_engine.drafters.lookup import LookupOdds
from spec_engine.drafters.sizing import CostView
from spec_engine.drafters.suffix import (MIN_FALLBACK_MATCH, SuffixDrafter, SuffixFirstDrafter, SuffixIndex,
                                         best_tree_size, speculate)

GREEDY = se.SamplingParams(temperature=0)


class Fallback(se.Drafter):
    name = "fallback"

    def propose(self, committed, k, params, generator):
        return se.Proposal([99], None)


def index_of(*sequences) -> SuffixIndex:
    index = SuffixIndex(8)
    for n, sequence in enumerate(sequences):
        index.extend(n, sequence)
    return index


def test_a_nodes_score_is_its_parents_times_its_share_times_the_odds_of_its_level():
    index = index_of([1, 2, 3, 4, 5, 1, 2, 6, 7])          # after "1 2": 3 then 6, once each
    node = index.find([1, 2])
    tokens, parents, scores = speculate(index, node, 5, first=0.8, later=0.5, min_score=0.0)
    assert tokens == [3, 6, 4, 7, 5] and parents == [-1, -1, 0, 1, 2]
    assert scores == pytest.approx([0.4, 0.4, 0.2, 0.2, 0.1])   # 1/2 * 0.8, then * 1 * 0.5 a level
    tokens, _, scores = speculate(index, node, 8, first=0.8, later=0.5, min_score=0.15)
    assert tokens == [3, 6, 4, 7] and min(scores) >= 0.15        # below min_score: not drafted
    assert speculate(index, node, 2, first=0.8, later=0.5, min_score=0.0)[0] == [3, 6]    # the budget


def test_a_score_exactly_at_the_minimum_is_drafted():
    index = index_of([1, 2, 3, 1, 2, 4])
    node = index.find([1, 2])                      # followed by 3 and 4, once each: 1/2 * 0.5 = 0.25
    tokens, _, scores = speculate(index, node, 8, first=0.5, later=0.5, min_score=0.25)
    assert tokens == [3, 4] and scores == [0.25, 0.25]
    assert speculate(index, node, 8, first=0.5, later=0.5, min_score=0.2500001)[0] == []


def test_the_drafters_scores_use_the_first_odds_at_the_root_and_the_later_odds_below():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]                     # "1 2 3" occurred, followed by 4 5 6 7 8 ...
    drafter = SuffixDrafter(size_by_cost=False, min_token_prob=0.0)
    drafter.begin(text)
    tree = drafter.propose(text, 4, GREEDY, None).tree
    first, later = LookupOdds().chances(3, 2)
    assert drafter.last_match == 3 and tree.tokens == [4, 5, 6, 7]
    assert drafter.last_scores == pytest.approx([first, first * later, first * later ** 2, first * later ** 3])
    assert first != later


def odds_after(growth: int) -> list[float]:
    """The learned counts of a 3-token match's bucket after one round whose 4-deep chain kept `growth` - 1 tokens
    (then a correction, or the bonus)."""
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    drafter = SuffixDrafter(size_by_cost=False, min_token_prob=0.0)
    drafter.begin(text)
    assert drafter.propose(text, 4, GREEDY, None).tree.tokens == [4, 5, 6, 7]
    drafter.rollback(text + [4, 5, 6, 7][:growth - 1] + ([8] if growth == 5 else [9]))
    assert drafter.pending is None
    return drafter.odds.counts[LookupOdds.bucket(3)]


@pytest.mark.parametrize("growth, first_hit, next_hits, next_trials", [
    (1, 0, 0, 0),          # the first draft refused: one trial, no hit; the correction is no copy
    (3, 1, 1, 2),          # 2 kept, the third refused: 1 right after the first, 2 judged after it
    (5, 1, 3, 3),          # all 4 kept, then the bonus: 3 right after the first, none wrong
])
def test_the_learned_odds_count_only_accepted_copies_not_the_correction_or_bonus(growth, first_hit, next_hits,
                                                                                  next_trials):
    prior = LookupOdds().counts[LookupOdds.bucket(3)]
    counts = odds_after(growth)
    assert counts == pytest.approx([prior[0] + first_hit, prior[1] + 1, prior[2] + next_hits, prior[3] + next_trials])


def test_a_round_without_a_tree_learns_nothing():
    drafter = SuffixDrafter(size_by_cost=False)
    drafter.begin([1, 2, 3])
    assert drafter.propose([1, 2, 3], 4, GREEDY, None).tree.tokens == [] and drafter.pending is None
    drafter.rollback([1, 2, 3, 4])
    assert drafter.odds.counts == LookupOdds().counts


@pytest.mark.parametrize("text, suffix_drafts", [
    ([5, 6, 8, 9, 1, 5, 6], True),             # "5 6" occurred: a match of exactly MIN_FALLBACK_MATCH tokens
    ([5, 6, 8, 9, 1, 7, 6], False),            # only "6" occurred: one token is too short
])
def test_a_match_of_exactly_the_minimum_length_is_suffix_decodings(text, suffix_drafts):
    assert MIN_FALLBACK_MATCH == 2
    drafter = SuffixFirstDrafter(Fallback(), SuffixDrafter(size_by_cost=False))
    drafter.begin(text)
    proposal = drafter.propose(text, 3, GREEDY, None)
    if suffix_drafts:
        assert drafter.suffix.last_match == 2 and proposal.tree.tokens == [8, 9, 1] and drafter.first_drafted
    else:
        assert drafter.suffix.last_match == 1 and proposal.tokens == [99] and drafter.suffix.pending is None


def test_the_suffix_tree_is_cut_to_its_best_size_under_the_verify_cost():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    costs = (0.0, 1.0, 1.1, 1.2, 1.3, 3.5, 6.0, 7.0, 8.0, 9.0)   # a step at 5 rows
    drafter = SuffixDrafter(min_token_prob=0.0)
    drafter.costs = CostView(costs)
    drafter.begin(text)
    tree = drafter.propose(text, 8, GREEDY, None).tree
    first, later = LookupOdds().chances(3, 2)
    scores = [first * later ** i for i in range(8)]
    assert tree.tokens == [4, 5, 6, 7, 8, 1, 2, 3][:best_tree_size(scores, costs)] == [4, 5, 6]
    assert best_tree_size([0.5, 0.5], (0.0, 1.0, 1.5, 2.0)) == 0            # a tie keeps nothing
    assert best_tree_size([0.6, 0.5], (0.0, 1.0, 1.5, 1.6)) == 2
    assert best_tree_size([0.6, 0.5], (0.0, 1.0, 1.5, 2.0)) == 1
    assert best_tree_size([0.9] * 5, (0.0, 1.0, 1.0, 1.0)) == 2             # no more nodes than the curve has rows


def test_the_index_match_is_bounded_by_its_depth_and_the_asked_length():
    index = index_of([1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5])
    assert index.match([1, 2, 3, 4, 5], 3) == (3, index.find([3, 4, 5]))
    assert index.match([1, 2, 3, 4, 5]) == (5, index.find([1, 2, 3, 4, 5]))
    assert index.match([7]) == (0, 0)
    shallow = SuffixIndex(3)
    shallow.extend("a", [1, 2, 3, 4, 1, 2, 3])
    assert shallow.match([1, 2, 3]) == (2, shallow.find([2, 3]))           # depth 3: strings of 2 can be followed


class Recording(se.Drafter):
    """A fallback that proposes [99] and records what it was asked with."""
    name = "recording"

    def __init__(self):
        self.asked = []

    def propose(self, committed, k, params, generator):
        self.asked.append((k, params, generator))
        return se.Proposal([99], None)


def test_the_suffix_first_drafter_is_named_after_both_and_drafts_a_weak_tree_by_default():
    drafter = SuffixFirstDrafter(Recording(), SuffixDrafter(size_by_cost=False))
    assert drafter.name == "recording+suffix" and drafter.min_expected == 0.0
    text = [5, 6, 8, 9, 5, 6]
    drafter.begin(text)
    proposal = drafter.propose(text, 1, GREEDY, None)
    assert proposal.tree.tokens == [8] and sum(drafter.suffix.last_scores) < 1.0


def test_a_tree_worth_exactly_the_minimum_expected_is_drafted():
    text = [5, 6, 8, 9, 5, 6]
    probe = SuffixDrafter(size_by_cost=False)
    probe.begin(text)
    probe.propose(text, 2, GREEDY, None)
    worth = sum(probe.last_scores)
    for needed, drafts in ((worth, True), (worth + 1e-9, False)):
        drafter = SuffixFirstDrafter(Recording(), SuffixDrafter(size_by_cost=False), min_expected=needed)
        drafter.begin(text)
        proposal = drafter.propose(text, 2, GREEDY, None)
        assert (proposal.tree.tokens if drafts else proposal.tokens) == ([8, 9] if drafts else [99])


def test_the_fallback_gets_the_rounds_settings_and_nothing_is_asked_for_zero_drafts():
    fallback = Recording()
    drafter = SuffixFirstDrafter(fallback, SuffixDrafter(size_by_cost=False))
    text = [1, 2, 3]
    drafter.begin(text)
    generator = torch.Generator().manual_seed(0)
    assert drafter.propose(text, 3, GREEDY, generator).tokens == [99]
    assert fallback.asked == [(3, GREEDY, generator)]
    empty = drafter.propose(text, 0, GREEDY, generator)
    assert empty.tokens == [] and fallback.asked == [(3, GREEDY, generator)]


def test_continuations_come_most_frequent_first_then_by_token():
    index = index_of([1, 5, 1, 3, 1, 5, 1, 4])            # after "1": 5 twice, 3 and 4 once each
    found = index.continuations(index.find([1]))
    assert [(token, share) for token, _, share in found] == [(5, 0.5), (3, 0.25), (4, 0.25)]
    assert index.continuations(index.find([4])) == []       # the text's last token: nothing followed it


def test_no_draft_asked_or_found_leaves_no_match_no_note_and_nothing_pending():
    text = [1, 2, 3, 4, 1, 2, 3]
    drafter = SuffixDrafter(size_by_cost=False)
    drafter.begin(text)
    proposal = drafter.propose(text, 0, GREEDY, None)
    assert proposal.tree.tokens == [] and proposal.note is None and drafter.last_match == 0
    assert drafter.pending is None
    fresh = [7, 8, 9]
    drafter.begin(fresh)
    proposal = drafter.propose(fresh, 4, GREEDY, None)
    assert proposal.tree.tokens == [] and proposal.note is None and drafter.last_match == 0
    proposal = drafter.propose(text, 4, GREEDY, None)
    assert proposal.note is not None and proposal.tree.drawn == ["deterministic"] * (len(proposal.tree.tokens) + 1)


def test_the_match_is_capped_at_max_match_and_the_papers_cap_drafts_at_least_one_node():
    text = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    short = SuffixDrafter(max_match=2, size_by_cost=False, min_token_prob=0.0)
    short.begin(text)
    short.propose(text, 4, GREEDY, None)
    assert short.last_match == 2
    capped = SuffixDrafter(max_spec_factor=0.1, size_by_cost=False, min_token_prob=0.0)
    capped.begin(text)
    assert capped.propose(text, 4, GREEDY, None).tree.tokens == [5]      # 0.1 x 4 tokens rounds to none: one


def test_each_remembered_run_is_its_own_sequence():
    drafter = SuffixDrafter(size_by_cost=False, remember_runs=True, min_token_prob=0.0)
    for prompt, output in (([1], [10, 11]), ([2], [12, 13]), ([3], [14, 15])):
        drafter.begin(prompt)
        drafter.rollback(prompt + output)
    drafter.begin([4])
    assert drafter.runs == 3
    for end, follows in (([10, 11], []), ([12, 13], []), ([10], [11])):
        proposal = drafter.propose([4, *end], 4, GREEDY, None)
        assert proposal.tree.tokens == follows, end              # no run continues into the next one
    drafter.begin([5])
    drafter.begin([6])
    assert drafter.runs == 4                                     # the run of [5] had no output: nothing filed


def test_the_settings_are_checked_at_their_bounds_and_the_defaults_size_by_cost():
    assert SuffixIndex(1).depth == 1
    for depth in (0, True, 1.5):
        with pytest.raises(ValueError, match="depth must be an integer >= 1"):
            SuffixIndex(depth)
    drafter = SuffixDrafter(max_match=1, max_spec_factor=0.01, min_token_prob=0.0)
    assert (drafter.max_match, drafter.size_by_cost, drafter.name) == (1, True, "suffix")
    for kwargs, words in (({"max_match": 0}, "max_match"), ({"max_match": True}, "max_match"),
                          ({"max_spec_factor": 0.0}, "max_spec_factor"), ({"min_token_prob": 1.0}, "min_token_prob"),
                          ({"min_token_prob": -0.1}, "min_token_prob")):
        with pytest.raises(ValueError, match=words):
            SuffixDrafter(**kwargs)
