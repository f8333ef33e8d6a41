"""The drafter protocol (defined beside the loop that calls it, core/drafting.py) and helpers drafters share."""
from __future__ import annotations

from spec_engine.core.drafting import Drafter, Proposal, TreeProposal
from spec_engine.core.tree_rule import TokenTree

__all__ = ["Drafter", "Proposal", "TreeProposal", "TokenTree", "vocab_size", "common_prefix_len", "trie_tree"]


def vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def trie_tree(branches: list[list[int]], budgets: list[int]) -> TokenTree:
    """Merge continuations into one deterministic token tree (a trie: continuations that share a prefix share its
    nodes, so siblings are distinct tokens). Branch j adds at most budgets[j] new nodes; nodes come in insertion
    order, so every parent precedes its children."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for branch, budget in zip(branches, budgets):
        node, added = -1, 0
        for token in branch:
            if (node, token) not in index:
                if added == budget:
                    break
                index[(node, token)] = len(tokens)
                tokens.append(token)
                parents.append(node)
                added += 1
            node = index[(node, token)]
    return TokenTree.of(tokens, parents, "deterministic")
