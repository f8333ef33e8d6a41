"""Suffix decoding (spec_engine/drafters/suffix.py): the suffix index against brute-force counting, the frequency
tree and its adaptive size, the earlier-outputs index, exactness of its rounds by the tree rule's enumeration
(test_tree_rule.py's toy target over 3 tokens) and greedy identity on tiny models and on SmolLM2. The chi-square
test of sampled suffix rounds in the engine is in test_tree_statistical.py (slow)."""
import random
from collections import Counter

import pytest
import torch

import spec_engine as se
from spec_engine.core.tree_rule import TokenTree
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.eagle_tree import EagleTreeDrafter
from spec_engine.drafters.suffix import (PAPER_SPEC_FACTOR, SuffixDrafter, SuffixFirstDrafter, SuffixIndex,
                                         best_tree_size, speculate)
from test_tree_rule import (LENGTH, SETTINGS, Toy, round_outcomes, rows, target_distribution,
                            total_variation)
from tiny import tiny_llama

GREEDY = se.SamplingParams(temperature=0)


def substrings(sequences: list[list[int]], depth: int) -> tuple[Counter, Counter]:
    """Brute force: occurrences of every substring of at most `depth` tokens, and how often each was followed."""
    counts, followed = Counter(), Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for n in range(1, depth + 1):
                if i + n <= len(seq):
                    counts[tuple(seq[i:i + n])] += 1
                    if i + n < len(seq) and n < depth:
                        followed[tuple(seq[i:i + n])] += 1
    return counts, followed


def test_the_index_counts_every_substring_and_what_followed_it_as_brute_force_does():
    rng = random.Random(0)
    sequences = [[rng.randrange(4) for _ in range(40)], [rng.randrange(4) for _ in range(25)]]
    index = SuffixIndex(depth=5)
    index.extend("a", sequences[0][:17])
    index.extend("b", sequences[1])
    index.extend("a", sequences[0][17:])              # appending later continues the same sequence
    counts, followed = substrings(sequences, 5)
    assert index.tokens == 65 and index.followed[0] == 65
    for string, count in counts.items():
        node = index.find(string)
        assert node is not None and index.counts[node] == count, string
        assert index.followed[node] == followed[string], string
    assert len(index) == 1 + len(counts)               # a node per distinct substring, nothing else
    assert index.find([0] * 6) is None                 # deeper than the index


def test_match_finds_the_longest_suffix_that_was_followed_before():
    rng = random.Random(1)
    for _ in range(50):
        text = [rng.randrange(3) for _ in range(rng.randrange(1, 30))]
        index = SuffixIndex(depth=8)
        index.extend("run", text)
        length, node = index.match(text, longest=6)
        want = max((n for n in range(1, min(6, len(text)) + 1)
                    if any(text[i:i + n] == text[-n:] for i in range(len(text) - n))), default=0)
        assert length == want, text
        assert node == (index.find(text[-length:]) if length else 0)


def test_the_tree_is_best_first_by_frequency_and_closed_under_parents():
    index = SuffixIndex(depth=6)
    # after "7": 1 twice (then 2 twice, then 9 or 8), 3 once (then 4): P(1) = 2/3, P(3) = 1/3, P(2 | 7 1) = 1
    index.extend("a", [7, 1, 2, 9, 7, 1, 2, 8, 7, 3, 4, 5])
    tokens, parents, scores = speculate(index, index.find([7]), budget=8, first=1.0, later=1.0, min_score=0.0)
    assert tokens[:6] == [1, 2, 3, 8, 9, 4] and parents[:6] == [-1, 0, -1, 1, 1, 2]      # ties: the earlier found
    assert scores[:6] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert scores == sorted(scores, reverse=True) and all(p < i for i, p in enumerate(parents))
    # the chances shrink the scores, the floor and the budget cut the tree
    tokens, parents, scores = speculate(index, index.find([7]), budget=2, first=0.5, later=0.5, min_score=0.0)
    assert tokens == [1, 3] and scores == pytest.approx([1 / 3, 1 / 6])
    tokens, _, _ = speculate(index, index.find([7]), budget=8, first=1.0, later=1.0, min_score=0.5)
    assert tokens == [1, 2]
    assert speculate(index, index.find([5]), 8, 1.0, 1.0) == ([], [], [])     # the end of the text: nothing followed


