"""The Exactness lab and Sweeps tabs without a server: handlers driven directly, figures and tables checked
against the engine (every number shown must come from a run)."""
import gradio as gr
import pandas as pd
import pytest

import spec_engine as se
from spec_engine.classroom import lab, sweep, toy
from ui.classroom import lab as lab_ui
from ui.views import lab_plots
from ui.classroom import sweeps
from ui.playground.state import SessionState

MAIN = dict(prompt="Write one sentence about the sea.", target="smollm2-135m-instruct", draft="layer-skip", chat=True,
            skip_layers="", exit_after=0)


def lab_args(**kw):
    values = dict(model="toy", toy_prompt="the cat", n=100, depth=2, k=2, temperature=1.0, top_p=0.9, top_k=0, seed=0,
                  wrong_rules=True, level="next", **MAIN)
    values.update(kw)
    return list(values.values())


@pytest.fixture(scope="module")
def toy_run():
    outputs = list(lab_ui.run_lab(*lab_args(), SessionState()))
    return outputs


@pytest.mark.slow              # the lab draws hundreds of toy runs
def test_lab_streams_then_shows_both_histograms_and_the_table(toy_run):
    assert toy_run[0][0].startswith("Enumerating")
    status, exact_plot, wrong_plot, table, run = toy_run[-1]
    assert "toy pair" in status and "Done: 800 continuations" in status
    assert [t.name for t in exact_plot.data] == ["exact (from the model)", "plain sampling", "speculative, exact rule",
                                                 "speculative, strict (target's own draw)",
                                                 "speculative, drafter-invariant (the seed fixes the text)"]
    assert [t.name for t in wrong_plot.data] == [
        "exact (from the model)", "speculative, typical acceptance (Medusa, lossy)",
        "speculative, q before warping (transformers bug #32867)", "speculative, top-p membership (wrong)",
        "speculative, no residual (wrong)"]
    assert list(exact_plot.data[0].x) == ["sat", "ran", "and", "."]     # the top-p set after "the cat", by p
    assert isinstance(table, pd.DataFrame) and len(table) == 8


@pytest.mark.slow
def test_lab_numbers_come_from_engine_draws_with_the_same_seeds(toy_run):
    *_, table, run = toy_run[-1]
    pair = toy.toy_pair()
    sampling = se.SamplingParams(1.0, top_p=0.9)
    prompt = pair.encode("the cat")
    exact = lab.exact_distribution(pair.target.model, prompt[0].tolist(), 2, sampling)
    assert run.exact == pytest.approx(exact)
    for row, sampler in zip(table.itertuples(index=False), lab.SAMPLERS):
        for direct in lab.draw(pair.target.model, lambda: se.ModelDrafter(pair.draft.model), prompt, 2, 2, sampling,
                               100, sampler, seed=0):
            pass
        report = lab.report(exact, direct)
        assert row[0] == lab_plots.SAMPLER_NAMES[sampler] and row[1] == 100
        assert row[3] == round(report.tv, 4) and row[4] == round(report.tv_next, 4)
        assert row[7] == lab_plots.fmt_p(report.chi.pvalue)
        if sampler in ("exact", "strict"):                  # exact rules, not rejected: "exact (acceptance 0.52)"
            assert row[9] == f"exact (acceptance {report.acceptance:.2f})" and row[2] == round(report.acceptance, 3)
        if report.chi.pvalue < lab_plots.ALPHA:
            assert row[9] == f"changes what is sampled (TV {report.tv:.2f}, p = {lab_plots.fmt_p(report.chi.pvalue)})"


def test_the_level_radio_redraws_from_the_stored_run(toy_run):
    run = toy_run[-1][-1]
    exact_plot, wrong_plot = lab_ui.relevel("whole", run)
    assert all(len(x.split()) == 2 for x in exact_plot.data[0].x)        # two-word continuations
    assert "first 2 tokens" in exact_plot.layout.title.text
    assert lab_ui.relevel("next", None) == (gr.skip(), gr.skip())


@pytest.mark.parametrize("change,message", [
    (dict(temperature=0), "needs sampling"), (dict(n=10), "between 50 and 5000"), (dict(depth=4), "between 1 and 3"),
    (dict(k=17), "between 1 and 16"), (dict(top_p=0), "top_p"), (dict(top_k=-1), "top-k"),
    (dict(toy_prompt="the bird"), "no word 'bird'"), (dict(toy_prompt=""), "empty"), (dict(model="gpt"), "Models")])
