"""Trace export and replay: the JSON round trip, readable errors for broken or foreign files, a complete piece
table, and the proof that matters: a replayed trace renders HTML identical to the live run's, on a tiny model
and on the real offline default."""
import json

import pytest
import torch

import spec_engine as se
from spec_engine.classroom import trace as tr
from ui.playground import handlers, runner
from ui.classroom import replay
from ui.playground.handlers import RUN_OUTPUTS
from ui.views.render import RenderOptions
from ui.playground.state import RunSettings, SessionState
from ui.views.tokens import Piece

from test_explain import event

TOKENS = RUN_OUTPUTS.index("tokens")
STATS = RUN_OUTPUTS.index("stats")


class TinyLabeler:
    """Pieces with HTML, quotes, newlines, a special and a partial token, so escaping is part of the proof."""
    TEXT = {0: "<s>", 1: " a", 2: "\n", 3: ' "b"', 4: "<i>", 5: "&", 6: "\t", 7: "é"}

    def __call__(self, token_id):
        token_id = int(token_id)
        return Piece(self.TEXT.get(token_id, f"#{token_id}"), special=token_id == 0, partial=token_id == 7)

    def text(self, ids):
        return "".join(self(t).text for t in ids) + "·"     # differs from the joined pieces: a real decode may


def tiny_settings(**kw):
    values = dict(target="tiny", draft="tiny-draft", k=3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16,
                  seed=4, rule="exact", chat=False, prompt="tiny prompt")
    values.update(kw)
    return RunSettings(**values)


def tiny_prep(settings, state, ids, show_spaces=False):
    """A prepared tiny run with its record, as handlers.fold makes one (runner.prepare, then runner.begin)."""
    options = RenderOptions(show_spaces=show_spaces, greedy=settings.greedy, rule=settings.rule)
    prep = runner.Prepared(settings, tuple(ids[0].tolist()), TinyLabeler(), options)
    runner.begin(prep, state, "tiny-draft", "")
    state.active = prep
    return prep


def stream(decoder, ids, settings, should_stop=None):
    s = settings
    return decoder.stream(ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                          should_stop=should_stop)


def live_tiny_run(target, draft, show_spaces=False, with_baseline=True, **kw):
    """What handlers.decode does, with the tiny models and no GPU function: the rounds folded into the record,
    the timed run and the baseline, finish."""
    settings = tiny_settings(**kw)
    state = SessionState()
    ids = torch.tensor([[1, 2, 3, 0]])
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule=settings.rule)
    prep = tiny_prep(settings, state, ids, show_spaces)
    for round_event in stream(decoder, ids, settings):
        runner.record_round(prep, state, round_event)
    if with_baseline:
        s = settings                 # the speed measured without drawing, as compute.run_job does
        runner.keep_timing(prep.record, state, decoder.generate(ids, k=s.k, max_new_tokens=s.max_new_tokens,
                                                                sampling=s.sampling(), seed=s.seed, display=False))
        state.baselines[prep.record.baseline_key] = se.autoregressive_generate(
            target, ids, max_new_tokens=settings.max_new_tokens, sampling=settings.sampling(), seed=settings.seed)
    state.finish(prep.record)
    return prep, state


@pytest.fixture(scope="module")
def tiny_run(target, draft):
    return live_tiny_run(target, draft)


def test_round_trip_keeps_every_event_exactly(tiny_run, tmp_path):
    prep, state = tiny_run
    trace = replay.export_latest(state)
    path = tr.save(trace, tmp_path / "t.json")
    loaded = tr.load(path)
    assert loaded.rounds == list(prep.record.timing.rounds)        # floats survive JSON bit for bit
    assert [r.emitted for r in loaded.rounds] == [r.emitted for r in prep.record.rounds]   # the live run's rounds
    # ...with the timed run's clocks, and the display parts of the live run (the timed one, display=False, has none)
    assert [(r.target_top, r.target_probs) for r in loaded.rounds] == [(r.target_top, r.target_probs)
                                                                      for r in prep.record.rounds]
    assert all(r.target_top for r in loaded.rounds)
    assert [r.round_seconds for r in loaded.rounds] != [r.round_seconds for r in prep.record.rounds]
    assert loaded.to_dict() == trace.to_dict()
    assert loaded.baseline == state.baselines[prep.record.baseline_key]
    assert loaded.settings["seed"] == 4 and loaded.models == {"target": "tiny", "draft": "tiny-draft"}
    assert loaded.prompt_text == TinyLabeler().text([1, 2, 3, 0]) and loaded.stop_reason == "max_new_tokens"
    doc = json.loads(path.read_text())
    assert doc["format"] == tr.FORMAT and doc["version"] == tr.VERSION and doc["source"] == "run"
    assert doc["stats"]["rounds"] == len(prep.record.rounds)
    assert doc["special_ids"] == [0] and doc["partial_ids"] == ([7] if 7 in loaded.pieces else [])


