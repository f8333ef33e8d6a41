"""Exact enumeration for the tree rule (core/tree_rule.py): on a tiny vocabulary, speculative rounds that draft a
token tree and verify it with recursive rejection sampling emit tokens with exactly the target's warped
probabilities (the joint law of the first LENGTH tokens, to 1e-9 in float64), for trees of several shapes, siblings
drawn with replacement, without replacement and deterministically (top-k of q), and several warping settings. The
same enumeration shows the deliberately wrong tree rule drifts. A chain tree is the chain rule draw for draw, and
greedy on every tree is plain greedy decoding.

The enumerator follows test_verify_enumeration.py: every tree the drafter could draw after every context, weighted
by its probability under q (with replacement: the product of q; without: each draw renormalized over what is left;
deterministic: the top-k of q, weight 1), and every cell of the rule's random draws. A node's uniform matters only
through `u < acceptance probability`, the point only through the CDF of the distribution the token comes from: the
cells are cut where the verdict says and the rule is evaluated at each cell's midpoint, so a rule that reports one
probability and uses another lands its outcomes in the wrong cells and fails.
"""
import itertools
import math
import zlib
from functools import lru_cache

import numpy as np
import pytest
import torch

from spec_engine.core.rule import speculative_step
from spec_engine.core.sampling import SamplingParams, warp
from spec_engine.core.tree_rule import TokenTree, tree_greedy_step, tree_step

VOCAB = 3
LENGTH = 3     # the joint law of the first 3 emitted tokens: a 2-level tree's whole path plus the token after it


def toy_logits(kind: str, context: tuple, salt: int) -> torch.Tensor:
    seed = zlib.crc32(repr((kind, context, salt)).encode())
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2.0


class Toy:
    """A context-dependent target p and draft q over VOCAB tokens, both warped with the same settings."""

    def __init__(self, params: SamplingParams, salt: int):
        self.params, self.salt = params, salt

    @lru_cache(maxsize=None)
    def p(self, context: tuple) -> torch.Tensor:
        return warp(toy_logits("target", context, self.salt), self.params)

    @lru_cache(maxsize=None)
    def q(self, context: tuple) -> torch.Tensor:
        return warp(toy_logits("draft", context, self.salt), self.params)


# Shapes: parents of each node. A chain, one node with 2 and 3 children, two 2-level trees.
SHAPES = {"chain": [-1, 0], "fan2": [-1, -1], "fan3": [-1, -1, -1], "fan2x2": [-1, -1, 0, 0], "fork": [-1, -1, 0, 1, 0]}
MIXED = "mixed"           # the root's children top-k (deterministic), everything below drawn with replacement
SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.5, top_k=2),
            SamplingParams(2.0, top_p=0.5)]


def drawn_for(parents: list[int], how: str) -> list[str]:
    if how == MIXED:
        return ["deterministic"] + ["with_replacement"] * len(parents)
    return [how] * (len(parents) + 1)


def prune(parents: list[int], drawn: list[str], depth_limit: int) -> tuple[list[int], list[str]]:
    """The shape cut to depth <= depth_limit (deeper nodes cannot affect the first LENGTH tokens)."""
    depth = TokenTree.of([0] * len(parents), parents).depths()
    kept = [i for i in range(len(parents)) if depth[i] <= depth_limit]
    index = {old: new for new, old in enumerate(kept)}
    return [index.get(parents[i], -1) for i in kept], [drawn[0]] + [drawn[i + 1] for i in kept]


