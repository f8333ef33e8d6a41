"""Trees in the engine: one target forward scores every node of a draft tree under a tree attention mask, the
accepted path's KV entries are moved into place and the rest dropped, and greedy tree decoding is token-identical to
plain greedy decoding: on tiny models with the speed layer on and off (the lean tree forward, and transformers' own
with the mask as `attention_mask`), and on SmolLM2-135M.

The forward is checked directly: each node's logits equal a plain forward over the committed text plus that node's
path, and the compacted cache equals a fresh prefill of the committed text, so a mask that let a node see its
siblings, wrong positions or a misplaced KV entry fail here whatever the drafter proposes.
"""
import contextlib
import random

import pytest
import torch

import spec_engine as se
from conftest import speed_layer_off
from spec_engine.core.cache import (cache_len, forward_logits, forward_tree_logits, keep_path, new_cache,
                                    tree_attention_mask)
from spec_engine.core.drafting import Drafter, TreeProposal
from spec_engine.core.tree_rule import TokenTree
from spec_engine.drafters.base import trie_tree
from spec_engine.drafters.lookup import TreeLookupDrafter, lookup_branches
from spec_engine.drafters.model import DEFAULT_SKIP_LAYERS, layer_skip_view
from spec_engine.drafters.tree import ModelTreeDrafter
from tiny import tiny_llama

GREEDY = se.SamplingParams(0.0)
SPEED = {"speed-layer-as-installed": contextlib.nullcontext, "speed-layer-off": speed_layer_off}


def test_the_tree_mask_shows_each_node_the_text_and_its_ancestors_only():
    parents = [-1, -1, 0, 2]                 # root -> a, b; a -> c -> d
    mask = tree_attention_mask(parents, cached=2, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 5, 7)
    visible = (mask[0, 0] == 0).int().tolist()
    #             cached  root  a  b  c  d
    assert visible == [[1, 1, 1, 0, 0, 0, 0],      # root
                       [1, 1, 1, 1, 0, 0, 0],      # a
                       [1, 1, 1, 0, 1, 0, 0],      # b
                       [1, 1, 1, 1, 0, 1, 0],      # c
                       [1, 1, 1, 1, 0, 1, 1]]      # d
    assert float(mask.min()) == torch.finfo(torch.float32).min
    for dtype in (torch.float64, torch.bfloat16):               # the target's dtype, not torch's default
        other = tree_attention_mask(parents, cached=2, dtype=dtype, device="cpu")
        assert other.dtype == dtype and float(other.min()) == torch.finfo(dtype).min
        assert ((other[0, 0] == 0).int().tolist()) == visible


def random_tree(rng: random.Random, vocab: int, nodes: int) -> TokenTree:
    parents = [-1] + [rng.randrange(-1, i) for i in range(1, nodes)]
    return TokenTree.of([rng.randrange(vocab) for _ in range(nodes)], parents)


