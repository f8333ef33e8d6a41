"""Suffix decoding (SuffixDecoding, Oliaro et al., NeurIPS 2025; vLLM's `method="suffix"`): a model-free draft tree
read off a suffix index of the prompt, this run's output so far and the drafter's earlier outputs.

Each round:

    match      the longest suffix of the committed text (up to MAX_MATCH tokens) that occurred earlier *and was
               followed by something*, in this run's text (prompt + output) and in the earlier outputs
    speculate  from that occurrence, grow a tree best first by frequency: a child's score is its parent's times the
               empirical chance of its token after the parent's string (how often it followed / how often anything
               followed), shrunk by how often copies after a match of that length turn out right (`LookupOdds`,
               the same measured odds prompt lookup sizes its copies with, updated with this run's outcomes)
    size       of at most k nodes, the best-scoring prefix with the most expected tokens (1 + the sum of the kept
               scores) per verify cost on the target's measured curve (`sizing.py`). The size adapts to the match
               length through the scores (a short match's copies are rarely right, so few of its nodes pay for a row).
               The paper's own cap, at most max(1, floor(max_spec_factor * match length)) nodes, is an option
               (`max_spec_factor`), off by default: on six held-out prompts (one per kind of bench/data/six_kinds.json,
               SmolLM2-135M, greedy, k = 8, 64 tokens, one process) `suffix` gave 1.49 tokens per target forward
               with the paper's factor 1, 1.62 with 2 and 1.68 without the cap: the calibrated scores and the
               verify cost already size the tree, and the cap cut copies that would have been accepted

The tree is a function of the committed text and the drafter's earlier outputs, fixed before the target sees the
round, and its siblings are chosen, not drawn (drawn="deterministic", q one-hot), so the tree rule is exact for it
(core/tree_rule.py) under greedy decoding and sampling alike.

`SuffixFirstDrafter` is suffix decoding where the index has a match of MIN_FALLBACK_MATCH+ tokens and another drafter
(the EAGLE tree) elsewhere, as `LookupFirstDrafter` does for prompt lookup.
"""
from __future__ import annotations

import heapq

import torch

from spec_engine.core.sampling import SamplingParams
from spec_engine.drafters.base import Drafter, FirstThenFallback, Proposal, TokenTree, TreeProposal
from spec_engine.drafters.lookup import LookupOdds
from spec_engine.drafters import sizing

MAX_MATCH = 16            # the longest suffix matched (tokens); the index is MAX_MATCH + SPEC_ROOM deep
SPEC_ROOM = 16            # levels kept below a matched string: decoder.MAX_K, the deepest tree a round can verify
PAPER_SPEC_FACTOR = 1.0   # nodes per matched token (vLLM's suffix_decoding_max_spec_factor default): an option here
MIN_TOKEN_PROB = 0.1      # a node whose score falls below this is not drafted (vLLM's default)
MIN_FALLBACK_MATCH = 2    # SuffixFirstDrafter: shorter matches go to the fallback (prompt lookup's measured odds:
                          # a 1-token match is right 26% of the time, below the EAGLE head)
SUFFIX_NOTE = "suffix decoding: continuations of earlier occurrences, scored by frequency"


