"""Renderers: synthetic RoundEvents in, HTML out. No model, no Gradio."""
import html
import re

import pytest

import spec_engine as se
from ui.views import render
from ui.views.render import RenderOptions
from ui.views.tokens import Piece, dict_labeler

PIECES = {1: " The", 2: " cat", 3: " sat", 4: " on", 5: "\n", 6: " mat", 7: "<script>alert(1)</script>",
          8: " a\tb", 9: "<|im_end|>", 10: "", 11: ' "quoted" & more'}
LABEL = dict_labeler(PIECES, special={9})


def event(drafted, accepted, emitted, correction=None, bonus=None, index=0, uniforms=None, accept_probs=None,
          next_top=None, note=None, k=4):
    n = len(drafted)
    decided = min(accepted + 1, n)
    return se.RoundEvent(
        index=index, drafted=list(drafted), accepted=accepted, emitted=list(emitted), correction=correction,
        bonus=bonus, target_probs=[0.5] * n, draft_probs=[0.25] * n,
        accept_probs=accept_probs if accept_probs is not None else [1.0] * accepted + [0.3] * (decided - accepted),
        uniforms=uniforms if uniforms is not None else [0.1] * accepted + [0.9] * (decided - accepted),
        next_top=next_top if next_top is not None else [(6, 0.6), (7, 0.2)],
        target_top=[[(1, 0.5), (2, 0.3), (7, 0.1)]] * (n + 1), k=k,
        target_cache_len_before=10 + n, target_cache_len=10 + len(emitted) - 1, draft_cache_len_before=None,
        draft_cache_len=None, committed_len=11 + len(emitted), draft_seconds=0.01, verify_seconds=0.02,
        round_seconds=0.03, note=note)


def test_rejection_round_marks_each_kind_in_order():
    ev = event(drafted=[1, 2, 3, 4], accepted=1, emitted=[1, 6], correction=6)
    frag = render.round_html(ev, LABEL)
    kinds = re.findall(r'data-kind="(\w+)"', frag)
    assert kinds == ["accepted", "rejected", "discarded", "discarded", "correction"]
    assert 'data-round="0"' in frag and 'data-n="1"' in frag
    assert "bonus" not in kinds


def test_bonus_round_has_no_rejection():
    ev = event(drafted=[1, 2], accepted=2, emitted=[1, 2, 3], bonus=3)
    kinds = re.findall(r'data-kind="(\w+)"', render.round_html(ev, LABEL))
    assert kinds == ["accepted", "accepted", "bonus"]


def test_eos_inside_accepted_drafts_discards_the_rest_without_a_rejection():
    ev = event(drafted=[1, 9, 2], accepted=2, emitted=[1, 9])
    frag = render.round_html(ev, LABEL)
    assert re.findall(r'data-kind="(\w+)"', frag) == ["accepted", "accepted", "discarded"]
    assert "end of sequence" in frag


def test_empty_draft_round_is_a_plain_target_token():
    ev = event(drafted=[], accepted=0, emitted=[5], bonus=5)
    frag = render.round_html(ev, LABEL)
    assert re.findall(r'data-kind="(\w+)"', frag) == ["bonus"]
    assert "no draft this round" in frag


def test_rejected_is_struck_through_and_discarded_faded_in_css():
    css = render.CSS.replace("\n", " ")
    assert re.search(r"\.rejected \{[^}]*line-through", css)
    assert re.search(r"\.discarded \{[^}]*opacity", css)
    for kind in ("accepted", "rejected", "discarded", "correction", "bonus"):
        assert re.search(rf"\.{kind} \{{[^}}]*background", css), kind
    legend = render.legend_html()
    for kind in render.KINDS:
        assert f'class="lg {kind}"' in legend


def test_model_text_is_escaped_in_body_and_tooltip():
    ev = event(drafted=[7, 2], accepted=0, emitted=[7], correction=7, next_top=[(7, 0.9)])
    frag = render.round_html(ev, LABEL)
    assert "<script>" not in frag
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in frag
    tips = re.findall(r'data-tip="([^"]*)"', frag)
    assert tips and all("<" not in tip and ">" not in tip for tip in tips)
    assert any("script" in html.unescape(tip) for tip in tips)


def test_quotes_and_ampersands_cannot_break_attributes():
    ev = event(drafted=[11], accepted=0, emitted=[11], correction=11)
    frag = render.round_html(ev, LABEL)
    for tip in re.findall(r'data-tip="([^"]*)"', frag):
        assert '"' not in tip
    assert "&quot;quoted&quot; &amp; more" in frag


def test_whitespace_is_visible():
    assert render.piece_html("\n") == '<span class="ws">↵</span><br>'
    assert "→" in render.piece_html("a\tb")
    assert render.piece_html(" a b") == " a b"
    assert render.piece_html(" a", show_spaces=True) == '<span class="ws">·</span>a'
    assert "∅" in render.piece_html("")