def test_the_tree_grows_with_the_match_and_is_sized_by_the_verify_cost():
    text = list(range(20)) + [50, 51] + list(range(20))
    drafter = SuffixDrafter(max_spec_factor=PAPER_SPEC_FACTOR, size_by_cost=False, min_token_prob=0.0)
    drafter.begin(text[:22] + text[22:25])           # the text's newest 3 tokens (0 1 2) occurred before
    tree = drafter.propose(text[:25], 16, GREEDY, None).tree
    assert drafter.last_match == 3 and tree.tokens == [3, 4, 5]          # max_spec_factor 1: 3 nodes for 3 tokens
    uncapped = SuffixDrafter(size_by_cost=False, min_token_prob=0.0)
    uncapped.begin(text[:25])
    assert uncapped.propose(text[:25], 16, GREEDY, None).tree.tokens == list(range(3, 19))   # k nodes
    tree = drafter.propose(text[:32], 4, GREEDY, None).tree
    assert drafter.last_match == 10 and tree.tokens == [10, 11, 12, 13]   # k caps it
    assert best_tree_size([0.9, 0.9, 0.1], (0.0, 1.0, 1.0, 1.0, 1.0)) == 3   # free rows: keep all that add
    assert best_tree_size([0.9, 0.9, 0.1], (0.0, 1.0, 1.2, 1.5, 3.0)) == 2   # the third row costs more than it brings
    assert best_tree_size([0.1], (0.0, 1.0, 1.5)) == 0


def test_a_later_run_drafts_from_the_earlier_runs_output_when_asked_to_remember():
    drafter = SuffixDrafter(size_by_cost=False, remember_runs=True)
    drafter.begin([1, 2, 3])
    drafter.rollback([1, 2, 3, 10, 11, 12, 13, 14, 15])   # the first run answered 10..15
    drafter.begin([4, 5, 6])                               # a new prompt with none of it
    assert drafter.propose([4, 5, 6], 8, GREEDY, None).tree.tokens == []
    tree = drafter.propose([4, 5, 6, 10, 11, 12], 8, GREEDY, None).tree
    assert tree.tokens == [13, 14, 15] and drafter.last_match == 3


def test_by_default_a_run_depends_on_its_own_text_alone():
    """The app runs each setting twice on one decoder (live, then timed) and refuses to show a speed when the two
    differ: without `remember_runs` the second run drafts exactly what the first did."""
    drafter = SuffixDrafter(size_by_cost=False)
    trees = []
    for _ in range(2):
        drafter.begin([1, 2, 3])
        trees.append(drafter.propose([1, 2, 3, 10, 11, 12], 8, GREEDY, None).tree.tokens)
        drafter.rollback([1, 2, 3, 10, 11, 12, 13, 14, 15])
    assert trees == [[], []]


def test_suffix_rounds_emit_the_targets_distribution_by_enumeration():
    """Each context's tree is the drafter's own (a fresh one fed the prompt, asked after prompt + context), cut to the
    depth that can still matter; every cell of the rule's draws is enumerated as in test_tree_rule.py. Exact for every
    warping setting; the wrong tree rule, on the same trees, drifts."""
    prompt = [2, 0, 1, 2, 0, 2, 2, 0, 0, 2, 0]       # "2 0" was followed by 1, 2 and 0: three siblings at the root

    def tree_after(context: tuple) -> TokenTree:
        drafter = SuffixDrafter(size_by_cost=False, max_spec_factor=None, min_token_prob=0.0)
        drafter.begin(prompt)
        tree = drafter.propose(prompt + list(context), 4, GREEDY, None).tree
        depth = tree.depths()
        kept = [i for i in range(len(tree.tokens)) if depth[i] <= LENGTH - len(context) - 1]
        renumber = {old: new for new, old in enumerate(kept)}
        return TokenTree.of([tree.tokens[i] for i in kept], [renumber.get(tree.parents[i], -1) for i in kept])

    def law(toy: Toy, rule: str) -> dict:
        def after(context: tuple) -> dict:
            if len(context) >= LENGTH:
                return {(): 1.0}
            tree = tree_after(context)
            p, q = rows(toy, tree, context)
            dist: dict = {}
            for (path, token), chance in round_outcomes(p, q, tree, rule).items():
                emitted = (path + (token,))[:LENGTH - len(context)]
                for rest, more in after(context + emitted).items():
                    dist[emitted + rest] = dist.get(emitted + rest, 0.0) + chance * more
            return dist
        return after(())

    assert len(tree_after(()).children(-1)) >= 2                  # siblings: the rule's residual is exercised
    for salt, params in enumerate(SETTINGS):
        toy = Toy(params, salt)
        got, want = law(toy, "exact"), target_distribution(toy)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
        for seq in want:
            assert abs(got.get(seq, 0.0) - want[seq]) < 1e-9, (params, seq)
    assert total_variation(law(Toy(SETTINGS[0], 0), "tree_best_sibling"),
                           target_distribution(Toy(SETTINGS[0], 0))) > 0.02


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_suffix_decoding_is_plain_greedy_decoding_on_tiny_models(seed):
    target = tiny_llama(vocab=10, layers=2, seed=seed)
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3, 1, 2]])
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY).tokens
    head = random_eagle_drafter(target, seed=seed)
    drafters = {"suffix": lambda: SuffixDrafter(remember_runs=True),
                "suffix-paper-cap": lambda: SuffixDrafter(max_spec_factor=PAPER_SPEC_FACTOR, min_token_prob=0.0),
                "eagle+suffix": lambda: SuffixFirstDrafter(EagleTreeDrafter(head.head, target, head.vocab_index,
                                                                            width=2, depth=3, size_by_cost=False))}
    for name, make in drafters.items():
        drafter = make()
        for run in range(2):                                  # the second run also drafts from the first's output
            result = se.SpeculativeDecoder(target, drafter).generate(prompt, k=6, max_new_tokens=40, sampling=GREEDY)
            assert result.tokens == plain, (name, run)
            trees = [e for e in result.rounds if e.tree_parents is not None]
            committed = prompt.shape[1] + sum(len(e.emitted) for e in result.rounds)   # counted from the rounds
            assert result.rounds[-1].target_cache_len == committed - 1 == result.rounds[-1].committed_len - 1
            assert any(e.accepted >= 2 for e in trees), name                 # deep paths were exercised
        if name == "suffix":
            assert sum(e.accepted for e in result.rounds) > 20           # run 2 copies run 1's answer