class SuffixIndex:
    """A suffix trie of bounded depth over token sequences, with counts: node s stores how often the string s
    occurred (`counts`) and how often something followed it (`followed`, the sum of its children's counts). Every
    substring of at most `depth` tokens of an indexed sequence is a node, so the continuations of any pattern and
    their frequencies are one walk away. Sequences are appended token by token (`extend`): each new token extends the
    sequence's newest `depth` suffixes by one node each, O(depth) per token.

    Why hand-written: the maintained implementation (arctic-inference's SuffixDecodingCache, what vLLM's suffix
    method imports) ships as a vLLM plugin that builds C++ ops against pinned torch / vLLM versions from an sdist;
    the pure-Python suffix-tree packages on PyPI (suffix-tree, suffix-trees) build a static tree over whole strings,
    with neither per-token appends nor continuation counts. A depth-bounded trie needs neither Ukkonen's suffix links
    nor edge compression: at depth 32 and a few thousand tokens it is tens of thousands of dict entries.
    """

    def __init__(self, depth: int = MAX_MATCH + SPEC_ROOM):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
        self.depth = depth
        self.children: list[dict[int, int]] = [{}]   # node -> {token: child node}; node 0 is the empty string
        self.counts: list[int] = [0]                  # occurrences of the node's string
        self.followed: list[int] = [0]                # occurrences followed by a token
        self.open: dict[object, list[int]] = {}       # sequence -> the nodes of its newest suffixes shorter than depth
        self.tokens = 0                               # tokens indexed, all sequences

    def __len__(self) -> int:
        return len(self.counts)

    def extend(self, sequence, tokens) -> None:
        """Append `tokens` to the sequence named `sequence` (a new name starts a new sequence)."""
        children, counts, followed, depth = self.children, self.counts, self.followed, self.depth
        open_nodes = self.open.setdefault(sequence, [])
        for token in tokens:
            token = int(token)
            grown = []
            for node in [0, *open_nodes]:      # the empty suffix, then the newest suffixes, shortest first
                child = children[node].get(token)
                if child is None:
                    child = len(counts)
                    children[node][token] = child
                    children.append({})
                    counts.append(0)
                    followed.append(0)
                counts[child] += 1
                followed[node] += 1
                grown.append(child)
            open_nodes[:] = grown[:depth - 1]   # suffixes of `depth` tokens are leaves: they grow no further
            self.tokens += 1

    def find(self, pattern) -> int | None:
        """The node of the string `pattern` (at most `depth` tokens), or None if it never occurred."""
        node = 0
        for token in pattern:
            node = self.children[node].get(int(token))
            if node is None:
                return None
        return node

    def match(self, text: list[int], longest: int = MAX_MATCH) -> tuple[int, int]:
        """(length, node): the longest suffix of `text` of at most `longest` tokens that occurred followed by
        something (length 0 and the root when even the last token never did). Such suffixes nest (a suffix of a
        followed string is followed too), so the longest is found by bisection."""
        low, high, found = 0, min(longest, len(text), self.depth - 1), 0
        while low < high:
            mid = (low + high + 1) // 2
            node = self.find(text[len(text) - mid:])
            if node is not None and self.followed[node]:
                low, found = mid, node
            else:
                high = mid - 1
        return low, found

    def continuations(self, node: int) -> list[tuple[int, int, float]]:
        """(token, child, share) for what followed `node`'s string: share = the child's count / how often anything
        followed; most frequent first, ties to the lower token id."""
        total = self.followed[node]
        if not total:
            return []
        items = sorted(self.children[node].items(), key=lambda item: (-self.counts[item[1]], item[0]))
        return [(token, child, self.counts[child] / total) for token, child in items]


