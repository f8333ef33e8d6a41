"""EagleTreeDrafter (EAGLE-2 dynamic trees from the EAGLE head): greedy tree decoding is plain greedy decoding on tiny
models (random and briefly trained heads, widths 1-3, fixed and cost-sized trees) and on SmolLM2-135M with the
shipped head (slow); the head's cache holds only committed pairs after every round and equals a fresh pass over the
target's true features (so the engine hands over the accepted path's features from its tree forward, not some other
node's); the tree is a deterministic function of the text under sampling too (q one-hot per sibling, which the tree
rule is exact for; tests/test_tree_statistical.py runs the chi-square test on it); the kept nodes are the likeliest,
closed under parents and sized by the verify-cost curve.
"""
import pytest
import torch

import spec_engine as se
from spec_engine.core.cache import cache_len
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.eagle_tree import EagleTreeDrafter
from test_eagle import REDUCED, layer_features, train_tiny_head
from tiny import tiny_llama

PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
GREEDY = se.SamplingParams(0.0)
SAMPLED = se.SamplingParams(0.9, top_k=6, top_p=0.95)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=8, layers=3, seed=0)


@pytest.fixture(scope="module")
def trained(target):
    return train_tiny_head(target, steps=60)[0]


def tree_drafters(target, trained):
    random_head = random_eagle_drafter(target, seed=1, scale=3.0)
    return {f"random-w{w}": lambda w=w: EagleTreeDrafter(random_head.head, target, random_head.vocab_index, width=w,
                                                         size_by_cost=False) for w in (1, 3)} | \
        {f"trained-w{w}": lambda w=w: EagleTreeDrafter(trained, target, REDUCED, width=w, size_by_cost=False)
         for w in (1, 2, 3)} | \
        {"trained-nodes3": lambda: EagleTreeDrafter(trained, target, REDUCED, nodes=3),
         "trained-depth2": lambda: EagleTreeDrafter(trained, target, REDUCED, depth=2, size_by_cost=False),
         "lookup-first": lambda: se.LookupFirstDrafter(EagleTreeDrafter(trained, target, REDUCED))}


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_greedy_identity_and_the_head_cache_every_round(target, trained, params):
    plain = se.autoregressive_generate(target, PROMPT, max_new_tokens=30, sampling=params, seed=5).tokens
    for name, make in tree_drafters(target, trained).items():
        for k in (1, 6):
            drafter = make()
            decoder = se.SpeculativeDecoder(target, drafter)
            state = decoder.start(PROMPT, k=k, max_new_tokens=30, sampling=params, seed=5)
            accepted, tree_rounds, committed = 0, 0, PROMPT.shape[1]
            while state.stop_reason is None:
                event = decoder.step(state)
                accepted += event.accepted
                committed += len(event.emitted)            # counted from the rounds, not from the engine's count
                tree_rounds += event.tree_parents is not None and len(event.drafted) > 0
                waiting = sum(len(f) for f in getattr(drafter, "waiting", []))    # lookup rounds: the catch-up waits
                assert waiting == 0 or event.note == se.drafters.LOOKUP_NOTE, name
                assert drafter.cache_ids == state.committed[:committed - 1 - waiting], name
                assert cache_len(drafter.cache) == event.draft_cache_len == committed - 1 - waiting, name
                assert event.committed_len == committed and event.target_cache_len == committed - 1, name
                assert len(event.drafted) <= k, name
                if event.tree_parents is not None and event.drafted:
                    assert all(-1 <= p < i for i, p in enumerate(event.tree_parents)), name      # topological
                    assert event.emitted[:event.accepted] == [event.drafted[i] for i in event.tree_path], name
            if params.greedy:
                assert state.committed[PROMPT.shape[1]:] == plain, (name, k)
            assert tree_rounds > 0, (name, k)
            if name.startswith("trained") and params.greedy:
                assert accepted > 0, (name, k)        # the accepted-path features are exercised, not only rejections