@pytest.mark.parametrize("speed", list(SPEED))
def test_the_tree_forward_scores_each_node_as_its_own_path_and_the_kept_path_is_a_fresh_prefill(speed):
    target = tiny_llama(vocab=12, layers=2, seed=3)
    rng = random.Random(0)
    with SPEED[speed]():
        for trial in range(12):
            committed = [rng.randrange(12) for _ in range(3 + trial)]
            tree = random_tree(rng, 12, 1 + trial % 7)
            cache = new_cache(target)
            forward_logits(target, committed[:-1], cache, 1)
            logits = forward_tree_logits(target, committed[-1], tree.tokens, tree.parents, tree.depths(), cache)
            assert cache_len(cache) == len(committed) + len(tree.tokens)
            for node in range(-1, len(tree.tokens)):
                path = [tree.tokens[i] for i in tree.path_to(node)] if node >= 0 else []
                alone = forward_logits(target, committed + path, new_cache(target), 1)[-1]
                torch.testing.assert_close(logits[node + 1], alone, rtol=1e-4, atol=1e-4)
            node = rng.randrange(len(tree.tokens))
            path = tree.path_to(node)
            keep_path(cache, len(committed), [len(committed) + i for i in path])
            fresh = new_cache(target)
            forward_logits(target, committed + [tree.tokens[i] for i in path], fresh, 1)
            assert cache_len(cache) == cache_len(fresh) == len(committed) + len(path)
            for kept, want in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(kept.keys, want.keys, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(kept.values, want.values, rtol=1e-4, atol=1e-5)


class OracleTreeDrafter(Drafter):
    """Random deterministic trees that hide the true greedy continuation (known from a plain run) on one branch,
    at a random depth, among random siblings: long accepted paths deep in the tree, with the kept nodes scattered
    through the cache, so compaction moves entries every round."""

    name = "oracle-tree"

    def __init__(self, truth: list[int], vocab: int, seed: int):
        self.truth, self.vocab, self.rng = truth, vocab, random.Random(seed)

    def propose(self, committed, k, params, generator):
        rng, done = self.rng, len(committed) - self.prompt_len
        hidden = self.truth[done:done + rng.randrange(0, k + 1)]
        tokens, parents = [], []
        chain_at = -1
        for i in range(k):
            if hidden and rng.random() < 0.5:
                tokens.append(hidden.pop(0))
                parents.append(chain_at)
                chain_at = len(tokens) - 1
            else:
                tokens.append(rng.randrange(self.vocab))
                parents.append(rng.randrange(-1, len(tokens) - 1))
        return TreeProposal(TokenTree.of(tokens, parents), None)

    def begin(self, prompt_ids, target_features=None):
        self.prompt_len = len(prompt_ids)


@pytest.mark.parametrize("speed", list(SPEED))
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_greedy_tree_decoding_is_plain_greedy_decoding_on_tiny_models(speed, seed):
    target = tiny_llama(vocab=10, layers=2, seed=seed)
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]])
    with SPEED[speed]():
        plain = se.autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY).tokens
        drafters = {f"lookup-{b}-{k}": (lambda b=b: TreeLookupDrafter(branches=b), k)
                    for b in (1, 2, 4) for k in (1, 3, 8)}
        drafters.update({f"oracle-{k}": (lambda k=k: OracleTreeDrafter(plain, 10, seed + k), k) for k in (1, 4, 8)})
        draft = tiny_llama(vocab=10, layers=1, seed=seed + 10)
        drafters.update({f"model-{w}-{k}": (lambda w=w: ModelTreeDrafter(draft, width=w), k)
                         for w in (1, 3) for k in (1, 4, 8)})
        for name, (make, k) in drafters.items():
            result = se.SpeculativeDecoder(target, make()).generate(prompt, k=k, max_new_tokens=40, sampling=GREEDY)
            assert result.tokens == plain, name
            committed = prompt.shape[1]        # counted from what the rounds emitted, not from the engine's count
            for event in result.rounds:
                committed += len(event.emitted)
                assert event.committed_len == committed and event.target_cache_len == committed - 1, name
                assert event.target_cache_len_before == committed - len(event.emitted) + len(event.drafted), name
                if event.tree_parents is None:                    # a last round with room for no draft: a chain of 0
                    assert event.drafted == [] and event.finished, name
                    continue
                assert len(event.tree_parents) == len(event.drafted) <= k
                assert event.emitted[:event.accepted] == [event.drafted[i] for i in event.tree_path]
            if name.startswith("oracle") and k > 1:
                assert max(e.accepted for e in result.rounds) >= 2, name          # deep paths were exercised


def test_a_tree_round_stops_at_eos_inside_the_path():
    target = tiny_llama(vocab=10, layers=2, seed=1)
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]])
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY).tokens
    eos = plain[5]
    want = se.autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY, eos_token_id=eos).tokens
    result = se.SpeculativeDecoder(target, OracleTreeDrafter(plain, 10, 0)).generate(
        prompt, k=8, max_new_tokens=30, sampling=GREEDY, eos_token_id=eos)
    assert result.tokens == want and result.stop_reason == "eos"


def test_trie_tree_merges_shared_prefixes_and_respects_each_budget():
    tree = trie_tree([[5, 6, 7], [5, 6, 9], [4, 1]], [3, 1, 1])
    assert (tree.tokens, tree.parents) == ([5, 6, 7, 9, 4], [-1, 0, 1, 1, -1])
    assert trie_tree([[5, 6, 7], [4, 1, 2]], [2, 1]).tokens == [5, 6, 4]
    assert set(tree.drawn) == {"deterministic"}


