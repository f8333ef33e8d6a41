"""Tree drafters that run a draft model: a separate small LM proposes each node's `width` siblings at once.

The draft's KV cache holds the committed text minus its newest token between rounds, as a chain drafter's does
(`ModelDrafter.rollback` trims it). A tree is grown level by level: each level is one draft forward over the tree so
far under the tree attention mask (`core.cache.forward_tree_logits`), after which the draft cache is trimmed back to
the committed text, so nothing of a proposal survives in it. Prompt lookup's tree drafter lives in lookup.py.
"""
from __future__ import annotations

import torch

from spec_engine.core.cache import check_invariant, forward_tree_logits, trim_cache
from spec_engine.core.sampling import SamplingParams, sample, warp
from spec_engine.core.tree_rule import DRAWS, TokenTree, without
from spec_engine.drafters.base import TreeProposal
from spec_engine.drafters.model import LayerSkipDrafter, ModelDrafter, layer_skip_view

TREE_WIDTH = 2            # siblings per node; not yet measured (issue #26 item 3 sizes trees from the verify costs)


class ModelTreeDrafter(ModelDrafter):
    """A separate draft model (the target's tokenizer) drafting a tree breadth first: every node of a level gets
    `width` children until k nodes are placed. The children of a node are its draft distribution's top `width`
    tokens (drawn="deterministic", the only choice under greedy), or `width` draws from it with or without
    replacement ("with_replacement", "without_replacement"); sampled trees report q at the root and after each
    node, exactly the rows they drew from, so the tree rule (core/tree_rule.py) stays exact."""

    def __init__(self, draft_model, width: int = TREE_WIDTH, drawn: str = "deterministic", name: str = "model-tree"):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be an integer >= 1, got {width!r}")
        if drawn not in DRAWS:
            raise ValueError(f"drawn must be one of {DRAWS}, got {drawn!r}")
        super().__init__(draft_model, name)
        self.width, self.drawn = width, drawn

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> TreeProposal:
        pending = committed[len(self.cache_ids):-1]            # committed tokens not yet in the cache, but the root
        if pending:
            self._feed(pending)
        drawn = "deterministic" if params.greedy else self.drawn
        tokens: list[int] = []
        parents: list[int] = []
        rows: dict[int, torch.Tensor] = {}                    # node (-1: root) -> the q its children came from
        frontier = [-1]
        while frontier and len(tokens) < k:
            tree = TokenTree.of(tokens, parents)
            logits = forward_tree_logits(self.model, committed[-1], tokens, parents, tree.depths(), self.cache)
            trim_cache(self.cache, len(self.cache_ids))   # [n + 1, vocab] read; the cache is the committed text again
            probs = torch.softmax(logits.float(), -1) if params.greedy else warp(logits, params)
            level = []
            for node in frontier:
                room = min(self.width, k - len(tokens))
                if room <= 0:
                    break
                rows[node] = probs[node + 1]
                for token in siblings(probs[node + 1], room, drawn, generator):
                    tokens.append(token)
                    parents.append(node)
                    level.append(len(tokens) - 1)
            frontier = level
        check_invariant(self.cache, len(self.cache_ids), f"draft ({self.name})")
        tree = TokenTree.of(tokens, parents, drawn)
        if drawn == "deterministic":
            return TreeProposal(tree, None)
        q = torch.zeros(len(tokens) + 1, rows[-1].shape[-1], dtype=rows[-1].dtype, device=rows[-1].device)
        for node, row in rows.items():
            q[node + 1] = row                                 # [n + 1, vocab]; leaves' rows are never read
        return TreeProposal(tree, q)


class LayerSkipTreeDrafter(ModelTreeDrafter):
    """The layer-skip self-draft (`model.LayerSkipDrafter`) growing a tree: the target's own weights with
    `skip_layers` left out, `width` siblings per node. Its cache is laid out for the full target (skipped layers stay
    empty), as the chain's is."""

    def __init__(self, target_model, skip_layers, width: int = TREE_WIDTH, drawn: str = "deterministic"):
        self.skip_layers = sorted(set(int(i) for i in skip_layers))
        self.target = target_model
        super().__init__(layer_skip_view(target_model, self.skip_layers), width, drawn,
                         name=f"layer-skip-tree{self.skip_layers}")

    # The chain's own: a cache laid out for the whole target, and the target it was built from.
    begin = LayerSkipDrafter.begin
    check_target = LayerSkipDrafter.check_target


def siblings(q_row: torch.Tensor, count: int, drawn: str, generator: torch.Generator) -> list[int]:
    """Up to `count` children from q_row [vocab]: its top tokens (ties: lowest id first), i.i.d. draws, or draws one
    after another each removed from what the next is drawn from (fewer when q runs out)."""
    if drawn == "deterministic":
        return torch.sort(q_row, descending=True, stable=True).indices[:count].tolist()
    picked: list[int] = []
    left = q_row
    for _ in range(count):
        if not bool(left.sum() > 0):
            break
        token = sample(left, generator)
        picked.append(token)
        if drawn == "without_replacement":
            left = without(left, token)
    return picked