def test_a_width_one_tree_drafts_what_the_chain_drafter_drafts(target, trained):
    """A tree of width 1 is a chain: grown level by level by `_expand`, it must propose, round after round, exactly the
    tokens the chain drafter (`EagleDrafter.propose`, one head step per draft) proposes greedily from the same text.
    The two compute the head's positions separately, so an expansion at a position off by one drafts other tokens
    (the lean-forward parity test cannot see that: it feeds the same positions to both sides). Greedy: the chain
    samples its drafts under sampling, while the tree takes the head's top tokens."""
    random_head = random_eagle_drafter(target, seed=1, scale=3.0)
    for head, vocab in ((trained, REDUCED), (random_head.head, random_head.vocab_index)):
        drafts = {}
        for kind in ("tree", "chain"):
            drafter = (EagleTreeDrafter(head, target, vocab, width=1, depth=6, size_by_cost=False) if kind == "tree"
                       else se.EagleDrafter(head, target, vocab, size_by_cost=False))
            result = se.SpeculativeDecoder(target, drafter).generate(PROMPT, k=6, max_new_tokens=24, sampling=GREEDY)
            drafts[kind] = [r.drafted for r in result.rounds]
        assert drafts["tree"] == drafts["chain"]
        assert max(len(d) for d in drafts["tree"]) >= 3          # rounds reached the deeper levels' positions


def test_the_head_cache_equals_a_fresh_pass_over_true_features_after_tree_rounds(target, trained):
    """After tree rounds whose accepted paths leave the head's top-1 spine, the head's last prediction equals one
    from a fresh pass over the target's features of the committed text: the engine handed over the features of
    the accepted path's nodes, and no predicted feature survives in the cache."""
    drafter = EagleTreeDrafter(trained, target, REDUCED, width=3, size_by_cost=False)
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=8, max_new_tokens=24, sampling=se.SamplingParams(1.0), seed=0)
    off_spine = 0
    while state.stop_reason is None:
        event = decoder.step(state)
        parents = event.tree_parents or []
        off_spine += any(parents.index(parents[node]) != node for node in event.tree_path or [])   # not a first child
    assert off_spine > 0                                  # some accepted path took a second sibling
    committed = state.committed
    with torch.no_grad():
        features = layer_features(target, torch.tensor([committed]))[0, :-1]                      # [T - 1, H]
        embeds = target.get_input_embeddings().weight[torch.tensor(committed[1:])]
        fresh = trained(features[None], embeds[None])[0, -1]
    assert torch.allclose(drafter._predicted, fresh, atol=1e-4)


def test_under_sampling_the_tree_is_the_heads_top_tokens_whatever_the_generator(target, trained):
    drafter = EagleTreeDrafter(trained, target, REDUCED, size_by_cost=False)
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=6, max_new_tokens=8, sampling=SAMPLED, seed=0)
    trees = []
    for seed in (0, 1, 2):
        proposal = drafter.propose(state.committed, 6, SAMPLED, torch.Generator().manual_seed(seed))
        assert proposal.probs is None and set(proposal.tree.drawn) == {"deterministic"}
        trees.append((proposal.tree.tokens, proposal.tree.parents))
    assert trees[0] == trees[1] == trees[2] and len(trees[0][0]) == 6
    assert all(t in REDUCED.tolist() for t in trees[0][0])


def test_the_kept_nodes_are_the_likeliest_closed_under_parents_and_sized_by_cost(target, trained):
    drafter = EagleTreeDrafter(trained, target, REDUCED, size_by_cost=False)
    scores = [0.6, 0.3, 0.5, 0.1, 0.3, 0.05]       # a parent never scores below its child: products of probabilities
    assert drafter._keep(scores, 3) == [0, 1, 2]    # ties (0.3, 0.3) go to the earlier node, a parent before its child
    assert drafter._keep(scores, 16) == list(range(6))
    drafter.costs = (0.0, 1.0, 1.0, 1.0, 3.0) + (10.0,) * 13     # rows 1-3 cost one step, 4 rows three
    assert drafter._keep(scores, 8) == [0, 2]        # (1 + 0.6 + 0.5) / 1 beats every larger tree
    drafter.nodes = 1
    drafter.costs = None
    assert drafter._keep(scores, 8) == [0]


