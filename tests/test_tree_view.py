"""Showing draft trees (issue #26): the tree view (ui/views/tree.py), the token view, the KV view and the step-through
of tree rounds, tree acceptance, the registered tree drafts, and the exactness lab's wrong tree rule."""
import dataclasses

import pytest
import torch

import spec_engine as se
from spec_engine.classroom import lab
from spec_engine.classroom import trace as tr
from ui.classroom import replay, stepper
from ui.classroom.lab import toy_setup
from ui.playground import handlers, runner, validate
from ui.playground.state import SessionState
from ui.views import plots, render, tree
from ui.views.render import RenderOptions
from ui.views.tokens import dict_labeler

HOSTILE = '<img src=x onerror="alert(1)">'
LABEL = dict_labeler({1: "A", 2: "<b>B</b>", 3: "C", 4: HOSTILE, 5: "E", 9: "&fix", 7: "x"})


def tree_event(**change) -> se.RoundEvent:
    """A sampled tree round: root -> A (node 0, kept), <b>B</b> (node 1, never tried); A -> C (2), <img> (3), both
    refused; <b>B</b> -> E (4). The correction &fix came from the residual after C and <img>."""
    base = dict(index=0, drafted=[1, 2, 3, 4, 5], accepted=1, emitted=[1, 9], correction=9, bonus=None,
                target_probs=[0.5, 0.2, 0.1, 0.05, 0.3], draft_probs=[1.0] * 5, accept_probs=[0.5, 0.2, 0.1],
                uniforms=[0.25, 0.7, 0.9], next_top=[(9, 0.6), (7, 0.3)], target_top=[[(1, 0.5)]] * 6, k=5,
                target_cache_len_before=24, target_cache_len=19, draft_cache_len_before=None, draft_cache_len=None,
                committed_len=20, draft_seconds=0.0, verify_seconds=0.0, round_seconds=0.0,
                tree_parents=[-1, -1, 0, 0, 1], tree_path=[0], tree_tried=[0, 2, 3])
    return se.RoundEvent(**{**base, **change})


def test_nodes_are_coloured_by_what_the_rule_did_and_hover_carries_the_numbers():
    ev = tree_event()
    assert tree.node_kinds(ev) == ["accepted", "unreached", "rejected", "rejected", "unreached"]
    fig = tree.tree_figure([ev], LABEL)
    by_name = {t.name.partition(":")[0]: t for t in fig.data}
    assert len(by_name["accepted"].x) == 1 and len(by_name["rejected"].x) == 2 and len(by_name["never reached"].x) == 2
    correction = by_name["correction"]
    assert correction.x == (2,)                                     # one level below the kept node
    hover = " ".join(by_name["rejected"].hovertext)
    assert "min(1, r/q) = 0.100" in hover and "u = 0.900 ≥ 0.100 → REJECTED" in hover
    assert "residual top" in correction.hovertext[0] and '"&amp;fix" 0.600' in correction.hovertext[0]
    assert "p(x) target = 0.500" in by_name["accepted"].hovertext[0]


def test_model_text_is_escaped_in_the_figure_and_the_token_view():
    ev = tree_event()
    fig = tree.tree_figure([ev], LABEL)
    for trace in fig.data:
        for text in list(trace.text or []) + list(trace.hovertext or []):
            assert "<img" not in text and "<b>" not in text.replace("<br>", ""), text
            assert "&quot;" not in text, text                        # Plotly would show the entity itself
    assert any("&lt;img" in text for trace in fig.data for text in (trace.hovertext or []))
    html = render.round_html(ev, LABEL, RenderOptions())
    assert "<img" not in html and "<b>B" not in html and "&lt;img" in html
    # the text reads along the kept path: A, then the refused siblings struck through, then the correction
    kinds = [part.split('"')[0] for part in html.split('data-kind="')[1:]]
    assert kinds == ["accepted", "rejected", "rejected", "correction"] and 'class="round tree"' in html


