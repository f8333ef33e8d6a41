"""The rule on a token tree, in the papers' terms: one pure function, the reference every tree proof calls.

A draft tree proposes several continuations at once. Its nodes are draft tokens; node i hangs below `parents[i]`
(-1: below the root, the last committed token). The children of one node are *siblings*: candidates for the same
position, tried in the order they were drawn. The target scores every node in one forward, giving p at the root and
after every node.

Recursive rejection sampling (SpecInfer, Miao et al. 2024, Algorithm 2 "multi-step speculative sampling"; SpecTr,
Sun et al. 2023; Multi-candidate speculative decoding, Yang et al. 2024; Recursive speculative decoding, Jeon et
al. 2024; EAGLE-2 verifies its trees the same way). Start at the root with the residual r = p. For the
siblings x_1..x_m in order, with q_j the distribution x_j was drawn from given the earlier siblings:

  accept x_j if u_j < min(1, r(x_j) / q_j(x_j))        then descend into x_j: its children are the next candidates
  else r <- normalize(max(0, r - q_j))                  and try the next sibling
  all m rejected (or a leaf): emit a token from r       the *correction* (r = p at a leaf or a childless node: the
                                                        *bonus*)

q_j depends on how the siblings were drawn (`TokenTree.drawn`, one entry per node that has children):

  "with_replacement"     i.i.d. from q:                        q_j = q for every j
  "without_replacement"  one after another, each draw removed: q_j = q with x_1..x_{j-1} removed, renormalized
  "deterministic"        chosen, not drawn (top-k of q, lookup): q_j = one-hot at x_j, so accept with prob r(x_j) and
                         a rejection zeroes x_j out of r

Why it is exact: each try is the chain rule's step with target r and draft q_j, whose output follows r whenever
the fallback after a rejection follows normalize(max(0, r - q_j)); by induction over the remaining siblings (the
fallback of the last being a draw from that residual) the emitted token at every node follows p, and the accepted
child's subtree was drawn given that child alone, so the next level starts afresh with that node's p.
tests/test_tree_rule.py proves it by exact enumeration. A chain is the tree whose nodes each have one child; the
rule is then `rule.speculative_step`, draw for draw.

The other rules on a tree (core/rule.py says what each is on a chain):

  strict     the target's own draw at each node, kept when it is a child: the siblings are tried as if chosen, not
             drawn (accept x_j with probability r(x_j), a refusal zeroes x_j out of r), whatever q they came from. A
             chain's strict keeps x_i with probability p_i(x_i) and emits the target's own draw otherwise, the same
             law (a draw-for-draw different cut of the uniform). Exact for any draft; q is not read.
  typical    Medusa's typical acceptance on its candidate tree: a node passes when p(x) > min(epsilon, delta
             exp(-H(p))) at its parent and its parent passed; the path kept is the deepest passing node's (the first
             in node order among equals: Medusa keeps the candidate with the longest accepted prefix), and the token
             after it is a draw from p there. No uniform decides a node. Lossy.

`tree_step` takes its random draws explicitly: one uniform per node (read only if that node is tried) and one point
where the emitted token's CDF is inverted, so that tests can enumerate them. It also returns what it did (the nodes
tried with their acceptance probabilities, the distribution the token came from): the cells a proof cuts the draws
at, and what a display shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spec_engine.core.rule import EXACT, RULE_INFO, STRICT, TYPICAL, inverse_cdf, race, residual, typical_threshold

DRAWS = ("with_replacement", "without_replacement", "deterministic")
# The deliberately wrong tree rule, kept for the classroom: judge every sibling against p itself (no residual update
# between siblings) and, if all are refused, correct from the residual of the last sibling alone. Extra siblings
# become extra free chances, so the tree over-weights the draft's picks.
WRONG_TREE = tuple(name for name, info in RULE_INFO.items() if info.trees and not info.chains)    # tree_best_sibling
TREE_RULES = tuple(name for name, info in RULE_INFO.items() if info.trees)                        # exact first


@dataclass(frozen=True)
class TokenTree:
    """A draft tree in topological order: every node's parent comes before it; siblings in the order drawn."""

    tokens: list[int]           # [n] the draft token at each node
    parents: list[int]          # [n] each node's parent node; -1 for a child of the root (the last committed token)
    drawn: list[str]            # [n + 1] how the children of the root (entry 0) and of node i (entry i + 1) were drawn

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n:
            raise ValueError(f"parents must give one parent per token: {len(self.parents)} parents, {n} tokens")
        if len(self.drawn) != n + 1:
            raise ValueError(f"drawn must have n + 1 = {n + 1} entries (the root, then each node), "
                             f"got {len(self.drawn)}")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"parents[{i}] must be -1 (the root) or an earlier node, got {parent}")
        for i, how in enumerate(self.drawn):
            if how not in DRAWS:
                raise ValueError(f"drawn[{i}] must be one of {DRAWS}, got {how!r}")
        if any(token < 0 for token in self.tokens):
            raise ValueError("tokens must be non-negative ids")

    @classmethod
    def of(cls, tokens: list[int], parents: list[int], drawn: str = "deterministic") -> "TokenTree":
        """A tree whose siblings were all drawn the same way."""
        return cls(list(tokens), list(parents), [drawn] * (len(tokens) + 1))

    @classmethod
    def chain(cls, tokens: list[int], drawn: str = "with_replacement") -> "TokenTree":
        return cls.of(tokens, list(range(-1, len(tokens) - 1)), drawn)

    def children(self, node: int) -> list[int]:
        """The children of `node` (-1: the root), in the order they were drawn."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def depths(self) -> list[int]:
        """[n] each node's depth: 1 for a child of the root. The target scores node i at position (committed - 1) +
        depth, seeing the committed text and its own ancestors only."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return depth

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (inclusive)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


