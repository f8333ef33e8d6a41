"""EAGLE-2 (Li et al. 2024, "dynamic draft trees"): the EAGLE head grows a tree by path confidence, then keeps the
nodes most likely to be accepted.

Path confidence: a node's score is the product of the head's probabilities along its path from the root, the
head's own estimate of the odds that the target accepts the whole path (EAGLE-2 shows the head is calibrated enough
for this). The tree grows level by level:

    level 1      the root's top `width` tokens (from the head's prediction for the newest committed token)
    level d + 1  the `width` level-d nodes of highest score are expanded: one head forward over that frontier (each
                 row the pair (parent's predicted feature, node token) at its depth, under a tree mask: it sees the
                 committed pairs, its ancestors' pairs of this round and itself), top `width` children each

After `depth` levels every candidate node is ranked by score and the best N kept: N = `nodes` when given, else the
N <= k with the most expected tokens (1 + the sum of the kept scores) per verify cost (`sizing.verify_costs`, the
target's measured curve, as the chain drafters size theirs). A node scores no more than its parent (ties go to the
earlier node, and parents come first), so the kept set is closed under parents; it is emitted depth first, the
head's top-1 spine first (`depth_first`), so it is topological, siblings keep the head's order, and a path accepted
along the spine needs no move in the target's cache.

Exactness: siblings are the head's top tokens, chosen, not drawn (drawn="deterministic", q one-hot per sibling), and
the whole tree is a function of the committed text alone, under greedy and sampling alike; the tree rule is exact
for any such tree (core/tree_rule.py). Under sampling the scores use the head's warped distribution (what the
target's warped p is tested against), so the ranking follows acceptance; sampled siblings would need their q rows,
and pruning them by their own drawn values would bias them, so they are not offered here.

The head's KV cache: between rounds it holds the committed pairs only (`EagleDrafter`'s invariant); a round's
pairs are appended while growing and trimmed away before the proposal is returned, and rollback feeds the true
features of the accepted path (the engine hands them over from its tree forward).
"""
from __future__ import annotations

from pathlib import Path

import torch

from spec_engine.core import drafting, speed
from spec_engine.core.cache import check_invariant, trim_cache
from spec_engine.core.sampling import SamplingParams, warp
from spec_engine.drafters.base import Proposal, TokenTree, TreeProposal
from spec_engine.drafters.eagle import DEFAULT_WEIGHTS, EagleDrafter, recommended_settings, shared_head
from spec_engine.drafters.sizing import size_draft

# children per expanded node, and nodes expanded per level (docs/benchmarks.md: 3 and 4 tie at 4 nodes, 4 gives 2% more
# tokens per forward at 8; a 5th never helped)
EAGLE_TREE_WIDTH = 4
EAGLE_TREE_DEPTH = 5       # levels grown (head forwards: depth - 1)