def drawn_edges(fig, name: str) -> set:
    """The segments of the figure's edge trace `name` ("kept path" or "edge"), each ((x, y), (x, y)), parent first."""
    trace = next(t for t in fig.data if t.name == name)
    xs, ys = list(trace.x), list(trace.y)
    return {((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)}


@pytest.mark.parametrize("change, bold, thin", [
    ({}, [(-1, 0), (0, "next")], [(-1, 1), (0, 2), (0, 3), (1, 4)]),                 # correction below node 0
    ({"accepted": 2, "emitted": [1, 3, 7], "correction": None, "bonus": 7, "tree_path": [0, 3],
      "tree_tried": [0, 2, 3]}, [(-1, 0), (0, 3), (3, "next")], [(-1, 1), (0, 2), (1, 4)]),   # bonus below leaf 3
    ({"accepted": 0, "emitted": [9], "tree_path": [], "tree_tried": [0, 1]},
     [(-1, "next")], [(-1, 0), (-1, 1), (0, 2), (0, 3), (1, 4)]),                         # both root children refused
])
def test_only_the_kept_path_and_the_token_after_it_are_drawn_bold(change, bold, thin):
    """The bold edges are exactly the kept path's, root first, plus the edge to the emitted token; every other edge,
    the refused children of a kept node included, is thin."""
    ev = tree_event(**change)
    ys, xs, _ = tree.layout_round(ev)                   # the first (only) tree sits at offset 0
    n = len(ev.drafted)

    def at(node):
        return (0, ys[-1]) if node == -1 else (xs[n], ys[n]) if node == "next" else (xs[node], ys[node])
    fig = tree.tree_figure([ev], LABEL)
    assert drawn_edges(fig, "kept path") == {(at(a), at(b)) for a, b in bold}
    assert drawn_edges(fig, "edge") == {(at(a), at(b)) for a, b in thin}


def test_chain_rounds_keep_their_view_and_draw_no_tree():
    chain = tree_event(tree_parents=None, tree_path=None, tree_tried=None, drafted=[1, 3], accepted=1,
                       target_probs=[0.5, 0.1], draft_probs=[1.0, 1.0], accept_probs=[0.5, 0.1], uniforms=[0.2, 0.9])
    assert not chain.is_tree and chain.draft_length == 2
    assert 'class="round"' in render.round_html(chain, LABEL)
    empty = tree.tree_figure([chain], LABEL)
    assert not empty.data and "Tree drafts" in empty.layout.annotations[0].text
    assert plots.kv_rows([chain])[0][-1] == "–"


def test_tree_acceptance_counts_the_depth_and_the_kv_view_the_moves():
    first = tree_event()
    second = tree_event(index=1, accepted=2, emitted=[2, 5, 7], correction=None, bonus=7, tree_path=[1, 4],
                        tree_tried=[0, 1, 4], committed_len=23)
    assert first.draft_length == second.draft_length == 2
    assert se.acceptance_rate([first, second]) == 3 / 4           # 3 kept of 2 + 2 levels, not 3 of 10 nodes
    assert plots.kv_moves(first) == [(18, 18)]
    assert plots.kv_moves(second) == [(21, 20), (24, 21)]         # nodes 1 and 4 moved after the committed text
    assert plots.kv_rows([second])[0][-1] == "kept 2 of 5 nodes; moved 21→20, 24→21; dropped 3"
    assert "moving 21 → 20, 24 → 21" in stepper.kv_html(second, first)
    table = stepper.decision_table_html(second, LABEL, RenderOptions())
    assert table.count('class="accepted"') == 2 and 'class="bonus"' in table and "<img" not in table
    fig = tree.tree_figure([first, second], LABEL)
    assert "newest 2 tree rounds" in fig.layout.title.text
    assert "round 2" in [a.text for a in fig.layout.annotations]


def test_a_trace_with_a_broken_tree_is_refused():
    good = tree_event().to_dict()
    assert tr._round(0, good) == tree_event()
    for bad in (dict(good, tree_path=[2]), dict(good, tree_parents=[-1, 3, 0, 0, 1]),
                dict(good, tree_tried=[0, 0]), dict(good, tree_parents=None)):
        with pytest.raises(tr.TraceError):
            tr._round(0, bad)


class Loaded:
    def __init__(self, model):
        self.model, self.tokenizer = model, None


def test_registered_tree_drafts_run_greedy_exactly(target):
    assert se.parse_draft("lookup-tree:2").arg == 2 and se.draft_modes()["lookup-tree"].tree
    with pytest.raises(ValueError, match="branches"):
        se.parse_draft("lookup-tree:0")
    with pytest.raises(ValueError, match="takes no argument"):
        se.parse_draft("layer-skip-tree:3")
    prompt = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]])
    greedy = se.SamplingParams(temperature=0)
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=12, sampling=greedy).tokens
    for name in ("lookup-tree", "layer-skip-tree"):
        drafter = se.make_drafter(name, Loaded(target))
        result = se.SpeculativeDecoder(target, drafter).generate(prompt, k=4, max_new_tokens=12, sampling=greedy)
        assert result.tokens == plain and all(r.is_tree for r in result.rounds if r.drafted), name
        assert tree.tree_figure(result.rounds, dict_labeler({})).data


