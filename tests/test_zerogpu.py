"""ZeroGPU's process model, faked: the app started as a ZeroGPU Space starts it, with a stand-in `spaces` package
(tests/zerogpu/spaces.py) whose GPU decorator pickles every call's arguments, runs the call in a forked process
and pickles every yielded value back. A child process (tests/zerogpu/drive.py) drives the handler of every GPU
function there; this process runs the same handlers in-process, as on CPU basic or a dedicated GPU, and the two
must agree on everything that does not depend on the clock. No GPU is involved: the point is the boundary."""
import ast
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from ui.playground import compute, handlers, limits
from ui.playground.state import SessionState

from zerogpu.drive import PROMPT, RUN, TARGET, comparable, plain_round, run_args

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def gpu_functions() -> set[str]:
    """Every function in ui/ decorated with compute.gpu (whatever the module calls compute), read from the source."""
    names = set()
    for path in (ROOT / "ui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                for deco in node.decorator_list:
                    call = deco.func if isinstance(deco, ast.Call) else deco
                    if getattr(call, "attr", getattr(call, "id", None)) == "gpu":
                        names.add(node.name)
    return names


@pytest.fixture(scope="module")
def zerogpu(tmp_path_factory):
    """What the child process saw with the stand-in `spaces` (see tests/zerogpu/drive.py)."""
    path = tmp_path_factory.mktemp("zerogpu") / "out.pkl"
    env = dict(os.environ, SPACES_ZERO_GPU="1", SPEC_ZEROGPU_MODELS=TARGET,
               PYTHONPATH=os.pathsep.join([str(HERE / "zerogpu"), str(ROOT)]))
    done = subprocess.run([sys.executable, str(HERE / "zerogpu" / "drive.py"), str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return pickle.loads(path.read_bytes())


@pytest.fixture
def every_round(monkeypatch):
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 0.0)


def test_off_zerogpu_the_gpu_functions_are_plain_generators():
    assert not compute.ZEROGPU and not hasattr(compute.run_job, "gpu_function")
    assert compute.on_zerogpu({"SPACES_ZERO_GPU": "true"}) and not compute.on_zerogpu({})
    stop = compute.Stop()
    stop._event.set()
    assert stop.is_set() and not pickle.loads(pickle.dumps(stop)).is_set()    # Stop does not cross: see compute.py


@pytest.mark.slow
def test_every_gpu_function_ran_in_a_forked_worker_with_pickled_arguments(zerogpu):
    assert zerogpu["zerogpu"]
    assert set(zerogpu["decorated"]) == gpu_functions() == {"run_job", "step_job", "lab_job", "sweep_job",
                                                            "measure_job"}
    calls = zerogpu["calls"]
    assert {c["name"] for c in calls} == gpu_functions()
    assert all(c["pid"] != zerogpu["main_pid"] and c["results"] >= 1 for c in calls)
    assert len({c["pid"] for c in calls}) == len(calls)                  # a fresh worker every call
    most = limits.current().max_run_seconds + compute.GPU_MARGIN_SECONDS
    assert all(isinstance(c["duration"], int) and compute.GPU_MARGIN_SECONDS < c["duration"] <= most for c in calls)
    run = calls[0]          # 12 tokens, three passes (live, timed, plain): a short run asks for a short GPU slot
    slot = compute.ZEROGPU_MIN_SECONDS + 3 * 12 * zerogpu["seconds_per_token"] + compute.GPU_MARGIN_SECONDS
    assert run["name"] == "run_job" and run["duration"] == math.ceil(slot) < most


@pytest.mark.slow
def test_models_load_at_start_up_on_the_main_thread_and_no_other_later(zerogpu):
    startup = zerogpu["startup"]
    assert startup["closed"] and startup["loaded"] == [TARGET] and not startup["background_thread"]
    assert startup["other_model"] == (False, "this server serves only the models it loaded at start-up")


@pytest.mark.slow
def test_a_run_comes_back_across_the_boundary_and_renders_as_in_process(zerogpu, playground_registry, every_round):
    state = SessionState()
    outputs = list(handlers.run(*run_args(), state))
    here = comparable(outputs[-1])
    there = zerogpu["run"]
    assert there == here and there["speedup"] and there["summary"]["matches_baseline"]
    record = state.active.record
    assert zerogpu["run_streamed"] == len(record.rounds)                 # one drawn update per round
    # the session, on the handler's side of the boundary, holds the run, its timing and its baseline
    assert zerogpu["session"] == {"history": [1], "rounds": len(record.rounds), "fragments": len(record.rounds),
                                  "timed": True, "plain": True, "baselines": 1}
    assert zerogpu["measure"] == comparable(list(handlers.measure_baseline(state))[-1])


@pytest.mark.slow
def test_stop_reaches_the_worker(zerogpu):
    (reason, tokens), = zerogpu["stop"]["history"]
    assert reason == "cancelled" and tokens < 10
    assert zerogpu["stop"]["results"] <= 5                 # Built, the rounds seen, at most one in flight


@pytest.mark.slow
def test_the_step_through_resumes_in_fresh_workers_and_follows_the_main_run(zerogpu, playground_registry,
                                                                             every_round):
    state = SessionState()
    list(handlers.run(*run_args(max_new_tokens=10, auto_baseline=False), state))
    assert zerogpu["step"]["finished"]
    assert zerogpu["step"]["rounds"] == [plain_round(ev) for ev in state.active.record.rounds]
    assert zerogpu["step_found"][0] == 2
    assert "No round with every draft accepted after round 2" in zerogpu["step_found"][1]


@pytest.mark.slow
def test_the_lab_and_the_sweeps_tab_come_back_as_in_process(zerogpu, playground_registry):
    from ui.classroom import lab, sweeps
    quiet = dict(progress=lambda *a, **k: None)
    lab_out = list(lab.run_lab("toy", "the cat", 100, 2, 2, 1.0, 0.9, 0, 0, True, "next", PROMPT, TARGET,
                               "layer-skip", True, "", 0, SessionState(), **quiet))[-1]
    assert "Done: 800 continuations" in zerogpu["lab"]["status"]         # 100 each: plain and seven rules
    assert [row[:-1] for row in zerogpu["lab"]["table"]] == [row[:-1] for row in lab_out[3].values.tolist()]
    sweep_out = list(sweeps.run_sweep("k", "1, 3", PROMPT, TARGET, "prompt-lookup", 4, 0, 1.0, 0, 8, 0, "exact",
                                      True, "", 0, SessionState(), 1, **quiet))[-1]
    assert zerogpu["sweep"]["status"].startswith("Done: 2 settings, 2 runs")
    counts = [*range(9), 14, 15]           # value, draft, k, T, acceptance, tokens/forward, theory, rounds, tokens...
    assert [[row[i] for i in counts] for row in zerogpu["sweep"]["table"]] == \
        [[row[i] for i in counts] for row in sweep_out[2].values.tolist()]


@pytest.mark.slow
def test_the_three_ways_tab_measures_in_the_worker(zerogpu):
    ways = zerogpu["three_ways"]
    assert ways["status"].startswith("Done") or "Done:" in ways["status"], ways["status"]
    by_arm = {row[1]: row for row in ways["table"]}
    exact = [row for row in ways["table"] if row[0] in ("none", "batching", "speculation", "combination")]
    assert len(exact) >= 4 and all(row[9] == "identical" for row in exact), ways["table"]
    assert any(label.startswith("quantization") for label in by_arm)      # measured, or "not available: <why>"


@pytest.mark.slow
def test_an_error_in_the_worker_comes_back_with_its_message(zerogpu):
    kind, message = zerogpu["error"]
    assert kind == "ValueError" and "is not loaded on this server" in message


def test_the_driver_runs_the_settings_the_in_process_tests_use():
    assert RUN["target"] == TARGET and RUN["temperature"] == 0 and RUN["auto_baseline"]