def test_a_path_stop_leaves_unsure_branches_unexpanded(target, trained):
    drafter = EagleTreeDrafter(trained, target, REDUCED, size_by_cost=False, min_path_confidence=0.999)
    state = se.SpeculativeDecoder(target, drafter).start(PROMPT, k=8, max_new_tokens=8, sampling=GREEDY)
    tree = drafter.propose(state.committed, 8, GREEDY, torch.Generator()).tree
    assert tree.tokens and set(tree.parents) == {-1}          # the root's top tokens only: no head forward ran


def test_a_round_whose_best_node_cannot_pay_for_a_verify_row_stops_after_one_level(target, trained):
    drafter = EagleTreeDrafter(trained, target, REDUCED)
    state = se.SpeculativeDecoder(target, drafter).start(PROMPT, k=8, max_new_tokens=8, sampling=GREEDY)
    drafter.costs = (0.0, 1.0) + (3.0,) * 16              # a second row triples the cost: only sure nodes pay
    assert drafter._worth_growing(1.0, 8) and not drafter._worth_growing(0.1, 8)
    drafter.costs = (0.0, 1.0) + (20.0,) * 16             # no tree of 16 sure nodes pays for itself
    assert drafter.propose(state.committed, 8, GREEDY, torch.Generator()).tree.tokens == []
    assert cache_len(drafter.cache) == len(state.committed) - 1
    drafter.costs = (0.0,) + (1.0,) * 17                   # rows are free: grow
    assert drafter._worth_growing(0.01, 8) and len(drafter.propose(state.committed, 8, GREEDY, None).tree.tokens) == 8


def test_growth_that_could_never_be_kept_is_skipped_and_the_tree_is_unchanged(target, trained):
    """Over sampled rounds of several heads, widths, k and node counts, the same tree with and without skipping the
    levels `_keep` could not keep from, in fewer head forwards."""
    random_head = random_eagle_drafter(target, seed=1, scale=3.0)
    expansions = {True: 0, False: 0}
    for head, vocab in ((trained, REDUCED), (random_head.head, random_head.vocab_index)):
        for width, k, nodes in ((1, 8, None), (3, 4, None), (3, 8, 3), (4, 16, None), (2, 6, 6)):
            trees = {}
            for prune in (True, False):
                drafter = EagleTreeDrafter(head, target, vocab, width=width, depth=6, nodes=nodes, size_by_cost=False)
                drafter.prune_unkeepable = prune
                expand = drafter._expand

                def counted(*args, prune=prune, expand=expand):
                    expansions[prune] += 1
                    return expand(*args)
                drafter._expand = counted
                result = se.SpeculativeDecoder(target, drafter).generate(PROMPT, k=k, max_new_tokens=12,
                                                                         sampling=SAMPLED, seed=5)
                trees[prune] = [(r.drafted, r.tree_parents) for r in result.rounds]
            assert trees[True] == trees[False], (width, k, nodes)
    assert expansions[True] < expansions[False], expansions


def test_eagle_tree_draft_names(target, trained):
    assert se.parse_draft("eagle-tree") == se.DraftSpec("eagle-tree")
    assert se.parse_draft("eagle-tree:8").arg == 8
    assert se.parse_draft("eagle+lookup-tree:4") == se.DraftSpec("eagle+lookup-tree", None, 4)
    for bad in ("eagle-tree:0", "eagle-tree:17", "eagle-tree:x", "eagle+lookup-tree:2.5"):
        with pytest.raises(ValueError, match="node count N in 1..16"):
            se.parse_draft(bad)
    with pytest.raises(ValueError, match="width must be an integer >= 1"):
        EagleTreeDrafter(trained, target, REDUCED, width=0)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["eagle-tree", "eagle+lookup-tree"])