def test_special_tokens_are_marked():
    ev = event(drafted=[9], accepted=1, emitted=[9])
    frag = render.round_html(ev, LABEL)
    assert re.search(r'class="tok accepted special"', frag)
    assert "&lt;|im_end|&gt;" in frag


def test_partial_pieces_are_marked():
    label = lambda i: Piece("Ã©", partial=True)   # noqa: E731
    frag = render.round_html(event(drafted=[1], accepted=1, emitted=[1, 2], bonus=2), label)
    assert "partial" in frag


def test_sampled_tooltip_shows_p_q_ratio_draw_and_decision():
    ev = event(drafted=[1, 2, 3], accepted=1, emitted=[1, 6], correction=6, accept_probs=[1.0, 0.4],
               uniforms=[0.2, 0.75])
    frag = render.round_html(ev, LABEL, RenderOptions(greedy=False, rule="exact"))
    tips = [html.unescape(t) for t in re.findall(r'data-tip="([^"]*)"', frag)]
    accepted, rejected, discarded, correction = tips
    assert "p(x) target = 0.500" in accepted and "q(x) draft = 0.250" in accepted
    assert "min(1, p/q) = 1.000" in accepted and "u = 0.200 < 1.000 → ACCEPTED" in accepted
    assert "min(1, p/q) = 0.400" in rejected and "u = 0.750 ≥ 0.400 → REJECTED" in rejected
    assert "never judged" in discarded
    assert "residual" in correction and '" mat" 0.600' in correction
    assert 'data-u="0.75"' in frag and 'data-a="0.4"' in frag


def test_greedy_tooltip_names_the_argmax():
    ev = event(drafted=[2], accepted=0, emitted=[1], correction=1, uniforms=[], accept_probs=[0.0])
    frag = render.round_html(ev, LABEL, RenderOptions(greedy=True))
    rejected = html.unescape(re.findall(r'data-tip="([^"]*)"', frag)[0])
    assert "argmax is \" The\"" in rejected and "REJECTED" in rejected


def test_wrong_rule_correction_says_it_skips_the_residual():
    ev = event(drafted=[2], accepted=0, emitted=[1], correction=1)
    frag = render.round_html(ev, LABEL, RenderOptions(rule="no_residual"))
    assert "skips the residual" in html.unescape(frag)


def test_cross_tokenizer_note_is_shown_escaped():
    ev = event(drafted=[1], accepted=1, emitted=[1, 2], bonus=2, note="boundary <fix>")
    frag = render.round_html(ev, LABEL)
    assert "※" in frag and "boundary &lt;fix&gt;" in frag


def test_view_and_stats_html():
    frags = [render.round_html(event([1], 1, [1, 2], bonus=2, index=i), LABEL) for i in range(3)]
    view = render.view_html(frags, render.prompt_html("<b>hi</b>\n", 4, True), "status <x>")
    assert view.count('class="round" data-round=') == 3
    assert "&lt;b&gt;hi&lt;/b&gt;" in view and "status &lt;x&gt;" in view
    summary = {"rounds": 3, "new_tokens": 6, "acceptance_rate": 1.0, "tokens_per_forward": 2.0,
               "expected_tokens_per_forward": 2.0, "tokens_per_second": 12.0, "baseline_tokens_per_second": None,
               "speedup": None, "matches_baseline": None}
    assert "baseline pending" in render.stats_html(summary)
    measured = dict(summary, baseline_tokens_per_second=6.0, speedup=2.0, matches_baseline=True)
    out = render.stats_html(measured)
    assert "×2.00" in out and "baseline pending" not in out


def test_a_bf16_run_says_near_ties_may_differ_instead_of_a_red_mismatch():
    """In fp32 a greedy run that parts from plain decoding is a bug (red). In bf16 it is rounding: the chip is not
    red and a note says why; a run that matches still gets the note, since the next prompt may not."""
    summary = {"rounds": 3, "new_tokens": 6, "acceptance_rate": 1.0, "tokens_per_forward": 2.0,
               "expected_tokens_per_forward": 2.0, "tokens_per_second": 12.0, "baseline_tokens_per_second": 6.0,
               "speedup": 2.0, "matches_baseline": False, "first_difference": 4}

    def chip(out):
        return re.search(r'<div class="chip ([a-z]*)" data-stat="same text as plain"[^>]*><span class="k">[^<]*'
                         r'</span><span class="v">([^<]*)</span>', out).groups()
    for dtype in (None, "float32"):
        out = render.stats_html(dict(summary, dtype=dtype))
        assert chip(out) == ("bad", "no (token 4)") and "near" not in out
    out = html.unescape(render.stats_html(dict(summary, dtype="bfloat16")))
    assert chip(out) == ("pending", "no (token 4)")
    assert "runs in bfloat16" in out and "nearly tied" in out and "float32" in out
    out = html.unescape(render.stats_html(dict(summary, dtype="float16", matches_baseline=True)))
    assert chip(out) == ("good", "yes") and "runs in float16" in out
    assert "data-note" not in render.stats_html(dict(summary, dtype="bfloat16", matches_baseline=None))