@dataclass(frozen=True)
class TreeVerdict:
    """accepted: the path of accepted nodes, root's child first. token: the correction (a node's children all
    rejected) or the bonus (the path ends at a leaf). tried: (node, acceptance probability) of every sibling tried,
    in order. next_probs: the distribution the token came from, [vocab]."""

    accepted: list[int]
    token: int
    tried: list[tuple[int, float]] = field(default_factory=list)
    next_probs: torch.Tensor | None = None


def tree_step(
    p: torch.Tensor,            # [n + 1, vocab] the target's warped distributions at the root (row 0) and after node i
                                #   (row i + 1)
    q: torch.Tensor | None,     # [n + 1, vocab] the distribution the children of the root (row 0) and of node i
                                #   (row i + 1) were drawn from (before any removal); rows of deterministic groups
                                #   are not read; None if all are
    tree: TokenTree,
    uniforms: list[float],      # [n] u_i in [0, 1) for node i, read only if node i is tried
    point: float,               # in [0, 1): where the emitted token's CDF is inverted
    rule: str = EXACT,
) -> TreeVerdict:
    """Walk the tree from the root with recursive rejection sampling over siblings (strict: as if every sibling were
    chosen, not drawn; typical: `tree_typical_step`); see the module docstring."""
    n = len(tree.tokens)
    assert p.shape[0] == n + 1 and len(uniforms) == n, (p.shape, n, len(uniforms))
    if rule == TYPICAL:
        return tree_typical_step(p, tree, point)
    accepted: list[int] = []
    tried: list[tuple[int, float]] = []
    node = -1
    while True:
        drawn = "deterministic" if rule == STRICT else tree.drawn[node + 1]
        chosen, left = try_siblings(p[node + 1], None if q is None or rule == STRICT else q[node + 1], drawn,
                                    [(child, tree.tokens[child]) for child in tree.children(node)], uniforms, rule,
                                    tried)
        if chosen is None:
            return TreeVerdict(accepted, inverse_cdf(left, point), tried, left)
        accepted.append(chosen)
        node = chosen


def try_siblings(p_row: torch.Tensor, q_row: torch.Tensor | None, drawn: str, siblings: list[tuple[int, int]],
                 uniforms: list[float], rule: str, tried: list) -> tuple[int | None, torch.Tensor]:
    """One node's children, tried in order: -> (the accepted child, or None; the residual left, [vocab]).
    Appends (child, acceptance probability) to `tried` for every child tried."""
    left, proposal = p_row, q_row                    # r and q_j
    for child, token in siblings:
        q_j = one_hot_like(p_row, token) if drawn == "deterministic" else proposal
        judged = p_row if rule in WRONG_TREE else left
        r_x, q_x = float(judged[token]), float(q_j[token])
        chance = min(1.0, r_x / q_x) if q_x > 0 else 0.0          # a zero draft probability rejects
        tried.append((child, chance))
        if q_x > 0 and uniforms[child] < chance:
            return child, left
        left = residual(p_row, q_j) if rule in WRONG_TREE else residual(left, q_j)
        if drawn == "without_replacement":
            proposal = without(proposal, token)
    return None, left


