"""One speed, whichever button: Run, "Measure the speedup again" and a Sweep k point at the same settings build the
same measurement. Each times the second pass of its decoder (Run's follows its live pass; the others decode once
untimed first), builds nothing for a view in the timed pass, measures plain decoding back to back with it, and sizes
its drafts alike. A fake decoder and registry: no model, no server."""
import dataclasses
import statistics
import types

import pytest
import torch

import spec_engine as se
from ui.playground import coalesce, compute, handlers, runner, sweep
from ui.playground import registry as reg
from ui.playground.state import SessionState
from ui.views.render import RenderOptions

from test_honest_speed import ROUNDS, plain_result, timed_result
from test_ui_handlers import run_args
from test_ui_render import LABEL

SIZING = se.Sizing((0.0, 1.0, 1.2), "measured at start-up")


class FakeDecoder:
    """Records each pass of one decoder: ("stream" | "generate", display)."""

    def __init__(self, passes):
        self.passes = passes

    def stream(self, *args, display=True, **kwargs):
        self.passes.append(("stream", display))
        return (r for r in ROUNDS)

    def generate(self, *args, display=True, **kwargs):
        self.passes.append(("generate", display))
        return timed_result(0.1)


class Labeler:
    """The token labeler a prepared run holds: a token's piece, and a text."""

    def __call__(self, token_id):
        return LABEL(token_id)

    def text(self, token_ids) -> str:
        return "".join(LABEL(t).text for t in token_ids)


@pytest.fixture
def fake_engine(monkeypatch):
    """compute.run_job on a fake decoder (every build's passes and sizing recorded); prepare without models."""
    builds, jobs = [], []
    target = types.SimpleNamespace(device=torch.device("cpu"), model=types.SimpleNamespace())    # no forwards

    def build(settings, prompt_ids, sizing=None):
        passes = []
        builds.append({"k": settings.k, "sizing": sizing, "passes": passes})
        return FakeDecoder(passes), torch.tensor([list(prompt_ids)]), target, compute.Built("fake", "float32", SIZING)

    def prepare(settings, state, registry, show_spaces=False, hold=False, record=None):
        return runner.Prepared(settings, (0,), Labeler(), RenderOptions(), record)
        yield                                       # a generator, as runner.prepare is

    run_job = compute.run_job
    monkeypatch.setattr(compute, "build", build)
    monkeypatch.setattr(compute, "loaded", lambda name: target)
    monkeypatch.setattr(compute, "run_job", lambda job, stop: jobs.append(job) or run_job(job, stop))
    monkeypatch.setattr(compute.se, "autoregressive_generate", lambda *a, **kw: plain_result(0.2))
    monkeypatch.setattr(reg, "eos_ids", lambda loaded: None)
    monkeypatch.setattr(runner, "prepare", prepare)
    monkeypatch.setattr(runner, "release", lambda prep, registry: None)
    monkeypatch.setattr(handlers, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(coalesce, "COALESCER", coalesce.Coalescer())
    monkeypatch.setattr(coalesce, "reusable_baseline", lambda key, session: None)
    return builds, jobs


def test_run_measure_again_and_a_sweep_point_time_the_same_pass_the_same_way(fake_engine, monkeypatch):
    builds, jobs = fake_engine
    monkeypatch.setattr(sweep, "SWEEP_K", (3, 1))
    args = run_args(draft="prompt-lookup", k=3, max_new_tokens=3, auto_baseline=True)
    state = SessionState()
    list(handlers.run(*args, state))
    list(handlers.measure_baseline(state))
    list(sweep.sweep_k(*args, state))
    run, again, point, other = jobs
    # every timed pass is its decoder's second, built for no view; the first pass is Run's live one or its like
    first_pass = {"stream": True, "generate": False}
    for build in builds:
        (kind, _), timed = build["passes"]
        assert kind in first_pass and timed == ("generate", False)
    assert [b["passes"][0][0] for b in builds] == ["stream", "generate", "stream", "stream"]
    # the same parts: a first pass, the timed one, plain decoding right after (the sweep's once, at its first point)
    parts = lambda job: (job.live or job.warm, job.timed, job.plain)        # noqa: E731
    assert parts(run) == parts(again) == parts(point) == (True, True, True) and parts(other) == (True, True, False)
    # the same draft sizing: "again" takes the run's curve, and every sweep point the curve its first was sized by
    assert (run.sizing, again.sizing, point.sizing, other.sizing) == (None, SIZING, None, SIZING)
    assert [b["sizing"] for b in builds] == [None, SIZING, None, SIZING]
    # and the same settings and prompt for the same k
    assert run.settings == again.settings == point.settings and run.prompt_ids == again.prompt_ids == point.prompt_ids
    assert other.settings == dataclasses.replace(run.settings, k=1)
    records = state.history
    assert all(r.timing is not None and r.timing.how == "decoded again without drawing" for r in records)


REPEATS = 3
BAND = 0.25             # each button's median speedup against Run's


@pytest.mark.slow           # 27 passes of 32 tokens of the offline default (about a minute quiet, 3 on a busy host)
@pytest.mark.alone          # compares timings: the other test worker waits
@pytest.mark.measured_costs
def test_run_measure_again_and_sweep_k_read_the_same_speedup(playground_registry, monkeypatch):
    """The figures themselves, on the real model at the page's default draft and k: the median speedup of each button
    over REPEATS alternations within BAND of Run's. Before, "measure again" read x0.89-1.15 where Run read
    x1.20-1.35 (issue #59). One run's speedup varies with a coefficient of variation of 9-12% on a shared host
    (tests/test_speed_browser.py); a median of three, less."""
    from ui.playground import drafts
    draft, k = drafts.default_draft("smollm2-135m-instruct")
    monkeypatch.setattr(sweep, "SWEEP_K", (k,))
    monkeypatch.setattr(handlers, "SETTLE_SECONDS", 0.0)
    args = run_args(draft=draft, k=k, max_new_tokens=32, auto_baseline=True)
    speedups = {"run": [], "again": [], "sweep": []}
    for _ in range(REPEATS):
        state = SessionState()
        list(handlers.run(*args, state))
        speedups["run"].append(state.summary(state.history[-1])["speedup"])
        list(handlers.measure_baseline(state))
        speedups["again"].append(state.summary(state.history[-1])["speedup"])
        swept = SessionState()
        list(sweep.sweep_k(*args, swept))
        speedups["sweep"].append(swept.summary(swept.history[-1])["speedup"])
    medians = {button: statistics.median(figures) for button, figures in speedups.items()}
    print(f"\nspeedups {speedups}")
    for button in ("again", "sweep"):
        assert abs(medians[button] - medians["run"]) <= BAND * medians["run"], speedups