def test_greedy_identity_on_the_offline_default(smollm2, draft):
    """The shipped head on SmolLM2-135M (speed layer as installed): token-identical to plain greedy decoding, every
    round's caches at the committed text (the head's a prefix of it after rounds prompt lookup copied: its catch-up
    waits for its next draft), and the head's drafts accepted."""
    texts = ["Give me three practical tips for staying focused while studying.",
             "Repeat exactly, twice: 'the quick brown fox jumps over the lazy dog'."]
    eos = smollm2.tokenizer.eos_token_id
    accepted = drafted = 0
    for text in texts:
        prompt = smollm2.encode_prompt(text)
        plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=40, sampling=GREEDY,
                                           eos_token_id=eos).tokens
        drafter = se.make_drafter(draft, smollm2)
        result = se.SpeculativeDecoder(smollm2.model, drafter).generate(prompt, k=8, max_new_tokens=40,
                                                                        sampling=GREEDY, eos_token_id=eos)
        assert result.tokens == plain, (draft, smollm2.tokenizer.decode(result.tokens))
        committed = prompt.shape[1]                   # counted from the rounds, not from the engine's count
        for event in result.rounds:
            committed += len(event.emitted)
            assert event.target_cache_len == committed - 1 == event.committed_len - 1
            lag = committed - 1 - event.draft_cache_len          # after a copied round the head's catch-up waits
            assert lag == 0 or (lag > 0 and event.note == se.drafters.LOOKUP_NOTE)
        assert any(e.tree_parents for e in result.rounds)
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert drafted > 0 and accepted / drafted > 0.15


def test_the_benchmarks_spine_measure_follows_first_children_while_the_target_agrees():
    from types import SimpleNamespace

    from spec_engine.bench import spine_accepted, tree_gain
    # root -> a(5), b(6); a -> c(7); b -> d(8). The target's (greedy) tokens from the round on: 6, 8, then 0.
    event = SimpleNamespace(drafted=[5, 6, 7, 8], tree_parents=[-1, -1, 0, 1], tree_path=[1, 3], emitted=[6, 8, 0])
    assert spine_accepted(event, [6, 8, 0]) == 0               # the spine's first node (5) is refused
    hit = SimpleNamespace(drafted=[6, 5, 8], tree_parents=[-1, -1, 0], tree_path=[0, 2], emitted=[6, 8, 0])
    assert spine_accepted(hit, [6, 8, 0]) == 2
    assert spine_accepted(hit, [6]) == 1                       # the run ended after one token: no further argmax
    chain = SimpleNamespace(tree_parents=None, emitted=[4])
    gain = tree_gain([event, chain, hit], [6, 8, 0, 4, 6, 8, 0])    # each round's spine read from its own offset
    assert gain == {"tree_longer_share": 0.5, "tree_path_per_round": 2.0, "spine_per_round": 1.0, "tree_nodes": 3.5}


def test_a_grossly_wrong_curve_pauses_the_tree_which_says_so_and_probes(target, trained):
    """Issue #36 for the default draft, now a tree: under a curve where every row beyond one costs 17.78 forwards no
    tree pays, so each round keeps nothing and says "drafting paused: ..." with the numbers; after PROBE_EVERY such
    rounds one round probes with the head's top-1 spine, so a wrong curve gets timed again. Greedy output stays plain
    decoding's throughout."""
    from spec_engine.drafters.sizing import PAUSED, PROBE, PROBE_EVERY, CostView
    drafter = EagleTreeDrafter(trained, target, REDUCED)
    wrong = (0.0, 1.0) + (17.78,) * 16
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=8, max_new_tokens=40, sampling=GREEDY)
    drafter.costs = CostView(wrong, "measured at start-up", PROBE_EVERY)
    rounds = []
    while state.stop_reason is None and len(rounds) <= PROBE_EVERY:
        rounds.append(decoder.step(state))
    notes = [r.note or "" for r in rounds]
    assert all(n.startswith(PAUSED) and "17.78" in n for n in notes[:PROBE_EVERY]), notes
    assert notes[PROBE_EVERY].startswith(PROBE) and rounds[PROBE_EVERY].drafted, notes[PROBE_EVERY]
    parents = rounds[PROBE_EVERY].tree_parents
    assert parents == list(range(-1, len(parents) - 1))            # the probe is the spine: a chain of nodes
    emitted = [t for r in rounds for t in r.emitted]
    assert emitted == se.autoregressive_generate(target, PROMPT, max_new_tokens=len(emitted), sampling=GREEDY).tokens
