"""Started by tests/test_zerogpu.py in a child process with SPACES_ZERO_GPU=1 and this folder first on the path,
so `import spaces` finds the stand-in beside this file. It starts the app as a ZeroGPU Space starts it (app.py,
models loaded at import), drives the handlers of every GPU function, and pickles what came back (plain values
only) to the file named on the command line. `comparable` is shared with the test: the parts of a run's final
view that do not depend on the clock."""
import os
import pickle
import re
import sys

TARGET = "smollm2-135m-instruct"
PROMPT = "Name three colours."
RUN = dict(prompt=PROMPT, target=TARGET, draft="layer-skip", k=3, temperature=0, top_p=1.0, top_k=0,
           max_new_tokens=12, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0, auto_baseline=True,
           show_spaces=False)
TIMING = ("draft_seconds", "verify_seconds", "round_seconds", "prefill_seconds")
SUMMARY_KEYS = ("run_id", "target", "draft", "draft_label", "k", "rounds", "new_tokens", "drafted", "accepted",
                "acceptance_rate", "tokens_per_forward", "judged_acceptance", "stop_reason", "tokens", "timed",
                "matches_baseline", "first_difference", "dtype")


def run_args(**changes):
    from ui.playground import handlers
    values = dict(RUN, **changes)
    return [values[name] for name in handlers.RUN_INPUTS]


def comparable(outputs: tuple) -> dict:
    """A run's final view without what depends on the clock (the status line's times, tokens per second)."""
    from ui.playground.handlers import RUN_OUTPUTS
    view = dict(zip(RUN_OUTPUTS, outputs))
    return {"tokens": re.sub(r'<div class="status-line">.*?</div>', "", view["tokens"]), "text": view["text"],
            "explain": view["explain"], "summary": {key: view["summary"][key] for key in SUMMARY_KEYS},
            "speedup": view["summary"]["speedup"] is not None}


def plain_round(event) -> dict:
    return {key: value for key, value in event.to_dict().items() if key not in TIMING}


def main(path: str) -> None:
    import spaces                                   # the stand-in: before torch, as app.py imports it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from conftest import FREE_VERIFY                 # also one intra-op thread and no GEMM tuning, as in the tests
    import spec_engine.drafters.eagle
    import spec_engine.drafters.lookup
    import spec_engine.drafters.sizing
    for module in (spec_engine.drafters.sizing, spec_engine.drafters.lookup, spec_engine.drafters.eagle):
        module.verify_costs = lambda model: FREE_VERIFY        # the same draft sizes as the in-process tests

    import app                                      # noqa: F401  start-up: limits, placement, models loaded
    from ui.classroom import lab, sweeps, tabs, three_ways
    from ui.playground import compute, handlers, registry
    from ui.playground.state import RunSettings, SessionState

    handlers.RENDER_INTERVAL = 0.0                  # one update per round, as the in-process tests draw them
    compute.ZEROGPU_SECONDS_PER_TOKEN = 1.0         # the stand-in's "GPU" is a busy CPU: slots sized for it
    out: dict = {"main_pid": os.getpid(), "zerogpu": compute.ZEROGPU, "seconds_per_token": 1.0}
    entry = registry.REGISTRY._loading[TARGET]
    out["startup"] = {"closed": registry.REGISTRY.closed, "loaded": registry.REGISTRY.loaded_names(),
                      "background_thread": entry.thread is not None,
                      "other_model": registry.availability("gemma-3-270m")}

    # The Run button with the speed measurement, then "Measure the speedup again".
    state = SessionState()
    outputs = list(handlers.run(*run_args(), state))
    record = state.active.record
    out["run"] = comparable(outputs[-1])
    summary = handlers.RUN_OUTPUTS.index("summary")
    out["run_streamed"] = sum(1 for o in outputs if isinstance(o[summary], dict) and o[summary].get("final") is False)
    out["session"] = {"history": [r.run_id for r in state.history], "rounds": len(record.rounds),
                      "fragments": len(record.fragments), "timed": record.timing is not None,
                      "plain": record.plain is not None, "baselines": len(state.baselines)}
    out["measure"] = comparable(list(handlers.measure_baseline(state))[-1])

    # Stop across the process boundary: the handler stops pulling; the worker closes the engine.
    stopped = SessionState()
    gen = handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=200, auto_baseline=False), stopped)
    for o in gen:
        if isinstance(o[summary], dict) and o[summary].get("rounds", 0) >= 2:
            break
    next(handlers.stop(stopped))
    list(gen)
    out["stop"] = {"history": [(r.stop_reason, len(r.tokens)) for r in stopped.history],
                   "results": spaces.CALLS[-1]["results"]}

    # The step-through: every Forward is a GPU call (a fresh worker each time here), then a finder.
    values = [dict(RUN, max_new_tokens=10)[name] for name in tabs.STEP_INPUTS]
    session = None
    for _ in range(2):
        session = list(tabs.step_forward(*values, session))[-1][0]
    found = list(tabs.step_find_accepted(*values, session))[-1]
    out["step_found"] = (session.stepper.position, found[1])
    for _ in range(20):
        if session.stepper.finished and not session.stepper.can_forward:
            break
        session = list(tabs.step_forward(*values, session))[-1][0]
    out["step"] = {"rounds": [plain_round(ev) for ev in session.stepper.events], "finished": session.stepper.finished}

    # The exactness lab (toy pair) and the Sweeps tab.
    lab_out = list(lab.run_lab("toy", "the cat", 100, 2, 2, 1.0, 0.9, 0, 0, True, "next", PROMPT, TARGET,
                               "layer-skip", True, "", 0, SessionState(), progress=lambda *a, **k: None))
    out["lab"] = {"status": lab_out[-1][0], "table": lab_out[-1][3].values.tolist()}
    sweep_out = list(sweeps.run_sweep("k", "1, 3", PROMPT, TARGET, "prompt-lookup", 4, 0, 1.0, 0, 8, 0, "exact",
                                      True, "", 0, SessionState(), 1, progress=lambda *a, **k: None))
    out["sweep"] = {"status": sweep_out[-1][0], "table": sweep_out[-1][2].values.tolist()}

    # The three-ways tab, shrunk (its GPU function runs every arm, the quantized copies made in the worker).
    three_ways.TOKENS, three_ways.BATCH, three_ways.REPEATS = 4, 2, 1
    ways_out = list(three_ways.measure(SessionState(), progress=lambda *a, **k: None))
    out["three_ways"] = {"status": ways_out[-1][0], "table": ways_out[-1][2].values.tolist()}

    # An error raised in the worker comes back with its message (the stand-in, like ZeroGPU, passes only gr.Error).
    job = compute.RunJob(RunSettings(target="gemma-3-270m", draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0,
                                     top_k=0, max_new_tokens=4, seed=0, rule="exact", chat=False, prompt="x"),
                         (1, 2, 3), 5.0)
    try:
        list(compute.run_job(job, compute.Stop()))
        out["error"] = None
    except Exception as exc:                        # noqa: BLE001 - the test reads which error came back
        out["error"] = (type(exc).__name__, str(exc))

    out["calls"] = list(spaces.CALLS)
    out["decorated"] = list(spaces.DECORATED)
    with open(path, "wb") as f:
        pickle.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