def speculate(index: SuffixIndex, node: int, budget: int, first: float, later: float,
              min_score: float = MIN_TOKEN_PROB) -> tuple[list[int], list[int], list[float]]:
    """A frequency-scored draft tree below `node`, best first: (tokens, parents, scores), at most `budget` nodes.

    A node's score is its parent's (1 at the root) times its share of what followed the parent's string, times the
    chance that a copy is right at all: `first` for the root's children, `later` below them. Nodes come out in
    non-increasing score, so every parent precedes its children and any prefix is the best tree of its size, closed
    under parents. Nodes scoring below `min_score` are not drafted."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    heap: list[tuple[float, int, int, int, int]] = []      # (-score, order, trie node, tree parent, token)
    order = 0
    for token, child, share in index.continuations(node):
        heap.append((-share * first, order, child, -1, token))
        order += 1
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        negative, _, trie_node, parent, token = heapq.heappop(heap)
        if -negative < min_score:
            break
        tokens.append(token)
        parents.append(parent)
        scores.append(-negative)
        me = len(tokens) - 1
        for next_token, child, share in index.continuations(trie_node):
            heapq.heappush(heap, (negative * share * later, order, child, me, next_token))
            order += 1
    return tokens, parents, scores


def best_tree_size(scores: list[float], costs) -> int:
    """The m with the most expected tokens, 1 + the best m scores, per verify cost of m + 1 rows (costs[r]); 0: none."""
    best, best_value, expected = 0, 1.0 / costs[1], 1.0
    for m in range(1, min(len(scores), len(costs) - 2) + 1):
        expected += scores[m - 1]
        if expected / costs[m + 1] > best_value:
            best, best_value = m, expected / costs[m + 1]
    return best


class SuffixDrafter(Drafter):
    """Suffix decoding (see the module docstring) over this run's text and the outputs of the drafter's earlier runs:
    `begin` files the previous run's output in the earlier-outputs index, so a drafter kept across a session's runs
    learns what its answers tend to say. Each round drafts from whichever index gives the higher expected tokens.

    `max_spec_factor` (e.g. PAPER_SPEC_FACTOR) caps a tree at that many nodes per matched token, as the paper does;
    `size_by_cost=False` drops the verify-cost sizing (k nodes when the index has them and no cap is set).
    `remember_runs`: file each run's output in the earlier-outputs index (off by default: a run then depends on its
    settings alone, so the app's timed pass repeats its live pass round for round; the API opts in for a session)."""

    def __init__(self, max_match: int = MAX_MATCH, max_spec_factor: float | None = None,
                 min_token_prob: float = MIN_TOKEN_PROB, size_by_cost: bool = True, name: str = "suffix",
                 remember_runs: bool = False):
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
            raise ValueError(f"max_match must be an integer >= 1, got {max_match!r}")
        if max_spec_factor is not None and not max_spec_factor > 0:
            raise ValueError(f"max_spec_factor must be > 0 (or None), got {max_spec_factor!r}")
        if not 0.0 <= min_token_prob < 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1), got {min_token_prob!r}")
        self.max_match, self.max_spec_factor, self.min_token_prob = max_match, max_spec_factor, min_token_prob
        self.size_by_cost, self.name, self.remember_runs = size_by_cost, name, remember_runs
        self.costs: tuple[float, ...] | None = None     # the target's verify-cost curve, from check_target
        self.pinned_sizing = None                   # sizing.pin_sizing: a run's earlier curve
        self.earlier = SuffixIndex(max_match + SPEC_ROOM)   # outputs of this drafter's earlier runs
        self.runs = 0
        self._reset([])

    def _reset(self, prompt_ids: list[int]) -> None:
        self.local = SuffixIndex(self.max_match + SPEC_ROOM)      # this run's prompt and output
        self.text: list[int] = []
        self.prompt_len = len(prompt_ids)
        self.odds = LookupOdds()
        self.pending: tuple[int, int, int] | None = None          # (match length, committed length, tree depth)
        self.last_match = 0
        self.last_scores: list[float] = []
        self._sync(prompt_ids)

    def check_target(self, target_model) -> None:
        if self.size_by_cost:
            # from the module: tests fix it there
            self.costs = sizing.sizing_view(sizing.verify_costs(target_model), self.pinned_sizing)

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        if self.remember_runs and len(self.text) > self.prompt_len:     # the previous output joins the earlier ones
            self.earlier.extend(self.runs, self.text[self.prompt_len:])
            self.runs += 1
        self._reset(list(prompt_ids))

    def _sync(self, committed: list[int]) -> None:
        """Index the committed tokens not yet indexed (a text that is not a continuation is indexed afresh)."""
        n = len(self.text)
        if committed[:n] != self.text:
            self.local, self.text = SuffixIndex(self.max_match + SPEC_ROOM), []
            n = 0
        if len(committed) > n:
            self.local.extend("run", committed[n:])
            self.text.extend(committed[n:])

    def draft_tree(self, committed: list[int], k: int) -> tuple[int, list[int], list[int], list[float]]:
        """(match length, tokens, parents, scores) of this round's tree from the better index, before cost sizing."""
        self._sync(committed)
        best = (0, [], [], [])
        for index in (self.local, self.earlier):
            if not index.tokens:
                continue
            match_len, node = index.match(committed, self.max_match)
            if not match_len:
                continue
            budget = k if self.max_spec_factor is None else min(k, max(1, int(self.max_spec_factor * match_len)))
            first, later = self.odds.chances(match_len, 2)
            tokens, parents, scores = speculate(index, node, budget, first, later, self.min_token_prob)
            if sum(scores) > sum(best[3]):
                best = (match_len, tokens, parents, scores)
        return best

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> TreeProposal:
        match_len, tokens, parents, scores = self.draft_tree(committed, k) if k else (0, [], [], [])
        if tokens and self.costs is not None:
            keep = best_tree_size(scores, self.costs)
            tokens, parents, scores = tokens[:keep], parents[:keep], scores[:keep]
        self.last_match, self.last_scores = match_len, scores
        tree = TokenTree.of(tokens, parents, "deterministic")
        self.pending = (match_len, len(committed), max(tree.depths(), default=0)) if tokens else None
        return TreeProposal(tree, None, note=SUFFIX_NOTE if tokens else None)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        if self.pending is not None:       # learn how often copies after such a match are right
            match_len, start, depth = self.pending
            accepted = len(committed) - start - 1          # the emitted tokens but the correction or bonus
            self.odds.observe(match_len, depth, max(0, min(accepted, depth)))
            self.pending = None
        self._sync(committed)


class SuffixFirstDrafter(FirstThenFallback):
    """Suffix decoding where its index matches MIN_FALLBACK_MATCH+ tokens and drafts a tree worth verifying, another
    drafter (the EAGLE tree) elsewhere. The choice depends on the committed text and earlier runs only, so each
    round stays exact (see FirstThenFallback)."""

    def __init__(self, fallback: Drafter, suffix: SuffixDrafter | None = None,
                 min_match: int = MIN_FALLBACK_MATCH, min_expected: float = 0.0):
        super().__init__(suffix or SuffixDrafter(), fallback, "suffix")
        self.min_match = min_match
        self.min_expected = min_expected     # the suffix tree's expected accepted tokens (sum of its scores) needed

    @property
    def suffix(self) -> SuffixDrafter:
        return self.first

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator):
        proposal = self.suffix.propose(committed, k, params, generator) if k else None
        if proposal is not None and proposal.tree.tokens and self.suffix.last_match >= self.min_match \
                and sum(self.suffix.last_scores) >= self.min_expected:
            self.first_drafted = True
            return proposal
        self.suffix.pending = None
        return self.fallback_propose(committed, k, params, generator) if k else Proposal([], None)