def test_exports_keep_only_the_newest_files_on_disk(tiny_run, tmp_path, monkeypatch):
    _, state = tiny_run
    monkeypatch.setattr(replay, "_exports_root", tmp_path)
    monkeypatch.setattr(replay, "KEEP_EXPORTS", 2)
    paths = [replay.write_temp(replay.export_latest(state)) for _ in range(4)]
    assert paths[0].name == paths[3].name and len(set(paths)) == 4      # same name, separate folders
    assert [p.exists() for p in paths] == [False, False, True, True]
    assert len(list(tmp_path.iterdir())) == 2
    assert tr.load(paths[3]).rounds == list(state.history[-1].timing.rounds)


def test_piece_table_covers_every_id_of_every_field():
    ev = event(0, [11, 12, 13], 1, correction=14)
    ev = se.RoundEvent(**{**ev.to_dict(), "next_top": [(15, 0.5)], "target_top": [[(16, 0.4)], [(17, 0.3)]]})
    assert tr.token_ids([ev], [18, 19]) == set(range(11, 20))
    trace = replay.make(tiny_settings(), "d", [18, 19], [ev], TinyLabeler(), RenderOptions())
    assert set(trace.pieces) == set(range(11, 20))
    assert trace.pieces[11] == ("#11", False, False)
    with pytest.raises(tr.TraceError, match="pieces lacks the text of 1 token id"):
        doc = trace.to_dict()
        del doc["pieces"]["16"]
        tr.validate(doc)


def test_replay_html_is_identical_to_the_live_run_on_a_tiny_model(target, draft):
    for show_spaces, kw in ((False, {}), (True, {"temperature": 0.0}), (False, {"rule": "no_residual"})):
        prep, state = live_tiny_run(target, draft, show_spaces=show_spaces, **kw)
        live = handlers.run_view(prep, state, final=True)
        replayed = replay.replay_view(tr.loads(tr.dumps(replay.export_latest(state))))
        assert replayed["tokens"] == live[TOKENS]
        assert replayed["stats"] == live[STATS]
        assert replayed["text"] == live[RUN_OUTPUTS.index("text")]
        assert "speedup (measured)" in replayed["stats"]


def test_a_stopped_run_replays_with_the_stop_status(target, draft):
    settings = tiny_settings(max_new_tokens=40)
    state = SessionState()
    ids = torch.tensor([[1, 2, 3, 0]])
    prep = tiny_prep(settings, state, ids)
    record = prep.record
    for ev in stream(se.SpeculativeDecoder(target, se.ModelDrafter(draft)), ids, settings, state.stop_event.is_set):
        if not runner.record_round(prep, state, ev):
            break
        if ev.index == 2:
            live = next(handlers.stop(state))                     # what the Stop button renders, mid-run
    assert record.stop_reason == "cancelled" and len(record.rounds) == 3
    replayed = replay.replay_view(tr.loads(tr.dumps(replay.export_latest(state))))
    assert "Stopped after" in live[TOKENS]
    assert (replayed["tokens"], replayed["stats"]) == (live[TOKENS], live[STATS])


@pytest.mark.slow
def test_replay_html_is_identical_to_the_live_run_on_smollm2(playground_registry, monkeypatch):
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 0.0)
    state = SessionState()
    args = dict(prompt="Name three colours.", target="smollm2-135m-instruct", draft="layer-skip", k=3,
                temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=12, seed=1, rule="exact", chat=True,
                skip_layers="", exit_after=0, auto_baseline=True, show_spaces=False)
    outputs = list(handlers.run(*[args[name] for name in handlers.RUN_INPUTS], state))
    live_tokens, live_stats = outputs[-1][TOKENS], outputs[-1][STATS]
    trace = tr.loads(tr.dumps(replay.export_latest(state)))
    view = replay.replay_view(trace)
    assert view["tokens"] == live_tokens
    assert view["stats"] == live_stats and "speedup (measured)" in live_stats
    assert trace.text == state.active.labeler.text(state.active.record.tokens)
    assert any(r.uniforms for r in trace.rounds)