def test_lookup_branches_take_longest_matches_first_then_shorter_ones():
    text = [7, 1, 2, 3, 9, 1, 2, 4, 8, 2, 5, 1, 2]      # "1 2" occurs twice before the end, "2" three times
    assert lookup_branches(text, 2, 4, 8, 1) == [[4, 8], [3, 9], [5, 1]]
    assert lookup_branches(text, 2, 1, 8, 1) == [[4, 8]]
    assert lookup_branches([1, 2, 3], 4, 3, 8, 1) == []
    with pytest.raises(ValueError, match="branches must be an integer >= 1"):
        TreeLookupDrafter(branches=0)


def test_rules_for_chains_and_rules_for_trees_name_each_other():
    target = tiny_llama(vocab=10, layers=2, seed=0)
    prompt, params = torch.tensor([[1, 2, 3, 1, 2]]), se.SamplingParams(1.0)
    decoder = se.SpeculativeDecoder(target, TreeLookupDrafter(), rule="no_residual")
    with pytest.raises(ValueError, match="a tree round's rule must be one of"):
        decoder.generate(prompt, k=3, max_new_tokens=5, sampling=params)
    decoder = se.SpeculativeDecoder(target, se.PromptLookupDrafter(sizing="full"), rule="tree_best_sibling")
    with pytest.raises(ValueError, match="rule 'tree_best_sibling' judges draft trees; prompt-lookup"):
        decoder.generate(prompt, k=3, max_new_tokens=5, sampling=params)
    one = se.SpeculativeDecoder(target, TreeLookupDrafter(), rule="tree_best_sibling").generate(
        prompt, k=3, max_new_tokens=1, sampling=params, seed=4)            # no room for drafts: a chain of none
    assert one.tokens == se.autoregressive_generate(target, prompt, max_new_tokens=1, sampling=params, seed=4).tokens


@pytest.mark.slow
def test_greedy_tree_decoding_is_plain_greedy_on_smollm2(smollm2):
    """The offline default, speed layer as installed and off, every tree drafter: prompt lookup's branches on a prompt
    that repeats, and a layer-skip view of the target drafting top-2 siblings."""
    prompt = smollm2.encode_prompt("Repeat exactly, three times: 'the quick brown fox jumps over the lazy dog'.")
    eos = smollm2.tokenizer.eos_token_id
    for speed in SPEED.values():
        with speed():
            plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=48, sampling=GREEDY,
                                               eos_token_id=eos).tokens
            drafters = [(TreeLookupDrafter(branches=3), 6), (TreeLookupDrafter(branches=2), 10),
                        (ModelTreeDrafter(layer_skip_view(smollm2.model, DEFAULT_SKIP_LAYERS), width=2), 6)]
            for drafter, k in drafters:
                result = se.SpeculativeDecoder(smollm2.model, drafter).generate(
                    prompt, k=k, max_new_tokens=48, sampling=GREEDY, eos_token_id=eos)
                assert result.tokens == plain, (drafter.name, smollm2.tokenizer.decode(result.tokens))
                assert result.stats.tokens_per_round > 1.0, drafter.name


def test_tree_rounds_survive_a_trace_round_trip():
    """Events are the interface: a tree round's extra fields (node indices, -1 for the root) pass the trace
    validator and come back equal; a parent outside [-1, MAX_K) names the field."""
    import json

    from spec_engine.classroom import trace
    target = tiny_llama(vocab=10, layers=2, seed=0)
    result = se.SpeculativeDecoder(target, TreeLookupDrafter()).generate(
        torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]]), k=4, max_new_tokens=12, sampling=se.SamplingParams(1.0), seed=2)
    tree_rounds = [e for e in result.rounds if e.tree_parents]
    assert tree_rounds and any(e.tree_tried for e in tree_rounds)
    for i, event in enumerate(result.rounds):
        assert trace._round(i, json.loads(json.dumps(event.to_dict()))) == event
    bad = dict(tree_rounds[0].to_dict(), tree_parents=[-2] * len(tree_rounds[0].drafted))
    with pytest.raises(trace.TraceError, match=r"tree_parents\[0\] must lie in \[-1, "):
        trace._round(tree_rounds[0].index, bad)