def test_tree_drafts_refuse_the_chains_wrong_rules():
    for rule in ("exact", "strict", "invariant", "typical"):     # the rules that judge trees
        validate.check_rule_for("lookup-tree", rule)
        validate.check_rule_for("eagle+lookup-tree", rule)
    validate.check_rule_for("prompt-lookup", "no_residual")
    for rule in ("no_residual", "topp_membership", "q_mismatch"):
        with pytest.raises(validate.InputError, match="takes exact, strict, invariant, typical"):
            validate.check_rule_for("layer-skip-tree", rule)


@pytest.mark.slow
def test_the_lab_shows_the_wrong_tree_rule_drift():
    """The toy pair drafting trees (top 2 per node): the exact tree rule passes the chi-square test, the best-sibling
    rule fails it at N = 300 (measured TV on the next token: 0.02 exact, 0.18 wrong; p-values 0.6 and 2e-10)."""
    setup = toy_setup("the cat", tree=True)
    params = se.SamplingParams(temperature=1.0, top_p=0.8)
    exact = lab.exact_distribution(setup.target_model, setup.input_ids[0].tolist(), 2, params)
    reports = {}
    for sampler in ("exact", "tree_best_sibling"):
        for draws in lab.draw(setup.target_model, setup.make_drafter, setup.input_ids, 2, 2, params, 300, sampler):
            pass
        reports[sampler] = lab.report(exact, draws)
    assert reports["exact"].chi.pvalue > 1e-3 and reports["tree_best_sibling"].chi.pvalue < 1e-6, reports
    assert reports["tree_best_sibling"].tv_next > 3 * reports["exact"].tv_next
    assert lab.TREE_SAMPLERS == ("plain", "exact", "strict", "invariant", "typical", "tree_best_sibling")


def test_step_through_of_a_tree_round_names_the_path_and_the_residual():
    ev = tree_event()
    facts = " ".join(stepper.round_facts(ev, LABEL, RenderOptions()))
    assert "a draft tree of 5 node(s), 2 deep" in facts and "&lt;img" in facts and "<img" not in facts
    assert "correction &quot;&amp;fix&quot; drawn from the residual" in facts
    fig = stepper.residual_figure(ev, LABEL, RenderOptions())
    assert "after every sibling was refused" in fig.layout.title.text
    greedy = dataclasses.replace(ev, accept_probs=[], uniforms=[], tree_tried=[])
    assert tree.node_kinds(greedy) == ["accepted", "rejected", "rejected", "rejected", "unreached"]


def test_a_tree_run_exports_and_replays_with_its_tree(target, draft):
    from test_trace import stream, tiny_prep, tiny_settings
    settings, state = tiny_settings(draft="tiny-tree"), SessionState()
    ids = torch.tensor([[1, 2, 3, 0]])
    decoder = se.SpeculativeDecoder(target, se.ModelTreeDrafter(draft, width=2, drawn="without_replacement"))
    prep = tiny_prep(settings, state, ids)
    for event in stream(decoder, ids, settings):
        runner.record_round(prep, state, event)
    state.finish(prep.record)
    live = dict(zip(handlers.RUN_OUTPUTS, handlers.run_view(prep, state, final=True)))
    replayed = replay.replay_view(tr.loads(tr.dumps(replay.export_latest(state))))
    assert replayed["tokens"] == live["tokens"] and 'class="round tree"' in live["tokens"]
    assert replayed["tree_plot"].to_plotly_json() == live["tree_plot"].to_plotly_json()
    assert any(t.name.startswith("rejected") for t in live["tree_plot"].data)