def test_the_shipped_example_replays_without_models():
    trace = tr.load(replay.EXAMPLE_PATH)
    assert trace.settings["temperature"] == 0 and trace.settings["target"] == "smollm2-135m-instruct"
    assert 20 <= len(trace.tokens) <= 24 and trace.baseline is not None
    view = replay.replay_view(trace)
    assert view["tokens"].count('class="round"') == len(trace.rounds)
    assert "speedup (measured)" in view["stats"]


# ------------------------------------------------------------------------------------------ validation

@pytest.fixture(scope="module")
def good_doc(tiny_run):
    return json.loads(tr.dumps(replay.export_latest(tiny_run[1])))


def broken(doc, change):
    doc = json.loads(json.dumps(doc))
    change(doc)
    return json.dumps(doc)


CASES = [
    ("not json", "invalid JSON at line 1"),
    ("[1, 2]", "expected a JSON object, got list"),
    (lambda d: d.update(format="something-else"), "not a trace: the 'format' field"),
    (lambda d: d.update(version=2), "trace version 2 is not supported"),
    (lambda d: d.pop("rounds"), "trace field rounds is missing"),
    (lambda d: d["settings"].pop("k"), "settings.k is missing"),
    (lambda d: d["settings"].update(temperature="hot"), "settings.temperature must be a number"),
    (lambda d: d["settings"].update(rule="vibes"), "settings.rule must be one of"),
    (lambda d: d["settings"].update(k=99), r"settings.k must lie in \[1, 16\]"),
    (lambda d: d["rounds"][1].update(accepted="2"), r"rounds\[1\].accepted must be an integer, got str"),
    (lambda d: d["rounds"][1].update(accepted=True), r"rounds\[1\].accepted must be an integer, got bool"),
    (lambda d: d["rounds"][1].update(accepted=9), r"rounds\[1\]: accepted must lie in"),
    (lambda d: d["rounds"][1].update(index=5), r"rounds\[1\]: index must be 1"),
    (lambda d: d["rounds"][0].update(colour="red"), r"rounds\[0\] has unknown key"),
    (lambda d: d["rounds"][0].pop("drafted"), r"rounds\[0\] lacks drafted"),
    (lambda d: d["rounds"][0].update(next_top=[[1]]), r"next_top\[0\] must be a \[token id, probability\] pair"),
    (lambda d: d["rounds"][0].update(drafted=[-1, 2, 3]), r"drafted\[0\] must lie in"),
    (lambda d: d.update(rounds=[]), "the trace has no rounds"),
    (lambda d: d["rounds"][0].update(finished=True), "only the last round may be marked finished"),
    (lambda d: d["pieces"].update({"x1": "a"}), "is not a token id"),
    (lambda d: d.update(display={"status": ["a"]}), "display.status must be"),
    (lambda d: d["baseline"].pop("tokens"), "baseline lacks tokens"),
]


@pytest.mark.parametrize("change, message", CASES)
def test_broken_or_foreign_documents_say_what_is_wrong(good_doc, change, message):
    data = change if isinstance(change, str) else broken(good_doc, change)
    with pytest.raises(tr.TraceError, match=message):
        tr.loads(data)


def test_non_finite_numbers_and_non_utf8_are_refused(good_doc):
    with pytest.raises(tr.TraceError, match="constant NaN"):
        tr.loads(json.dumps(good_doc).replace('"draft_seconds":', '"draft_seconds": NaN, "x":', 1))
    with pytest.raises(tr.TraceError, match="not UTF-8"):
        tr.loads(b"\xff\xfe{}")


def test_size_and_round_limits(good_doc, tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(good_doc))
    monkeypatch.setattr(tr, "MAX_BYTES", 1000)
    with pytest.raises(tr.TraceError, match="MiB trace limit"):
        tr.load(path)
    monkeypatch.setattr(tr, "MAX_BYTES", 20 * 2**20)
    monkeypatch.setattr(tr, "MAX_ROUNDS", 2)
    with pytest.raises(tr.TraceError, match="rounds has .* entries, over the limit of 2"):
        tr.load(path)


def test_replay_handler_turns_errors_into_messages(tmp_path):
    import gradio as gr
    from ui.classroom import tabs as classroom
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "spec-decoding-trace", "version": 99}')
    with pytest.raises(gr.Error, match="Cannot replay this file: trace version 99"):
        classroom.replay_file(str(bad))
    with pytest.raises(gr.Error, match="No finished run"):
        classroom.export_run(SessionState())
