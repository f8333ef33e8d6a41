"""A teacher's whole lesson, and the app's memory through it (issue #36, "memory stays bounded"): the app started
here on 127.0.0.1 (a free port), one gradio_client session (the teacher's tab) runs every scenario of
presets/scenarios.yaml through /run with the scenario's settings (as choosing it in the Scenario list does, the
tokenizer-mismatch scenarios included), the "Tokenizer mismatch" tab (/mismatch), the exactness lab on the toy pair
and on the main panel's model (/lab_exactness), a sweep (/lab_sweep), "Sweep k" once (/sweep_k) and the
step-through (/step_reset, then /step a few times). Then it waits out the idle unload (SPEC_IDLE_UNLOAD of the app,
--idle-unload here) and prints one JSON line: the app's RSS after start and warm-up, its peak during the lesson,
right after it and after the idle wait; the load average; the steps that failed, with their error text.

    python bench/lesson_memory.py                      # SPEC_IDLE_UNLOAD=30, the lesson bounded by 1800 s
    python bench/lesson_memory.py --idle-unload 60 --timeout 900

Bounded: the lesson stops after --timeout seconds (the step under way is cancelled, the rest are counted as not
run), the idle wait after --idle-unload + --idle-grace seconds. Helpers from bench/class_load.py.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from class_load import ROOT, rss, run_values, start_app, stop_app, wait_ready  # noqa: E402

sys.path.insert(0, str(ROOT))

STEPS_FORWARD = 3       # /step presses after /step_reset


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def endpoint_values(client, api_name: str, **changes) -> list:
    """An endpoint's inputs at their API defaults (the page's), with `changes`; KeyError names an unknown one."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"][api_name]["parameters"]
    values = {p["parameter_name"]: p["parameter_default"] for p in info}
    unknown = set(changes) - set(values)
    if unknown:
        raise KeyError(f"{api_name} has no parameter(s) {sorted(unknown)}")
    values.update(changes)
    return [values[p["parameter_name"]] for p in info]


def scenario_settings(scenario) -> dict:
    """What choosing a scenario sets (ui.playground.callbacks.apply_scenario), as /run's parameter names."""
    settings = {"prompt": scenario.prompt, "draft": scenario.draft, "k": scenario.k,
                "temperature": scenario.temperature, "top_p": scenario.top_p, "top_k": scenario.top_k,
                "max_new_tokens": scenario.max_new_tokens, "seed": scenario.seed, "rule": scenario.rule,
                "chat": scenario.chat}
    if scenario.target:
        settings["target"] = scenario.target
    return settings


def lesson(client) -> list[tuple[str, str, list]]:
    """(step name, api_name, inputs) of the whole lesson, in a teacher's order."""
    from ui.playground.presets import load_presets
    presets = load_presets()
    steps = [(f"scenario {s.id}", "/run", run_values(client, **scenario_settings(s))) for s in presets.scenarios]
    first = scenario_settings(presets.scenarios[0])
    steps.append(("tokenizer-mismatch tab", "/mismatch",
                  endpoint_values(client, "/mismatch", prompt=first["prompt"], max_new_tokens=32)))
    steps.append(("exactness lab, toy pair", "/lab_exactness", endpoint_values(client, "/lab_exactness")))
    steps.append(("exactness lab, main panel's model", "/lab_exactness",
                  endpoint_values(client, "/lab_exactness", model="current", n=50, depth=1, wrong_rules=False,
                                  prompt=first["prompt"], draft="layer-skip", temperature=1.0, top_p=1.0)))
    steps.append(("sweep over k", "/lab_sweep", endpoint_values(client, "/lab_sweep", values="1, 2, 4",
                                                                  prompt=first["prompt"], max_new_tokens=24,
                                                                  repeats=1)))
    steps.append(("Sweep k", "/sweep_k", run_values(client, prompt=first["prompt"], max_new_tokens=24)))
    step_names = {p["parameter_name"] for p in client.view_api(return_format="dict", print_info=False)
                  ["named_endpoints"]["/step_reset"]["parameters"]}
    step_inputs = endpoint_values(client, "/step_reset", **{n: v for n, v in first.items() if n in step_names})
    steps.append(("step-through reset", "/step_reset", step_inputs))
    steps += [(f"step-through forward {i + 1}", "/step", step_inputs) for i in range(STEPS_FORWARD)]
    return steps


def run_step(client, api_name: str, inputs: list, deadline: float) -> str | None:
    """None when the step ended without an error, else the error text (or "timed out")."""
    job = client.submit(*inputs, api_name=api_name)
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel()
            return "timed out (the lesson's --timeout)"
        time.sleep(0.25)
    try:
        job.result()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:400]
    return None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-unload", type=float, default=30.0, help="the app's SPEC_IDLE_UNLOAD, seconds")
    parser.add_argument("--idle-grace", type=float, default=30.0,
                        help="seconds waited beyond --idle-unload (the reaper looks every idle/4 s)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole lesson")
    parser.add_argument("--port", type=int, help="default: a free port")
    parser.add_argument("--log", type=Path, default=Path("/tmp/lesson_memory_app.log"))
    args = parser.parse_args(argv)
    from gradio_client import Client
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}/"
    os.environ["SPEC_IDLE_UNLOAD"] = f"{args.idle_unload:g}"       # start_app passes os.environ to the app
    app = start_app(port, None, args.log)
    peak, sampling = [0], threading.Event()

    def sample():
        while not sampling.wait(0.5):
            try:
                peak[0] = max(peak[0], rss(app.pid))
            except Exception:
                return

    try:
        wait_ready(url, app, 600)
        client = Client(url, verbose=False)
        client.predict(*run_values(client, seed=12345), api_name="/run")     # loads and warms the default model
        rss_start, load_start = rss(app.pid), os.getloadavg()
        steps = lesson(client)
        peak[0] = rss_start
        threading.Thread(target=sample, daemon=True).start()
        began = time.monotonic()
        deadline = began + args.timeout
        failed, done, seconds = [], 0, {}
        for name, api_name, inputs in steps:
            if time.monotonic() > deadline:
                failed.append({"step": name, "error": "not run (the lesson's --timeout)"})
                continue
            started = time.monotonic()
            error = run_step(client, api_name, inputs, deadline)
            seconds[name] = round(time.monotonic() - started, 1)
            if error:
                failed.append({"step": name, "error": error})
            else:
                done += 1
            print(f"{name}: {'ok' if not error else error[:120]} ({seconds[name]} s, "
                  f"RSS {rss(app.pid) / 2**20:.0f} MB)", file=sys.stderr, flush=True)
        lesson_s = time.monotonic() - began
        rss_after, load_after = rss(app.pid), os.getloadavg()
        time.sleep(args.idle_unload + args.idle_grace)
        sampling.set()
        figures = {
            "steps": len(steps), "steps_ok": done, "failed": failed, "lesson_s": round(lesson_s),
            "idle_unload_s": args.idle_unload, "idle_wait_s": args.idle_unload + args.idle_grace,
            "rss_start_mb": round(rss_start / 2**20), "rss_peak_mb": round(peak[0] / 2**20),
            "rss_after_lesson_mb": round(rss_after / 2**20), "rss_after_idle_mb": round(rss(app.pid) / 2**20),
            "load_start": [round(x, 2) for x in load_start], "load_after_lesson": [round(x, 2) for x in load_after],
            "load_end": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(), "step_seconds": seconds,
        }
        print(json.dumps(figures))
        return figures
    finally:
        sampling.set()
        stop_app(app)


if __name__ == "__main__":
    main()
