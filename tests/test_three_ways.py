"""The three-ways measurement (spec_engine.classroom.three_ways) on tiny models: every figure comes from the runs.
Speculation and batching decode plain decoding's exact text; a quantized copy is measured against it, or, where the
engine has no quantized targets, its row says "not available" and carries no numbers."""
import pytest
import torch

import spec_engine as se
from spec_engine.classroom import three_ways as tw
from tiny import tiny_llama


def prompt():
    return torch.tensor([[1, 2, 3, 1, 2]], dtype=torch.long)


def run(target, quantize=tw.quantized_target, **kwargs):
    draft = tiny_llama(vocab=32, seed=0)      # the target's twin: its drafts are accepted, so rounds are fewer
    updates = list(tw.measure(target, prompt(), lambda: se.ModelDrafter(draft), k=3, draft="tiny draft",
                              tokens=12, batch=3, repeats=2, quantize=quantize, **kwargs))
    return updates, {row.arm: row for row in updates[-1].rows}


def test_batching_and_speculation_decode_plain_text_and_their_figures_come_from_the_runs():
    target = tiny_llama(vocab=32, seed=0)
    updates, rows = run(target)
    samples = updates[-1].samples
    plain = se.autoregressive_generate(target, prompt(), 12, se.SamplingParams(0.0)).tokens
    assert [s.tokens for s in samples["plain"]] == [[plain], [plain]]
    assert all(seq == plain for s in samples["batch"] for seq in s.tokens) and len(samples["batch"][0].tokens) == 3
    assert [s.tokens for s in samples["speculation"]] == [[plain], [plain]]
    assert rows["batch"].same_text and rows["speculation"].same_text and rows["plain"].same_text
    assert rows["plain"].tokens_per_read == 1.0 and rows["batch"].tokens_per_read == 3.0
    spec = samples["speculation"][0]
    assert rows["speculation"].tokens_per_read == pytest.approx(12 / spec.forwards) and spec.forwards < 12
    full = tw.weight_bytes(target)
    assert rows["plain"].bytes_per_token == full and rows["batch"].bytes_per_token == pytest.approx(full / 3)
    assert rows["plain"].bytes_per_weight == pytest.approx(4.0)
    for row in (rows["plain"], rows["batch"], rows["speculation"]):
        rates = [sum(map(len, s.tokens)) / s.seconds for s in samples[row.arm]]
        assert row.runs == 2 and (row.low, row.high) == (min(rates), max(rates)) and row.low <= row.tokens_per_second
    arms = [u.text.split(":")[0] for u in updates if u.rows]
    assert arms[:3] == ["plain decoding (fp32, 1 user)", "batching (3 users)", "speculation (tiny draft)"]


def test_an_unavailable_quantization_is_a_reason_row_without_numbers():
    target = tiny_llama(vocab=32, seed=0)
    _, rows = run(target, quantize=lambda model, scheme: (None, f"not available: no {scheme} here"))
    for scheme in tw.SCHEMES:
        row = rows[scheme]
        assert not row.available and row.reason == f"not available: no {scheme} here"
        assert row.runs == 0 and row.tokens_per_second == 0.0 and row.same_text is None


def test_a_quantized_arm_is_measured_against_plain_text():
    """A stand-in 'quantization' (a differently seeded model, so its text differs) shows where the text diverges
    and how its bytes compare; the real quantized copies run through the same path."""
    target = tiny_llama(vocab=32, seed=0)
    other = tiny_llama(vocab=32, seed=5).to(torch.bfloat16)
    updates, rows = run(target, quantize=lambda model, scheme: (other, ""), schemes=("bf16",))
    samples = updates[-1].samples
    expected = tw.first_difference(samples["bf16"][0].tokens[0], samples["plain"][0].tokens[0])
    assert expected is not None and rows["bf16"].first_divergence == expected and rows["bf16"].same_text is False
    assert rows["bf16"].bytes_per_weight == pytest.approx(2.0, rel=0.01)


def test_the_engine_quantization_api_gives_a_copy_or_a_reason():
    target = tiny_llama(vocab=32, seed=0, hidden=64)
    for scheme in tw.SCHEMES:
        copy, reason = tw.quantized_target(target, scheme)
        assert (copy is None) == reason.startswith("not available: ")
        if copy is not None:
            assert tw.weight_bytes(copy) < tw.weight_bytes(target)


def test_first_difference():
    assert tw.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert tw.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert tw.first_difference([1, 2], [1, 2, 3]) == 2