def test_the_summary_carries_the_runs_dtype():
    from types import SimpleNamespace

    from ui.playground.state import RunRecord, RunSettings, summarize
    settings = RunSettings("t", "prompt-lookup", 3, 0.0, 1.0, 0, 8, 0, "exact", False, "hi")
    event = SimpleNamespace(drafted=[5], accepted=1, emitted=[5, 6], correction=None, round_seconds=0.1,
                            prefill_seconds=0.0, draft_seconds=0.0, verify_seconds=0.1)
    record = RunRecord(1, settings, "prompt-lookup", (1, 2), rounds=[event], dtype="bfloat16")
    baseline = SimpleNamespace(tokens=[5, 7], tokens_per_second=10.0, total_seconds=0.2, step_seconds=[0.1])
    summary = summarize(record, baseline)
    assert summary["dtype"] == "bfloat16" and summary["matches_baseline"] is False
    assert summarize(RunRecord(2, settings, "prompt-lookup", (1, 2)))["dtype"] is None


def test_tokenization_html_escapes_and_numbers_pieces():
    out = render.tokenization_html("<a>", [("tok A", [(5, Piece("<a")), (6, Piece(">"))])])
    assert "<a>" not in out.replace('<span class="lbl">', "") and "&lt;a" in out and "<sub>5</sub>" in out


def test_floating_tooltip_script_sets_text_not_html():
    assert "textContent = tok.dataset.tip" in render.TOOLTIP_JS and "innerHTML" not in render.TOOLTIP_JS


def test_stats_html_shows_the_measured_costs_and_the_predicted_speedup():
    from types import SimpleNamespace

    from ui.views import metrics
    rounds = [SimpleNamespace(drafted=[0] * 3, accepted=3, correction=None, emitted=[1] * 4, draft_seconds=0.006,
                              verify_seconds=0.012, round_seconds=0.02),
              SimpleNamespace(drafted=[0] * 3, accepted=0, correction=5, emitted=[1], draft_seconds=0.006,
                              verify_seconds=0.012, round_seconds=0.02)]
    baseline = SimpleNamespace(step_seconds=[0.01, 0.01])
    fields = metrics.cost_fields(rounds, baseline)
    a = 0.75                                                     # 3 accepted of 4 judged
    assert fields["draft_cost"] == pytest.approx(0.6) and fields["verify_cost"] == pytest.approx(1.2)
    assert fields["overhead_cost"] == pytest.approx(0.2)
    assert fields["predicted_tokens_per_forward"] == pytest.approx((1 - a ** 4) / (1 - a))
    # the whole round's cost, overhead included (the time strip's steps per round): 0.6 + 1.2 + 0.2
    assert fields["predicted_speedup"] == pytest.approx((1 - a ** 4) / (1 - a) / 2.0)
    assert metrics.cost_fields(rounds, None) == dict.fromkeys(metrics.COST_FIELDS)
    summary = {"rounds": 2, "new_tokens": 5, "acceptance_rate": 0.5, "tokens_per_forward": 2.5,
               "expected_tokens_per_forward": 2.73, "tokens_per_second": 12.0, "baseline_tokens_per_second": 10.0,
               "speedup": 1.2, "matches_baseline": None, "judged_acceptance": a, **fields}
    out = render.stats_html(summary)
    for stat, value in (("judged acceptance a", "75%"), ("draft cost c", "0.60 steps"),
                        ("verify cost v", "1.20 steps"), ("overhead o", "0.20 steps"), ("predicted speedup", "×1.37"),
                        ("speedup (measured)", "×1.20")):
        assert re.search(f'data-stat="{re.escape(stat)}"[^>]*><span class="k">[^<]*</span><span class="v">'
                         f'{re.escape(value)}</span>', out), stat
    assert "Leviathan" in out                                     # the formula, in the predicted chip's title
    assert "predicted speedup" not in render.stats_html(dict(summary, **dict.fromkeys(metrics.COST_FIELDS)))


def test_a_tree_slower_than_plain_says_so_with_its_numbers():
    """Issue #38: eagle-tree gave x0.67 here with no word why. A tree run slower than plain gets a note with its verify
    and draft costs; a faster tree, or a chain slower than plain, gets none."""
    summary = {"rounds": 10, "new_tokens": 19, "acceptance_rate": 0.6, "tokens_per_forward": 1.9,
               "expected_tokens_per_forward": 2.0, "tokens_per_second": 8.0, "baseline_tokens_per_second": 12.0,
               "speedup": 0.67, "matches_baseline": None, "verify_cost": 2.15, "draft_cost": 0.6,
               "tree_nodes_per_round": 12.0}
    out = html.unescape(render.stats_html(summary))
    assert 'data-note="tree-slower"' in out
    assert "×0.67" in out and "12 nodes" in out and "v = 2.15" in out and "c = 0.60" in out and "What if" in out
    assert "tree-slower" not in render.stats_html(dict(summary, speedup=1.2))
    assert "tree-slower" not in render.stats_html(dict(summary, tree_nodes_per_round=None))