def test_a_greedy_tree_legend_takes_the_argmax_not_a_residual():
    """Greedy has no residual: its correction is the target's argmax. The walkthrough's greedy tree legend said
    "drawn from the residual"; only the exact rule's sampled correction is drawn from one."""
    greedy = tree_event(accept_probs=[], uniforms=[], tree_tried=None, next_top=[])
    names = [t.name for t in tree.tree_figure([greedy], LABEL, RenderOptions(greedy=True)).data]
    correction = next(name for name in names if name.startswith("correction"))
    assert "residual" not in " ".join(names) and "argmax" in correction
    sampled = [t.name for t in tree.tree_figure([tree_event()], LABEL, RenderOptions()).data]
    assert "correction: every sibling refused, drawn from the residual" in sampled
    wrong = [t.name for t in tree.tree_figure([tree_event()], LABEL, RenderOptions(rule="tree_best_sibling")).data]
    assert not any("residual" in name for name in wrong)


def empty_tree_round(index: int) -> se.RoundEvent:
    """A tree round that drafted nothing (suffix decoding without a match): the target's own token as the bonus."""
    return tree_event(index=index, drafted=[], accepted=0, emitted=[7], correction=None, bonus=7, target_probs=[],
                      draft_probs=[], accept_probs=[], uniforms=[], target_top=[[(7, 0.5)]], tree_parents=[],
                      tree_path=[], tree_tried=[])


def test_the_tree_view_draws_the_rounds_that_drafted_and_counts_the_others():
    """Suffix decoding drafted in 15 of 53 rounds of the walkthrough, and the Draft tree tab drew its newest six:
    six lone roots with a bonus. The rounds that drafted are drawn; the others are counted in the title."""
    rounds = [tree_event(index=0), tree_event(index=1)] + [empty_tree_round(i) for i in range(2, 9)]
    fig = tree.tree_figure(rounds, LABEL)
    assert [a.text for a in fig.layout.annotations] == ["round 1", "round 2"]
    assert "newest 2 tree rounds" in fig.layout.title.text
    assert "7 of 9 tree rounds drafted nothing, not drawn" in fig.layout.title.text
    assert all(len(line) <= 50 for line in fig.layout.title.text.split("<br>")[1:])     # the lines it added
    assert fig.layout.margin.t >= 16 * 3
    only_empty = tree.tree_figure(rounds[2:], LABEL)
    assert not only_empty.data and "7 of 7 tree rounds drafted nothing" in only_empty.layout.annotations[0].text
    none_yet = tree.tree_figure([], LABEL).layout.annotations[0].text
    assert "suffix" in none_yet and "eagle-tree" in none_yet                    # every tree draft is named
    assert "drafted nothing" not in tree.tree_figure(rounds[:2], LABEL).layout.title.text


def test_the_step_through_says_when_its_tree_round_drafted_nothing():
    from types import SimpleNamespace
    session = SimpleNamespace(stepper=stepper.Stepper(events=[tree_event(index=0), empty_tree_round(1)]),
                              labeler=LABEL, options=RenderOptions())
    session.stepper.position = 2
    fig = stepper.tree_figure(session)
    assert not fig.data and "drafted nothing" in fig.layout.annotations[0].text
    assert fig.layout.title.text == "Draft tree of round 2"
    session.stepper.position = 1
    assert stepper.tree_figure(session).layout.title.text.startswith("Draft tree of round 1 (hover")


def test_the_draft_tree_caption_names_every_tree_draft_and_quotes_no_stale_figure():
    """The caption listed four tree drafts of six (no suffix trees) and quoted "1.47x over 24 held-out prompts",
    measured once elsewhere. It names every tree draft in the engine's registry, says what a round without a match
    draws, and quotes no speed figure: the run's own numbers sit above it."""
    import re

    from ui import layout
    caption = layout.tree_caption()
    names = [name for name, mode in se.draft_modes().items() if mode.tree]
    assert "suffix" in names and all(name in caption for name in names), caption
    assert "drafts nothing" in caption
    assert not re.search(r"\d(\.\d+)?\s*[x×]|[x×]\s*\d|\d+ held-out", caption), caption