def tree_draws(toy: Toy, parents: list[int], drawn: list[str], context: tuple):
    """Every tree the drafter can draw after `context`, with its probability: yields (TokenTree, weight). A sibling
    that cannot be drawn without replacement (nothing of q left) is not drawn, with its subtree."""
    n = len(parents)

    def path_tokens(tokens, node):
        out = []
        while node >= 0:
            out.append(tokens[node])
            node = parents[node]
        return tuple(out[::-1])

    def visit(i: int, tokens: list, weight: float):
        if i == n:
            yield tokens, weight
            return
        parent = parents[i]
        if parent >= 0 and tokens[parent] is None:
            yield from visit(i + 1, tokens + [None], weight)
            return
        q = toy.q(context + path_tokens(tokens, parent)).tolist()
        earlier = [tokens[j] for j in range(i) if parents[j] == parent and tokens[j] is not None]
        how = drawn[parent + 1]
        if how == "deterministic":
            order = sorted(range(VOCAB), key=lambda x: (-q[x], x))
            yield from visit(i + 1, tokens + [order[len(earlier)]], weight)
        elif how == "with_replacement":
            for x in range(VOCAB):
                if q[x] > 0:
                    yield from visit(i + 1, tokens + [x], weight * q[x])
        else:
            left = 1.0 - sum(q[x] for x in earlier)
            options = [x for x in range(VOCAB) if x not in earlier and q[x] > 0]
            if not options:
                yield from visit(i + 1, tokens + [None], weight)
            for x in options:
                yield from visit(i + 1, tokens + [x], weight * q[x] / left)

    for tokens, weight in visit(0, [], 1.0):
        kept = [i for i in range(n) if tokens[i] is not None]
        index = {old: new for new, old in enumerate(kept)}
        tree = TokenTree([tokens[i] for i in kept], [index.get(parents[i], -1) for i in kept],
                         [drawn[0]] + [drawn[i + 1] for i in kept])
        yield tree, weight