def test_the_tab_escapes_every_text_before_html():
    from ui.classroom import three_ways as tab
    bad = "not available: <img src=x onerror=alert(1)>"
    rows = [tw.WayRow("plain", "none", "plain <b>", runs=1, tokens_per_second=2.0, low=1.0, high=3.0, speedup=1.0,
                      tokens_per_read=1.0, bytes_per_weight=4.0, same_text=True),
            tw.WayRow("int8", "quantization", "quantization: int8", reason=bad)]
    fig = tab.figure(rows)
    texts = [x for trace in fig.data for x in trace.x] + [h for trace in fig.data for h in trace.hovertext]
    assert not any("<img" in t or "<b>" in t for t in texts) and any("&lt;img" in t for t in texts)
    status, _, table = tab.view(rows, "<script>")
    assert "<img" not in status and "<script>" not in status
    assert table.iloc[1]["text vs plain fp32"] == bad      # the table shows text, not HTML (gr.Dataframe, str)
    assert fig.data[0].y[0] == 2.0 and list(fig.data[0].error_y.array) == [1.0]


def test_a_quantized_arm_with_the_same_text_is_not_called_exact():
    from ui.classroom import three_ways as tab
    same = dict(runs=1, tokens_per_second=1.0, same_text=True)
    assert tab.text_verdict(tw.WayRow("batch", "batching", "b", **same)) == "identical"
    assert tab.text_verdict(tw.WayRow("int4", "quantization", "q", **same)) == "identical here, not guaranteed"
    differs = tw.WayRow("int8", "quantization", "q", runs=1, same_text=False, first_divergence=11)
    assert tab.text_verdict(differs) == "differs from token 12"


def test_the_engine_quantized_copies_are_measured_where_the_engine_has_them():
    pytest.importorskip("spec_engine.models.quantize", reason="this engine has no quantized targets")
    target = tiny_llama(vocab=32, seed=0, hidden=64)
    draft = tiny_llama(vocab=32, seed=0, hidden=64)
    updates = list(tw.measure(target, prompt(), lambda: se.ModelDrafter(draft), k=3, tokens=12, batch=2, repeats=1))
    rows, samples = {row.arm: row for row in updates[-1].rows}, updates[-1].samples
    plain = samples["plain"][0].tokens[0]
    for scheme, most in (("bf16", 2.01), ("int8", 2.0), ("int4", 2.0)):
        row = rows[scheme]
        assert row.available and row.runs == 1 and row.bytes_per_weight < most
        assert row.first_divergence == tw.first_difference(samples[scheme][0].tokens[0], plain)


def test_the_combinations_decode_plain_text_and_a_self_draft_pays_its_copys_reads():
    """Speculation inside the batch and speculation by a quantized copy of the target keep plain decoding's text; the
    self-draft's bytes per token count the copy's read for every draft token besides the target's per forward."""
    target = tiny_llama(vocab=32, seed=0)
    copy = tiny_llama(vocab=32, seed=0).to(torch.bfloat16)          # the bf16 copy: drafts what the target decodes
    updates, rows = run(target, quantize=lambda model, scheme: (copy, ""), schemes=("bf16",),
                        make_self_draft=lambda: se.ModelDrafter(copy))
    samples = updates[-1].samples
    plain = se.autoregressive_generate(target, prompt(), 12, se.SamplingParams(0.0)).tokens
    assert all(seq == plain for s in samples["batch+speculation"] for seq in s.tokens)
    assert len(samples["batch+speculation"][0].tokens) == 3
    assert [s.tokens for s in samples["self-draft"]] == [[plain], [plain]]
    assert rows["batch+speculation"].same_text and rows["self-draft"].same_text
    assert rows["batch+speculation"].tokens_per_read > rows["batch"].tokens_per_read      # 3 users, drafts accepted
    full, half = tw.weight_bytes(target), tw.weight_bytes(copy)
    expected = sorted((full * s.forwards + half * s.drafted) / 12 for s in samples["self-draft"])
    assert samples["self-draft"][0].drafted > 0
    assert rows["self-draft"].bytes_per_token == pytest.approx(sum(expected) / 2)         # median of two runs
    assert [r.arm for r in updates[-1].rows][-2:] == ["batch+speculation", "self-draft"]  # combinations last
    assert rows["speculation"].bytes_per_token == pytest.approx(full * 12 / 12 / rows["speculation"].tokens_per_read)


def test_a_quantized_copy_says_how_it_changed_the_model_on_held_out_text():
    """Top-1 agreement and KL(full || copy), teacher-forced on held-out text: 1 and 0 for the model itself, and for a
    copy the figures of that copy, carried into its row (the exact ways carry none: they do not change the model)."""
    target = tiny_llama(vocab=32, seed=0)
    held = [torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]], dtype=torch.long)]
    top1, kl = tw.agreement(target, target, held)
    assert top1 == 1.0 and kl == pytest.approx(0.0, abs=1e-12)
    other = tiny_llama(vocab=32, seed=5)
    expected = tw.agreement(other, target, held)
    assert expected[0] < 1.0 and expected[1] > 0.0
    _, rows = run(target, quantize=lambda model, scheme: (other, ""), schemes=("bf16",), held_out=held)
    assert (rows["bf16"].top1, rows["bf16"].kl) == expected
    assert rows["plain"].top1 is None and rows["speculation"].kl is None