def test_lab_input_mistakes_are_readable_errors(change, message):
    with pytest.raises(gr.Error, match=message):
        list(lab_ui.run_lab(*lab_args(**change), SessionState()))


@pytest.mark.slow              # the lab draws hundreds of toy runs
def test_lab_without_wrong_rules_draws_plain_and_the_exact_rules():
    *_, table, run = list(lab_ui.run_lab(*lab_args(n=50, depth=1, wrong_rules=False), SessionState()))[-1]
    assert [d.sampler for d in run.draws] == ["plain", "exact", "strict", "invariant"] and len(table) == 4


def test_labels_are_escaped_for_plotly():
    labels = lab_plots.outcome_labels([(1,), ()], lambda seq: "<b>x</b>")
    assert labels == ["&lt;b&gt;x&lt;/b&gt;", "(all others)"]
    assert lab_plots.fmt_p(0.0) == "< 1e-300" and lab_plots.fmt_p(0.5) == "0.50" and lab_plots.fmt_p(2e-5) == "2e-05"


# ---------------------------------------------------------------------------------------------- sweeps

def fake_row(value, speedup):
    point = sweep.SweepPoint("layer-skip", value, se.SamplingParams())
    return sweep.SweepRow("k", value, point, 0.6, 2.0, 2.1, 3, 6, 1.0, 6.0, 5.0, speedup, [1] * 6)


def test_sweep_figure_marks_the_best_and_overlays_the_theory():
    rows = [fake_row(1, 0.9), fake_row(2, 1.3), fake_row(3, 1.1)]
    best = sweep.best(rows)
    fig = lab_plots.sweep_figure(rows, "k", best)
    names = [t.name for t in fig.data]
    assert "measured" in names and any(n.startswith("theory") for n in names)
    star = next(t for t in fig.data if t.name.startswith("best"))
    assert list(star.x) == [2] and list(star.y) == [1.3]
    bars = next(t for t in fig.data if t.name == "speedup").error_y
    assert list(bars.array) == [0, 0, 0] and list(bars.arrayminus) == [0, 0, 0]     # one repeat: no spread
    assert "best k = 2" in fig.layout.title.text
    table = lab_plots.sweep_rows(rows, best)
    assert [r[-1] for r in table] == ["", "★", ""]


@pytest.mark.parametrize("axis,text,message", [("k", "1, 2, 20", "between 1 and 16"), ("k", "", "at least one"),
                                               ("temperature", "0, 3", r"\[0, 2\]"), ("temperature", "hot", "number"),
                                               ("draft", "layer-skip, nonsense:naive-ids", "unknown model preset")])
def test_sweep_values_are_validated(axis, text, message):
    with pytest.raises(gr.Error, match=message):
        sweeps.parse_values(axis, text, "smollm2-135m-instruct")


def test_sweep_default_values():
    assert sweeps.parse_values("k", sweeps.default_values("k"), "smollm2-135m-instruct") == list(range(1, 9))
    assert sweeps.parse_values("temperature", sweeps.default_values("temperature"), "x")[-1] == 1.5
    drafts = sweeps.default_values("draft", "smollm2-135m-instruct")
    assert "layer-skip" in drafts and "prompt-lookup" in drafts


def test_sweep_handler_matches_direct_engine_runs(playground_registry, smollm2):
    args = dict(axis="k", values="1, 3", prompt=MAIN["prompt"], target=MAIN["target"], draft="prompt-lookup", k=4,
                temperature=0, top_p=1.0, top_k=0, max_new_tokens=8, seed=0, rule="exact", chat=True, skip_layers="",
                exit_after=0)
    outputs = list(sweeps.run_sweep(*args.values(), SessionState(), 2))
    status, fig, table = outputs[-1]
    assert status.startswith("Done: 2 settings, 4 runs") and len(table) == 2 and list(table["repeats"]) == [2, 2]
    assert "drafts sized by the drafter" in status and "2 repeats of each run" in status
    ids = smollm2.encode_prompt(MAIN["prompt"], chat=True)
    eos = smollm2.model.generation_config.eos_token_id
    for row, k in zip(table.itertuples(index=False), (1, 3)):
        ref = se.SpeculativeDecoder(smollm2.model, se.PromptLookupDrafter()).generate(
            ids, k=k, max_new_tokens=8, sampling=se.SamplingParams(0.0), seed=0, eos_token_id=eos)
        assert row[2] == k and row[4] == round(ref.stats.acceptance_rate, 3)
        assert row[7] == ref.stats.rounds and row[8] == len(ref.tokens)
    starred = any(t.name.startswith("best") for t in fig.data)
    assert starred == ("Best k = " in status) and (starred or "No best k" in status)   # a best only beyond noise
    assert any(t.name.startswith("predicted") for t in fig.data)