@pytest.mark.parametrize("make", [lambda target, draft: TreeLookupDrafter(branches=3, max_ngram=3),
                                  lambda target, draft: ModelTreeDrafter(draft, width=2, drawn="deterministic")],
                         ids=["tree-lookup", "model-tree-top2"])
def test_strict_is_the_exact_rule_draw_for_draw_on_chosen_trees(target, draft, make):
    """Siblings chosen, not drawn (lookup's branches, a draft's top 2): the exact rule accepts each with r(x) and a
    refusal zeroes it out of r, which is what strict does on any tree, so the two emit the same tokens for the same
    seed and the exact rule's chi-square tests (test_tree_statistical.py) hold for strict on these drafters too."""
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])        # repeats: lookup finds branches
    for seed in range(12):
        for params in (se.SamplingParams(1.0), se.SamplingParams(0.7, top_p=0.8)):
            runs = {rule: se.SpeculativeDecoder(target, make(target, draft), rule=rule).generate(
                prompt, k=4, max_new_tokens=12, sampling=params, seed=seed) for rule in ("exact", "strict")}
            assert runs["exact"].tokens == runs["strict"].tokens, (seed, params)
            assert [r.accepted for r in runs["exact"].rounds] == [r.accepted for r in runs["strict"].rounds]


@pytest.mark.parametrize("params", [GREEDY, se.SamplingParams(0.8, top_p=0.9)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("speed", list(SPEED))
def test_a_tree_run_nobody_draws_makes_the_same_decisions_without_the_display_parts(target, draft, params, speed,
                                                                                     monkeypatch):
    """display=False on trees (the app's timed run and the benchmarks): same tokens, paths and draws, no display
    parts; and the benchmarks' spine measure, read from the run's tokens, equals the one read from the target's top
    entries of the drawn run."""
    from spec_engine.bench import spine_accepted
    from test_engine import check_display_off_is_the_same_run
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
    with SPEED[speed]():
        for make in (lambda: TreeLookupDrafter(branches=3, max_ngram=3), lambda: ModelTreeDrafter(draft, width=2)):
            drawn = check_display_off_is_the_same_run(lambda: se.SpeculativeDecoder(target, make()), prompt, 4,
                                                      params, monkeypatch)
            assert any(r.tree_parents for r in drawn.rounds)
            if params.greedy:
                offset = 0
                for r in drawn.rounds:
                    if r.tree_parents:
                        from_top = [row[0][0] for row in r.target_top]        # the target's argmax after each row
                        argmax_spine = spine_accepted(r, [from_top[0]] + [from_top[i + 1] for i in spine(r)])
                        assert spine_accepted(r, drawn.tokens[offset:]) == argmax_spine
                    offset += len(r.emitted)


def spine(event) -> list[int]:
    """The nodes of a tree round's top-1 spine, root's child first."""
    nodes, node = [], -1
    while (child := next((i for i, p in enumerate(event.tree_parents) if p == node), None)) is not None:
        nodes.append(child)
        node = child
    return nodes


def test_every_tree_round_reports_its_verify_forward_to_the_cost_curve():
    """The draft sizing corrects its verify-cost curve from the engine's timed forwards (drafters/sizing.py). A tree
    round's forward over its nodes and root is one of them: each round reports its row count once, and a
    plain step one row."""
    from spec_engine.core import timing
    target = tiny_llama(vocab=10, layers=2, seed=4)
    reports = []
    timing.watch_forwards(target, lambda rows, seconds: reports.append((rows, seconds)))
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]])
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=12, sampling=GREEDY)
    assert [rows for rows, _ in reports] == [1] * len(plain.step_seconds) and all(s > 0 for _, s in reports)
    reports.clear()
    result = se.SpeculativeDecoder(target, OracleTreeDrafter(plain.tokens, 10, 5)).generate(
        prompt, k=6, max_new_tokens=12, sampling=GREEDY)
    assert result.tokens == plain.tokens
    assert [rows for rows, _ in reports] == [len(r.drafted) + 1 for r in result.rounds]
    assert any(len(r.drafted) > 1 for r in result.rounds)
    assert [seconds for _, seconds in reports] == pytest.approx([r.verify_seconds for r in result.rounds])