def test_the_registry_builds_suffix_drafts(target):
    assert se.parse_draft("suffix") == se.DraftSpec("suffix")
    assert se.parse_draft("eagle+suffix:6") == se.DraftSpec("eagle+suffix", None, 6)
    with pytest.raises(ValueError, match="no argument"):
        se.parse_draft("suffix:3")

    class Loaded:
        model, tokenizer = target, None
    assert isinstance(se.make_drafter("suffix", Loaded()), SuffixDrafter)
    assert not se.make_drafter("suffix", Loaded(), fixed_length=True).size_by_cost


@pytest.mark.slow      # SmolLM2-135M plus the EAGLE head: ~10 s on two shared cores
@pytest.mark.parametrize("draft", ["suffix", "eagle+suffix"])
def test_greedy_identity_on_smollm2(smollm2, draft):
    prompt = smollm2.encode_prompt("Repeat this list twice: apples, pears, plums, figs.")
    plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=32, sampling=GREEDY).tokens
    result = se.SpeculativeDecoder(smollm2.model, se.make_drafter(draft, smollm2)).generate(
        prompt, k=8, max_new_tokens=32, sampling=GREEDY)
    assert result.tokens == plain
    assert any(e.note and "suffix" in e.note and e.accepted for e in result.rounds)


@pytest.mark.parametrize("params", [GREEDY, se.SamplingParams(0.8, top_p=0.9)], ids=["greedy", "sampled"])
def test_suffix_rounds_draw_in_the_tree_view(target, params):
    from ui.views import render, tree
    from ui.views.tokens import dict_labeler
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3, 1, 2]])
    rounds = se.SpeculativeDecoder(target, SuffixDrafter(max_spec_factor=None, min_token_prob=0.0)).generate(
        prompt, k=5, max_new_tokens=16, sampling=params, seed=3).rounds
    drawn = [e for e in rounds if e.tree_parents and len(e.drafted) >= 2]
    assert drawn and any(e.note and "suffix" in e.note for e in drawn)
    label = dict_labeler({i: f"t{i}" for i in range(8)})
    figure = tree.tree_figure(rounds, label)
    assert len(figure.data) > 0
    assert 'class="round tree"' in render.round_html(drawn[-1], label)


def test_suffix_first_falls_back_on_short_matches_and_weak_trees():
    class Fallback(se.Drafter):
        name = "fallback"

        def propose(self, committed, k, params, generator):
            return se.Proposal([99], None)

    text = [5, 6, 7, 8, 9, 1, 5, 6, 7]                       # "5 6 7" occurred before, followed by 8
    for min_match, min_expected, suffix_drafts in ((2, 0.0, True), (4, 0.0, False), (2, 5.0, False)):
        drafter = SuffixFirstDrafter(Fallback(), SuffixDrafter(size_by_cost=False), min_match, min_expected)
        drafter.begin(text)
        proposal = drafter.propose(text, 4, GREEDY, None)
        if suffix_drafts:
            assert proposal.tree.tokens == [8, 9, 1, 5] and drafter.suffix.last_match == 3
        else:
            assert proposal.tokens == [99] and drafter.suffix.pending is None
        drafter.rollback(text + [8])