def test_the_app_exposes_both_endpoints_and_stop_cancels_them(playground_registry):
    import app
    fns = list(app.demo.fns.values())
    ids = {fn.api_name: fn._id for fn in fns}
    stop = next(fn for fn in fns if fn.api_name == "stop")
    run = next(fn for fn in fns if fn.api_name == "run")
    cancel = next(fn for fn in fns if fn.is_cancel_function and fn.targets == stop.targets)   # Stop's cancels=
    assert {"lab_exactness", "lab_sweep"} <= set(ids)
    assert {ids["lab_exactness"], ids["lab_sweep"]} <= set(cancel.cancels)
    for name in ("lab_exactness", "lab_sweep"):
        fn = next(f for f in fns if f.api_name == name)
        assert fn.concurrency_id == "compute" and fn.concurrency_id != run.concurrency_id


def test_a_labs_work_waits_for_its_turn_at_the_engines_gate():
    """Runs wait at the engine's gate, not in Gradio's "compute" group; the lab and the sweeps take a turn there too
    (compute.pull(gated=True)), so they never decode beside a run beyond the concurrency, and see their place."""
    import threading
    from ui.playground import coalesce, compute
    gate = coalesce.Gate(capacity=lambda: 1)
    coalesce.GATE = gate                       # the fixture own_class_state gives the next test a fresh one
    started = threading.Event()

    def work():
        started.set()
        yield "drawn"

    for _ in gate.enter():                     # another computation takes the empty gate's only turn
        pass
    results = []
    puller = threading.Thread(target=lambda: results.extend(compute.pull(work(), threading.Event(), gated=True)))
    puller.start()
    puller.join(0.5)
    assert not started.is_set() and puller.is_alive()          # waits while another computation holds the gate
    gate.leave(next(iter(gate.running)), 0.1)
    puller.join(10)
    assert started.is_set() and results[-1] == "drawn" and gate.busy == 0
    waits = results[:-1]                       # its place in line while it waited, for the lab's page to show
    assert waits and all(isinstance(w, coalesce.Waiting) and w.position == 1 for w in waits)


def test_the_validators_name_every_bad_input_at_once(playground_registry):
    verdicts = lab_ui.lab_validator(*lab_args(n=1, temperature=0, level="later", toy_prompt="the bird"), None)
    bad = [i for i, v in enumerate(verdicts) if not v["is_valid"]]
    assert bad == [1, 2, 5, 10]                           # toy prompt, N, temperature, level
    assert len(verdicts) == len(lab_args()) + 2 and "needs sampling" in verdicts[5]["message"]   # + state, shape
    assert all(v["is_valid"] for v in lab_ui.lab_validator(*lab_args(), None))
    current = lab_ui.lab_validator(*lab_args(model="current", toy_prompt="not toy words", prompt=""), None)
    assert [i for i, v in enumerate(current) if not v["is_valid"]] == [11]          # the main panel's prompt

    values = dict(axis="k", values="1, 99", prompt="Hi", target="smollm2-135m-instruct", draft="layer-skip", k=4,
                  temperature=0, top_p=1.0, top_k=0, max_new_tokens=8, seed=-1, rule="exact", chat=True,
                  skip_layers="", exit_after=0)
    verdicts = sweeps.sweep_validator(*values.values(), None)
    assert len(verdicts) == len(values) + 3                                        # + state, repeats, fixed length
    assert [i for i, v in enumerate(verdicts) if not v["is_valid"]] == [1, 10]     # values, seed
    verdicts = sweeps.sweep_validator(*values.values(), None, 0, "yes")
    assert [i for i, v in enumerate(verdicts) if not v["is_valid"]] == [1, 10, 16, 17]   # + repeats, fixed length
    assert "between 1 and 16" in verdicts[1]["message"]