class EagleTreeDrafter(EagleDrafter):
    """The EAGLE head drafting an EAGLE-2 dynamic tree (see the module docstring). `nodes`: keep this many nodes
    (at most k) every round instead of sizing the tree by cost; `size_by_cost=False` with no `nodes` keeps k.
    `min_path_confidence`: only nodes scoring at least this are expanded (the chain drafter's path stop, the same
    measured value by default): a round whose branches are all long shots stops growing early, saving head forwards
    whose children the cost sizing would rarely keep."""

    def __init__(self, head, target_model, vocab_index: torch.Tensor, name: str = "eagle-tree",
                 width: int = EAGLE_TREE_WIDTH, depth: int = EAGLE_TREE_DEPTH, nodes: int | None = None,
                 size_by_cost: bool = True, min_path_confidence: float = 0.0, lm_head=None):
        for label, value in (("width", width), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
            raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
        super().__init__(head, target_model, vocab_index, name=name, size_by_cost=size_by_cost and nodes is None,
                         min_path_confidence=min_path_confidence, lm_head=lm_head)
        self.width, self.depth, self.nodes = width, depth, nodes
        self.prune_unkeepable = True             # skip growth `_keep` could never keep (`_could_keep_deeper`)
        self.last_scores: list[float] = []       # the kept nodes' path confidences, for benchmarks and displays

    def _confidences(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """[m, N] reduced logits -> [m, N] the head's probabilities that rank its tokens."""
        logits = logits.to(self.target.dtype)
        return torch.softmax(logits.float(), -1) if params.greedy else warp(logits, params)

    @torch.inference_mode()
    def _expand(self, features: torch.Tensor, token_ids: list[int], depths: list[int], ancestors: list[list[int]],
                committed_len: int) -> torch.Tensor:
        """One head forward over a frontier: pairs (features [m, H], token_ids) at depths, row j seeing the committed
        pairs, the cache slots `ancestors[j]` (this round's pairs of its ancestors) and itself. Returns the
        predicted features [m, H]; the pairs stay in the cache until the round trims them."""
        cached, m = self.cache.get_seq_length(), len(token_ids)
        device = self.embed.device
        visible = torch.zeros(m, cached + m, dtype=torch.bool, device=device)
        visible[:, :self._true_len] = True
        for j, slots in enumerate(ancestors):
            visible[j, slots] = True
            visible[j, cached + j] = True
        next_embeds = self.embed[torch.tensor(token_ids, device=device)].to(self.dtype)    # [m, H]
        positions = torch.tensor([committed_len - 2 + d for d in depths], device=device)[None]   # [1, m]
        with speed.active().products():
            return self.head(features.to(self.dtype)[None], next_embeds[None], positions, self.cache,
                             visible=visible)[0]                                          # visible [m, cached + m]

    def _children(self, probs: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """probs [m, N] -> per row its top `width` reduced indices with probability > 0, and those probabilities."""
        values, indices = torch.topk(probs.float(), min(self.width, probs.shape[-1]), dim=-1)
        picked, scores = [], []
        for row_values, row_indices in zip(values.tolist(), indices.tolist()):
            kept = [(i, v) for i, v in zip(row_indices, row_values) if v > 0]
            picked.append([i for i, _ in kept])
            scores.append([v for _, v in kept])
        return picked, scores

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator):
        if drafting.chains_wanted():                # a batch sizing by the chain's model (core/drafting.py says why)
            return super().propose(committed, k, params, generator)
        if self._predicted is None or k == 0:
            return Proposal([], None)
        assert self.cache_ids == committed[:-1], "the head cache must hold committed[:-1] before drafting"
        tokens: list[int] = []          # every candidate node, in creation order (parents first)
        parents: list[int] = []
        depths: list[int] = []
        scores: list[float] = []        # path confidence
        slot: dict[int, int] = {}       # expanded node -> its pair's cache position this round
        predicted: dict[int, torch.Tensor] = {-1: self._predicted}   # expanded node (-1: root) -> its predicted feature
        frontier = [-1]
        with speed.active().products():
            probs = self._confidences(self.lm_head(self._predicted[None]), params)         # [1, N]
        for level in range(1, self.depth + 1):
            picked, picked_scores = self._children(probs)
            new = []
            for row, node in enumerate(frontier):
                base = 1.0 if node < 0 else scores[node]
                for index, p in zip(picked[row], picked_scores[row]):
                    tokens.append(self._vocab_ids[index])
                    parents.append(node)
                    depths.append(level)
                    scores.append(base * p)
                    new.append(len(tokens) - 1)
            if level == self.depth or not new or (level == 1 and not self._worth_growing(max(scores), k)):
                break
            frontier = [i for i in sorted(new, key=lambda i: (-scores[i], i))[:self.width]
                        if scores[i] >= self.min_path_confidence]
            if not frontier:
                break               # every branch is a long shot: skip the head forwards its children would cost
            if self.prune_unkeepable and not self._could_keep_deeper(scores, frontier, level, k):
                break
            start = self.cache.get_seq_length()
            features = self._expand(torch.stack([predicted[parents[i]] for i in frontier]),
                                    [tokens[i] for i in frontier], [depths[i] for i in frontier],
                                    [[slot[a] for a in ancestors_of(parents, i)] for i in frontier],
                                    len(committed))                                      # [m, H]
            for j, i in enumerate(frontier):
                slot[i], predicted[i] = start + j, features[j]
            with speed.active().products():
                probs = self._confidences(self.lm_head(features), params)                   # [m, N]
        trim_cache(self.cache, self._true_len)           # nothing of the round stays in the head's cache
        check_invariant(self.cache, len(self.cache_ids), f"draft ({self.name})")
        keep, note = self._keep(scores, k), None
        if not keep and scores and self.costs is not None:
            keep, note = self._paused(scores, parents, k)
        keep = depth_first(keep, parents)
        self.last_scores = [scores[i] for i in keep]
        renumber = {old: new for new, old in enumerate(keep)}
        tree = TokenTree.of([tokens[i] for i in keep], [renumber.get(parents[i], -1) for i in keep])
        return TreeProposal(tree, None, note=note)

    def _paused(self, scores: list[float], parents: list[int], k: int) -> tuple[list[int], str | None]:
        """No tree pays on the cost curve: the chain drafters' pause and probe (sizing.CostView.size) on the tree's
        top-1 spine, whose chances are its nodes' conditional confidences. A paused round keeps nothing and says so
        with the numbers; every probe_every paused rounds a probe keeps the spine's first nodes, so that a wrong
        curve is measured again (issue #36). Which nodes are kept depends on the head's scores and the round count
        only, never on the target, so the round stays exact."""
        spine, node = [], -1
        while True:
            children = [i for i, parent in enumerate(parents) if parent == node]
            if not children:
                break
            node = max(children, key=lambda i: (scores[i], -i))
            spine.append(node)
        chances = [scores[spine[0]]] + [scores[b] / scores[a] if scores[a] > 0 else 0.0
                                         for a, b in zip(spine, spine[1:])]
        length, note = size_draft(chances[:min(k, self.nodes or k)], self.costs)
        return spine[:length], note

    def _could_keep_deeper(self, scores: list[float], frontier: list[int], level: int, k: int) -> bool:
        """Whether a child of the frontier could be among the nodes `_keep` keeps. At most N = min(k, nodes) are kept
        (the cost sizing keeps a prefix of the same ranking), so no child can be when (a) it would sit below level
        N (its path alone would be N + 1 nodes), or (b) N nodes already score at least the best frontier node,
        which bounds every descendant's score (a product of probabilities), and ties go to the earlier node. The
        tree kept is the same as without this check; the round skips head forwards whose nodes would be dropped."""
        budget = min(k, self.nodes or k)
        if level >= budget:
            return False
        best = max(scores[i] for i in frontier)
        return sum(score >= best for score in scores) < budget

    def _worth_growing(self, best: float, k: int) -> bool:
        """Whether any tree could pay for its verify rows: no node scores above the root's best child (`best`), so m
        nodes bring at most m * best expected tokens; if no m <= k beats drafting nothing on the cost curve, the
        round stops after its first level (the sizing then keeps nothing) instead of paying for head forwards."""
        if self.costs is None:
            return True
        budget = min(k, self.nodes or k, len(self.costs) - 2)
        return any((1.0 + m * best) / self.costs[m + 1] > 1.0 / self.costs[1] for m in range(1, budget + 1))

    def _keep(self, scores: list[float], k: int) -> list[int]:
        """The best nodes by path confidence (ties: the earlier node), closed under parents, in creation order."""
        ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        budget = min(k, self.nodes or k, len(ranked))
        if self.costs is not None:                      # most expected tokens per verify cost
            costs = self.costs
            budget = min(budget, len(costs) - 2)
            expected, best, best_value = 1.0, 0, 1.0 / costs[1]
            for m in range(1, budget + 1):
                expected += scores[ranked[m - 1]]
                if expected / costs[m + 1] > best_value:
                    best, best_value = m, expected / costs[m + 1]
            budget = best
        return sorted(ranked[:budget])


def depth_first(nodes: list[int], parents: list[int]) -> list[int]:
    """`nodes` (closed under parents) in depth-first preorder, each node's children in creation order: the head's
    top-1 spine first, then the other branches. It is still topological and siblings keep the head's order; and
    since the target's verify forward puts node i at cache place start + i (core/decoder.py tree_step), a path
    accepted along the spine is already where keep_path wants it, so the round moves no keys and values."""
    children: dict[int, list[int]] = {}
    for node in sorted(nodes):
        children.setdefault(parents[node], []).append(node)
    order, stack = [], children.get(-1, [])[::-1]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(children.get(node, [])[::-1])
    return order


def ancestors_of(parents: list[int], node: int) -> list[int]:
    """The nodes above `node` (not itself), root's child first."""
    path = []
    node = parents[node]
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def load_eagle_tree_drafter(target_model, path: Path = DEFAULT_WEIGHTS, nodes: int | None = None,
                            fixed_length: bool = False, width: int = EAGLE_TREE_WIDTH,
                            depth: int = EAGLE_TREE_DEPTH) -> EagleTreeDrafter:
    """The shipped head as an EAGLE-2 tree drafter for `target_model` (its device, `head_dtype`). `fixed_length`
    keeps k nodes every round (no cost sizing, no path stop); `nodes` keeps that many (at most k). The expansion
    floor is the head record's measured path stop (`recommended_settings`)."""
    head, vocab_index, lm_head = shared_head(target_model, path)
    floor = 0.0 if fixed_length else float(recommended_settings(path).get("min_path_confidence", 0.0))
    return EagleTreeDrafter(head, target_model, vocab_index, width=width, depth=depth, nodes=nodes,
                            size_by_cost=not fixed_length, min_path_confidence=floor, lm_head=lm_head)