def tree_typical_step(p: torch.Tensor, tree: TokenTree, point: float) -> TreeVerdict:
    """Medusa's typical acceptance on a tree (see the module docstring): p [n + 1, vocab] at the root and after every
    node. `tried` holds every node judged (its parent on the kept path or the root) with 1.0 if it passed, else 0.0."""
    n = len(tree.tokens)
    thresholds = [typical_threshold(p[i]) for i in range(n + 1)]
    passed: list[bool] = []
    for token, parent in zip(tree.tokens, tree.parents):
        passed.append(float(p[parent + 1][token]) > thresholds[parent + 1] and (parent < 0 or passed[parent]))
    depth = tree.depths()
    deepest = max((i for i in range(n) if passed[i]), key=lambda i: (depth[i], -i), default=-1)
    path = tree.path_to(deepest)
    judged = {-1, *path}
    tried = [(i, 1.0 if passed[i] else 0.0) for i in range(n) if tree.parents[i] in judged]
    return TreeVerdict(path, inverse_cdf(p[deepest + 1], point), tried, p[deepest + 1])


def one_hot_like(row: torch.Tensor, token: int) -> torch.Tensor:
    hot = torch.zeros_like(row)
    hot[token] = 1.0
    return hot


def without(q_row: torch.Tensor, token: int) -> torch.Tensor:
    """q with `token` removed, renormalized: what the next draw without replacement came from. Nothing left: all
    zeros (a further sibling cannot have been drawn; the rule rejects it)."""
    rest = q_row.clone()
    rest[token] = 0.0
    total = rest.sum()
    return rest / total if total > torch.finfo(rest.dtype).tiny else torch.zeros_like(rest)


def tree_greedy_step(target_logits: torch.Tensor, tree: TokenTree,
                     best: list[int] | None = None) -> tuple[list[int], int]:
    """Greedy on a tree: a node is accepted when its token is the target's argmax after its parent and its parent
    was accepted; the path kept is the deepest accepted node's (the first in node order among equals, so duplicate
    siblings cost nothing), and the next token is the argmax after it. target_logits: [n + 1, vocab] (root, then
    after node i); `best`: their argmax rows when the caller searched them already. -> (accepted path, next token).
    The emitted tokens are exactly plain greedy decoding's."""
    n = len(tree.tokens)
    assert target_logits.shape[0] == n + 1, (target_logits.shape, n)
    best = target_logits.argmax(dim=-1).tolist() if best is None else best         # [n + 1]
    matched: list[bool] = []
    for token, parent in zip(tree.tokens, tree.parents):
        matched.append(token == best[parent + 1] and (parent < 0 or matched[parent]))
    depth = tree.depths()
    deepest = max((i for i in range(n) if matched[i]), key=lambda i: (depth[i], -i), default=-1)
    return (tree.path_to(deepest), best[deepest + 1])


def tree_invariant_step(p: torch.Tensor, tree: TokenTree, noise: torch.Tensor) -> tuple[list[int], int, list[int]]:
    """The drafter-invariant rule on a tree: p [n + 1, vocab] (row 0 after the root, row i + 1 after node i), noise
    [depth + 1, vocab] (rule.position_noise of the positions after the root, by depth). From the root, the target's
    own token at each depth is race(p_row, E_depth); walk to the child holding it while there is one, then emit it.
    -> (the accepted path, the token after it, the nodes whose tokens were compared, in order)."""
    node, path, tried = -1, [], []
    while True:
        own = race(p[node + 1], noise[len(path)])
        children = tree.children(node)
        tried += children
        match = next((child for child in children if tree.tokens[child] == own), None)
        if match is None:
            return path, own, tried
        path.append(match)
        node = match