@pytest.mark.slow              # the lab draws hundreds of toy runs
def test_toy_draws_run_on_one_intra_op_thread_and_restore_the_count(monkeypatch):
    """Two threads made each toy draw ~10x slower on two shared cores (a barrier per tiny op): the toy lab draws
    with one, and the process's count comes back afterwards, also when the run is stopped half-way."""
    import torch
    seen = []
    real_draw = lab.draw

    def recording_draw(*args, **kwargs):
        for draws in real_draw(*args, **kwargs):
            seen.append(torch.get_num_threads())
            yield draws

    monkeypatch.setattr(lab, "draw", recording_draw)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        list(lab_ui.run_lab(*lab_args(n=50), SessionState()))
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
        seen.clear()
        gen = lab_ui.run_lab(*lab_args(n=50), SessionState())
        while not seen:
            next(gen)
        gen.close()                                      # Stop / a closed tab closes the generator mid-draws
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_runs_place_in_line_reaches_its_handler():
    """A run waits at the gate itself (handlers.fold): compute.pull hands its coalesce.Waiting items through, so its
    page shows "position P of N" and yields while it waits (a cancelled job leaves the line at once)."""
    import threading
    from ui.playground import coalesce, compute
    waiting = coalesce.Waiting(2, 3, 4.0)

    def work():                                # a generator, as a GPU function's results are
        yield waiting
        yield "round"

    assert list(compute.pull(work(), threading.Event())) == [waiting, "round"]
    assert "position 2 of 3" in waiting.text()


# ------------------------------------------------------------------------------ the teacher's walkthrough (#60)

def test_lab_titles_wrap_to_lines_that_fit_half_a_window():
    """Plotly never wraps a title: the wrong rules' TV line ran past its figure's edge ("q before warping (tra") in
    half a 1440 px window. Every line now fits TITLE_CHARS, every sampler still has its number, and the figure's top
    margin grows with the lines."""
    from types import SimpleNamespace
    reports = [SimpleNamespace(sampler=name, tv=0.25 + i / 100, tv_next=0.125 + i / 100)
               for i, name in enumerate(lab_ui.WRONG_SIDE)]
    title = lab_plots.figure_title("Lossy and wrong rules, next token: ", reports, lab_ui.WRONG_SIDE, True)
    lines = title.split("<br>")
    assert len(lines) > 1 and all(len(line) <= lab_plots.TITLE_CHARS for line in lines), lines
    assert lines[0] == "Lossy and wrong rules, next token:"
    for i, name in enumerate(lab_ui.WRONG_SIDE):
        assert f"{lab_plots.short_name(name)} {0.125 + i / 100:.3f}" in title, name
    assert "q before warping 0.135" in title and "(transformers" not in title
    hist = lab.Histogram([(1,), (2,)], [0.5, 0.5], {name: [0.5, 0.5] for name in lab_ui.WRONG_SIDE})
    fig = lab_plots.distribution_figure(hist, lab_ui.WRONG_SIDE, ["a", "b"], title)
    assert fig.layout.margin.t >= 16 * len(lines) + 8 and fig.layout.title.yanchor == "top"


def test_rules_that_draw_alike_on_the_toy_are_named_in_the_status():
    """On the toy pair at top-p 0.8 typical acceptance and top-p membership drew the same counts, so the table's
    rows and the bars were identical with nothing saying why; the status now names them. Draws from the engine."""
    pair, sampling = toy.toy_pair(), se.SamplingParams(1.0, top_p=0.8)
    prompt = pair.encode(toy.DEFAULT_PROMPT)
    draws = []
    for sampler in ("exact", "typical", "topp_membership"):
        for d in lab.draw(pair.target.model, lambda: se.ModelDrafter(pair.draft.model), prompt, 1, 2, sampling, 50,
                          sampler, seed=0):
            pass
        draws.append(d)
    assert lab.identical_draws(draws) == [["typical", "topp_membership"]]
    assert lab.identical_draws(draws[:2]) == []
    exact = lab.exact_distribution(pair.target.model, prompt[0].tolist(), 1, sampling)
    settings = lab_ui.parse_lab(50, 1, 2, 1.0, 0.8, 0, 0, True)
    run = lab_ui.LabRun(lambda seq: str(seq), "toy", "the cat", settings, exact, draws, 0.0)
    status = lab_ui.lab_view(run, "next", "Done.")[0]
    assert "**Same figures:** *typical acceptance* and *top-p membership* drew the same count" in status
    assert "Same figures" not in lab_ui.lab_view(lab_ui.LabRun(run.label, "toy", "", settings, exact, draws[:2], 0.0),
                                                 "next", "Done.")[0]