def rows(toy: Toy, tree: TokenTree, context: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q at the root and after every node: [n + 1, vocab] each."""
    contexts = [context] + [context + tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree.tokens))]
    return torch.stack([toy.p(c) for c in contexts]), torch.stack([toy.q(c) for c in contexts])


def cells(breaks: list[float]) -> list[tuple[float, float]]:
    """[0, 1) cut at `breaks`: (midpoint, width) of every nonempty cell."""
    edges = sorted({0.0, 1.0, *(min(max(b, 0.0), 1.0) for b in breaks)})
    return [((lo + hi) / 2, hi - lo) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def round_outcomes(p: torch.Tensor, q: torch.Tensor, tree: TokenTree, rule: str) -> dict:
    """{(accepted path's tokens, next token): probability} of one tree round over its uniforms and CDF point. An
    undecided node's uniform is NaN (never below anything: the rule rejects it and goes on); the first NaN node the
    verdict tried is decided next, cut at the acceptance probability the verdict reports for it."""
    outcomes: dict = {}

    def visit(uniforms: list[float], weight: float) -> None:
        probe = tree_step(p, q, tree, uniforms, 0.5, rule)
        pending = next(((node, chance) for node, chance in probe.tried if math.isnan(uniforms[node])), None)
        if pending is not None:
            node, chance = pending
            for middle, width in cells([chance]):
                visit(uniforms[:node] + [middle] + uniforms[node + 1:], weight * width)
            return
        dist = probe.next_probs.tolist()
        for middle, width in cells(list(np.cumsum(dist) / sum(dist))):
            verdict = tree_step(p, q, tree, uniforms, middle, rule)
            key = (tuple(tree.tokens[i] for i in verdict.accepted), verdict.token)
            outcomes[key] = outcomes.get(key, 0.0) + weight * width
    visit([math.nan] * len(tree.tokens), 1.0)
    return outcomes


def emitted_distribution(toy: Toy, parents: list[int], drawn: list[str], rule: str) -> dict:
    """Exact law of the first LENGTH tokens emitted by tree rounds (each round's tree cut to the depth that can still
    matter), keyed by the LENGTH-token prefix."""

    @lru_cache(maxsize=None)
    def after(context: tuple) -> dict:
        if len(context) >= LENGTH:
            return {(): 1.0}
        shape, how = prune(parents, drawn, LENGTH - len(context) - 1)
        dist: dict = {}
        for tree, weight in tree_draws(toy, shape, how, context):
            p, q = rows(toy, tree, context)
            for (path, token), chance in round_outcomes(p, q, tree, rule).items():
                emitted = (path + (token,))[:LENGTH - len(context)]
                for rest, more in after(context + emitted).items():
                    key = emitted + rest
                    dist[key] = dist.get(key, 0.0) + weight * chance * more
        return dist

    return after(())


def target_distribution(toy: Toy) -> dict:
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        dist[seq] = math.prod(float(toy.p(seq[:i])[y]) for i, y in enumerate(seq))
    return dist


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("how", ["with_replacement", "without_replacement", "deterministic", MIXED])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("salt", [0, 1])
def test_tree_rule_emits_the_target_distribution(params, how, shape, salt):
    toy = Toy(params, salt)
    got = emitted_distribution(toy, SHAPES[shape], drawn_for(SHAPES[shape], how), "exact")
    want = target_distribution(toy)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for seq in want:
        assert abs(got.get(seq, 0.0) - want[seq]) < 1e-9, seq


@pytest.mark.parametrize("how", ["with_replacement", "without_replacement", "deterministic"])
@pytest.mark.parametrize("shape", ["fan2", "fan2x2"])
def test_the_wrong_tree_rule_drifts_from_the_target(how, shape):
    """tree_best_sibling (no residual update between siblings) is refuted by the same enumeration."""
    toy = Toy(SamplingParams(1.0), salt=0)
    tv = total_variation(emitted_distribution(toy, SHAPES[shape], drawn_for(SHAPES[shape], how), "tree_best_sibling"),
                         target_distribution(toy))
    assert tv > 0.1, f"tree_best_sibling should visibly differ from the target (TV {tv:.4f})"


@pytest.mark.parametrize("drawn", ["with_replacement", "without_replacement", "deterministic"])
def test_a_chain_tree_is_the_chain_rule_draw_for_draw(drawn):
    """A tree with one child per node, drawn any way (one sibling: nothing to replace), gives speculative_step's
    accepted count and next token for the same draws, bitwise: random p, q, drafts and draws over 300 tokens,
    float32 and float64, long acceptances included."""
    generator = torch.Generator().manual_seed(5)
    for trial in range(300):
        dtype = (torch.float64, torch.float32)[trial % 2]
        n = trial % 5
        params = SamplingParams(0.9, top_p=(1.0, 0.8, 0.5)[trial % 3])
        target_probs = warp(torch.randn(n + 1, 300, generator=generator, dtype=dtype) * 3, params)   # [n + 1, vocab]
        draft_probs = warp(torch.randn(n + 1, 300, generator=generator, dtype=dtype) * 3, params)    # [n + 1, vocab]
        if trial % 7 == 0:
            draft_probs = target_probs.clone()
        drafted = torch.multinomial(draft_probs[:n], 1, generator=generator)[:, 0].tolist() if n else []
        q_rows = torch.nn.functional.one_hot(torch.tensor(drafted, dtype=torch.long), 300).to(dtype) \
            if drawn == "deterministic" else draft_probs[:n]
        uniforms = torch.rand(n, generator=generator, dtype=torch.float64).tolist()
        point = float(torch.rand((), generator=generator, dtype=torch.float64))
        chain = speculative_step(target_probs, q_rows, drafted, uniforms, point)
        verdict = tree_step(target_probs, None if drawn == "deterministic" else draft_probs,
                            TokenTree.chain(drafted, drawn), uniforms, point)
        assert (len(verdict.accepted), verdict.token) == chain, trial
        assert verdict.accepted == list(range(chain[0]))


@pytest.mark.parametrize("params", SETTINGS[:2], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("how", ["with_replacement", "without_replacement", "deterministic", MIXED])
@pytest.mark.parametrize("shape", ["chain", "fan3", "fork"])
def test_strict_on_a_tree_emits_the_target_distribution(params, how, shape):
    """strict on a tree (the target's own draw, kept when it is a child: siblings tried as if chosen, q not read) is
    exact for trees drawn any way: the same enumeration as the exact rule's."""
    toy = Toy(params, salt=0)
    got = emitted_distribution(toy, SHAPES[shape], drawn_for(SHAPES[shape], how), "strict")
    want = target_distribution(toy)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for seq in want:
        assert abs(got.get(seq, 0.0) - want[seq]) < 1e-9, seq


def expected_kept(toy: Toy, shape: str, how: str, rule: str) -> float:
    """The expected number of nodes a first round keeps: over the tree's draws and the round's own."""
    parents = SHAPES[shape]
    total = 0.0
    for tree, weight in tree_draws(toy, parents, drawn_for(parents, how), ()):
        p, q = rows(toy, tree, ())
        total += weight * sum(chance * len(path) for (path, _), chance in round_outcomes(p, q, tree, rule).items())
    return total


@pytest.mark.parametrize("shape", ["chain", "fan2", "fan2x2"])
def test_strict_keeps_fewer_nodes_than_exact_from_a_sampled_tree_and_as_many_from_a_chosen_one(shape):
    """Issue #37: strict's acceptance is at most exact's. From siblings drawn from q, exact keeps x with
    min(1, r/q) >= r; from siblings chosen (top-k, lookup) both keep x with r(x), so they keep alike."""
    toy = Toy(SamplingParams(1.0), salt=0)
    for how in ("with_replacement", "without_replacement"):
        exact, strict = expected_kept(toy, shape, how, "exact"), expected_kept(toy, shape, how, "strict")
        assert strict < exact - 0.01, (how, strict, exact)
    chosen = [expected_kept(toy, shape, "deterministic", rule) for rule in ("exact", "strict")]
    assert chosen[0] == pytest.approx(chosen[1], abs=1e-12)


@pytest.mark.parametrize("how", ["with_replacement", "deterministic"])
@pytest.mark.parametrize("shape", ["chain", "fan2x2"])
def test_typical_on_a_tree_drifts_from_the_target(how, shape):
    """Medusa's typical acceptance keeps any node above its threshold: on these toys (three tokens, thresholds near
    0.09) it keeps nearly every draft, so the text follows the draft more than the target."""
    toy = Toy(SamplingParams(1.0), salt=0)
    tv = total_variation(emitted_distribution(toy, SHAPES[shape], drawn_for(SHAPES[shape], how), "typical"),
                         target_distribution(toy))
    assert tv > 0.05, f"typical should visibly differ from the target (TV {tv:.4f})"


def test_typical_on_a_chain_tree_is_the_chain_rule_draw_for_draw():
    """A one-child-per-node tree under typical keeps what speculative_step's typical keeps, and emits the same token
    for the same point (no uniform decides a node)."""
    generator = torch.Generator().manual_seed(9)
    for trial in range(200):
        n = trial % 5
        params = SamplingParams(0.9, top_p=(1.0, 0.8)[trial % 2])
        target_probs = warp(torch.randn(n + 1, 50, generator=generator, dtype=torch.float64) * 2, params)
        drafted = torch.multinomial(target_probs[:n], 1, generator=generator)[:, 0].tolist() if n else []
        if n and trial % 3 == 0:
            drafted[-1] = int(target_probs[n - 1].argmin())        # a draft below the threshold
        uniforms = torch.rand(n, generator=generator, dtype=torch.float64).tolist()
        point = float(torch.rand((), generator=generator, dtype=torch.float64))
        one_hot = torch.nn.functional.one_hot(torch.tensor(drafted, dtype=torch.long), 50).double()
        chain = speculative_step(target_probs, one_hot, drafted, uniforms, point, "typical")
        verdict = tree_step(target_probs, None, TokenTree.chain(drafted), uniforms, point, "typical")
        assert (len(verdict.accepted), verdict.token) == chain, trial


def test_the_deepest_passing_path_wins_under_typical_and_strict_ignores_q():
    """typical keeps the deepest passing node's path (Medusa's longest accepted candidate), not the first sibling
    that passes; strict decides the same whatever q the siblings came from."""
    p = torch.tensor([[0.5, 0.4, 0.1], [0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]], dtype=torch.float64)
    tree = TokenTree.of([0, 1, 1], [-1, -1, 1])        # node 0 (token 0) is a leaf; node 1 (token 1) has a child
    verdict = tree_step(p, None, tree, [0.5] * 3, 0.5, "typical")
    assert verdict.accepted == [1, 2] and verdict.tried == [(0, 1.0), (1, 1.0), (2, 1.0)]
    sampled = TokenTree([0, 1, 1], [-1, -1, 1], ["with_replacement"] * 4)
    for q in (torch.full((4, 3), 1 / 3, dtype=torch.float64), p.flip(-1)):
        for u in ([0.1, 0.3, 0.2], [0.6, 0.9, 0.95], [0.45, 0.7, 0.6]):
            strict = tree_step(p, q, sampled, u, 0.5, "strict")
            chosen = tree_step(p, None, tree, u, 0.5, "exact")       # siblings chosen: accept with r(x)
            assert (strict.accepted, strict.token) == (chosen.accepted, chosen.token), (q, u)


def test_typical_keeps_the_first_deepest_path_and_reports_each_judged_node():
    """A deeper node may come before a shallower one in node order: the deepest passing node wins, the first in
    node order among equals, and every judged node is reported with 1.0 if it passed, 0.0 if not. A draft exactly
    at its threshold is refused (Medusa's strict >)."""
    row = [0.4, 0.3, 0.25, 0.05]                            # threshold min(0.09, 0.3 exp(-H)) = 0.09: token 3 fails
    p = torch.tensor([row] * 6, dtype=torch.float64)
    #                           A  A's child  B  B's child  a failing sibling of A and B
    tree = TokenTree.of([0, 1, 2, 0, 3], [-1, 0, -1, 2, -1])
    verdict = tree_step(p, None, tree, [0.5] * 5, 0.5, "typical")
    assert verdict.accepted == [0, 1]
    assert verdict.tried == [(0, 1.0), (1, 1.0), (2, 1.0), (4, 0.0)]
    at_threshold = torch.tensor([[0.91, 0.09], [0.5, 0.5]], dtype=torch.float64)
    assert tree_step(at_threshold, None, TokenTree.of([1], [-1]), [0.5], 0.1, "typical").accepted == []


def test_a_second_sibling_gets_the_residual_not_p():
    """Forced case: p = [0.5, 0.5, 0], siblings 0 then 1 drawn with replacement from q = [0.5, 0.5, 0]. Sibling 0 is
    accepted with probability 1; were it refused, the residual max(0, p - q) would be empty. With q = [1, 0, 0]
    (sibling 0 drawn from a point mass) sibling 0 is accepted w.p. 0.5; after a refusal the residual is one-hot on
    token 1, so sibling 1 (q(1) = 0) is rejected and the correction is 1, for every draw."""
    p = torch.tensor([[0.5, 0.5, 0.0]] * 3, dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0]] * 3, dtype=torch.float64)
    tree = TokenTree.of([0, 1], [-1, -1], "with_replacement")
    for point in (0.01, 0.5, 0.99):
        verdict = tree_step(p, q, tree, [0.7, 0.0], point)
        assert (verdict.accepted, verdict.token) == ([], 1)
        assert verdict.tried == [(0, 0.5), (1, 0.0)]
    wrong = tree_step(p, q, tree, [0.7, 0.0], 0.5, "tree_best_sibling")
    assert wrong.tried == [(0, 0.5), (1, 0.0)]
    deterministic = TokenTree.of([0, 1], [-1, -1], "deterministic")
    exact = tree_step(p, None, deterministic, [0.7, 0.99], 0.5)
    assert exact.tried == [(0, 0.5), (1, 1.0)] and exact.accepted == [1]       # the residual is one-hot on 1
    wrong = tree_step(p, None, deterministic, [0.7, 0.99], 0.5, "tree_best_sibling")
    assert wrong.tried == [(0, 0.5), (1, 0.5)] and wrong.accepted == []


def test_without_replacement_renormalizes_q_after_each_rejected_sibling():
    """p = [0.1, 0.45, 0.45], q = [0.6, 0.3, 0.1]; siblings 0 then 1. Sibling 0: min(1, 0.1 / 0.6). Refused: r =
    normalize(max(0, p - q)) = [0, 0.3, 0.7]. Drawn without replacement, sibling 1 came from q_2 = [0, 0.75, 0.25]:
    min(1, 0.3 / 0.75) = 0.4; drawn with replacement it came from q: min(1, 0.3 / 0.3) = 1."""
    p = torch.tensor([[0.1, 0.45, 0.45]] * 3, dtype=torch.float64)
    q = torch.tensor([[0.6, 0.3, 0.1]] * 3, dtype=torch.float64)
    for drawn, second in (("without_replacement", 0.4), ("with_replacement", 1.0)):
        verdict = tree_step(p, q, TokenTree.of([0, 1], [-1, -1], drawn), [0.99, 0.99], 0.5)
        assert verdict.tried == [(0, pytest.approx(0.1 / 0.6)), (1, pytest.approx(second))], drawn


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("salt", [0, 1, 2])
def test_greedy_on_every_tree_emits_plain_greedy_decoding(shape, salt):
    """For every token assignment of the shape after every 2-token context, the accepted path's tokens and the next
    token are exactly the next tokens of plain greedy decoding, and the path is as long as the tree allows."""
    parents = SHAPES[shape]
    argmax = lambda context: int(toy_logits("target", context, salt).argmax())
    for context in itertools.product(range(VOCAB), repeat=2):
        plain = list(context)
        for _ in range(4):
            plain.append(argmax(tuple(plain)))
        expected = tuple(plain[2:])
        for tokens in itertools.product(range(VOCAB), repeat=len(parents)):
            tree = TokenTree.of(list(tokens), parents)
            contexts = [context] + [context + tuple(tokens[j] for j in tree.path_to(i)) for i in range(len(tokens))]
            logits = torch.stack([toy_logits("target", c, salt) for c in contexts]).float()       # [n + 1, vocab]
            path, token = tree_greedy_step(logits, tree)
            emitted = tuple(tokens[i] for i in path) + (token,)
            assert emitted == expected[:len(emitted)], (context, tokens)
            longest = max((len(tree.path_to(i)) for i in range(len(tokens))
                           if tuple(tokens[j] for j in tree.path_to(i)) == expected[:len(tree.path_to(i))]), default=0)
            assert len(path) == longest


def test_token_tree_names_the_bad_field():
    with pytest.raises(ValueError, match=r"parents\[1\] must be -1 \(the root\) or an earlier node, got 1"):
        TokenTree.of([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="parents must give one parent per token"):
        TokenTree.of([1, 2], [-1])
    with pytest.raises(ValueError, match=r"drawn\[0\] must be one of"):
        TokenTree([1], [-1], ["sampled", "deterministic"])
    with pytest.raises(ValueError, match="drawn must have n \\+ 1 = 2 entries"):
        TokenTree([1], [-1], ["deterministic"])
    with pytest.raises(ValueError, match=r"parents\[0\] must be -1 \(the root\) or an earlier node, got -2"):
        TokenTree.of([1], [-2])
    with pytest.raises(ValueError, match="tokens must be non-negative ids"):
        TokenTree.of([-1], [-1])
    assert TokenTree.of([5, 6, 7, 8], [-1, -1, 0, 2]).depths() == [1, 1, 2, 3]
    assert TokenTree.of([5, 6, 7, 8], [-1, -1, 0, 2]).path_to(3) == [0, 2, 3]
    assert TokenTree.chain([5, 6]).drawn == ["with_replacement"] * 3        # a chain is drawn i.i.d. by default
    p = torch.full((2, VOCAB), 1 / VOCAB, dtype=torch.float64)
    with pytest.raises(AssertionError):
        tree_step(p, None, TokenTree.chain([1], "deterministic"), [], 0.5)        # one uniform per node
    with pytest.raises(AssertionError):
        tree_step(p[:1], None, TokenTree.chain([1], "deterministic"), [0.5], 0.5)  # one row per node, plus the root


def test_a_uniform_equal_to_the_acceptance_probability_rejects_a_sibling():
    """u < min(1, r/q), strictly: at u equal to the chance the sibling is refused (as the chain rule does)."""
    p = torch.tensor([[0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    tree = TokenTree.chain([0], "deterministic")                 # accept with r(0) = 0.25
    assert tree_step(p, None, tree, [0.25], 0.1).accepted == []
    assert tree_step(p, None, tree, [0.2499], 0.1).accepted == [0]


def test_without_replacement_leaves_nothing_when_the_last_token_is_removed():
    """A one-hot q with its token removed has no mass left: all zeros (a further sibling cannot have been drawn),
    not a division by zero."""
    from spec_engine.core.tree_rule import without
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    assert without(one_hot, 1).tolist() == [0.0, 0.0, 0.0]
    assert without(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), 0).tolist() == [0.0, 1.0, 0.0]


def test_greedy_keeps_the_deepest_match_the_first_in_node_order_among_equals():
    """Duplicate siblings: the kept path is the deepest matching node's, the first in node order among nodes of the
    same depth, whatever order the branches were added in."""
    logits = torch.full((5, VOCAB), -5.0)
    logits[0, 1] = logits[1, 2] = logits[2, 2] = logits[3, 0] = logits[4, 0] = 5.0     # argmax after root, 0..3
    #           node 0     node 1 (0's child)  node 2 (dup of 0)  node 3 (2's child)
    tree = TokenTree.of([1, 2, 1, 2], [-1, 0, -1, 2])
    assert tree_greedy_step(logits, tree) == ([0, 1], 2)
    shallow_last = TokenTree.of([1, 2, 1], [-1, 0, -1])          # the later duplicate is shallower
    assert tree_greedy_step(logits[:4], shallow_last) == ([0, 1], 2)


@pytest.mark.parametrize("rule", ["exact", "strict", "typical"])
def test_verify_tree_feeds_the_reference_one_uniform_per_node_then_the_point(rule):
    """The engine's tree round (`verify.verify_tree`) draws one uniform per node (in node order, float64) and then the
    CDF point from the run's generator, and decides exactly as `tree_step` (the rule the enumeration above proves)
    fed those draws: the proof covers the engine's sampled path draw for draw. Its verdict reports each tried node's
    own uniform and acceptance probability. A node reading another node's uniform, one uniform reused, or the point
    taken from the uniforms all fail here."""
    from spec_engine.core.sampling import make_generator, unit_draw
    from spec_engine.core.verify import verify_tree
    generator = torch.Generator().manual_seed(5)
    for trial in range(120):
        shape = list(SHAPES.values())[trial % len(SHAPES)]
        drawn = drawn_for(shape, ["with_replacement", "without_replacement", "deterministic", MIXED][trial % 4])
        params = SETTINGS[trial % len(SETTINGS)]
        n = len(shape)
        logits = torch.randn(n + 1, VOCAB + 3, generator=generator, dtype=torch.float64) * 1.5      # [n + 1, vocab]
        q = warp(torch.randn(n + 1, VOCAB + 3, generator=generator, dtype=torch.float64) * 1.5, params)
        tokens = torch.multinomial(q[0], n, replacement=True, generator=generator).tolist()
        tree = TokenTree(tokens, shape, drawn)
        seed = 300 + trial
        verdict, probs = verify_tree(rule, params, tree, q, logits, make_generator("cpu", seed))
        replay = make_generator("cpu", seed)
        uniforms = torch.rand(n, generator=replay, dtype=torch.float64).tolist()
        point = float(unit_draw(replay, probs.device))
        step = tree_step(warp(logits, params), q, tree, uniforms, point, rule)
        assert (verdict.accepted, verdict.next_token) == (step.accepted, step.token), trial
        assert verdict.tried == [node for node, _ in step.tried], trial
        assert verdict.accept_probs == [chance for _, chance in step.tried], trial
        assert verdict.uniforms == [uniforms[node] for node in verdict.tried], trial
        assert torch.equal(probs, warp(logits, params)), trial
