"""A class at once, simulated: N students press Run at the same moment, each through its own gradio_client session,
against the app started here on 127.0.0.1 (never another host). Issue #36's figures: when the first, the median
and the last student had their whole run (the live run and its speed measurement), errors, how many saw their
place in line (Gradio's queue rank, or the "position P of N" the run's page shows while it waits at the engine's
gate), the server's RSS growth, the load average before and after.

    python bench/class_load.py --students 30                       # the defaults, identical requests
    python bench/class_load.py --students 30 --different-prompts   # one prompt per student

Bounded: at most MAX_STUDENTS students, and the whole test stops after --timeout seconds (unfinished runs are
cancelled and counted). The app runs with its own defaults (one run decoding at a time) unless --concurrency is
given. Before the clock starts, one warm-up run (another seed, so nothing is shared with the students) waits for
the default model to load and warm up. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_STUDENTS = 64
POSITION = re.compile(r"position (\d+) of (\d+)")


def start_app(port: int, concurrency: int | None, log: Path) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    if concurrency is not None:
        env["SPEC_CONCURRENCY"] = str(concurrency)
    return subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def stop_app(app: subprocess.Popen) -> None:
    """Ask the app to exit; kill it if it has not within 30 s."""
    app.terminate()
    try:
        app.wait(30)
    except subprocess.TimeoutExpired:
        app.kill()


def wait_ready(url: str, app: subprocess.Popen, timeout: float) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise RuntimeError(f"the app exited with {app.returncode} before serving")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the app did not answer within {timeout:g} s")


def run_values(client, **changes) -> list:
    """The /run endpoint's inputs at the page's defaults (the API's parameter defaults), with `changes`."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["parameters"]
    values = {p["parameter_name"]: p["parameter_default"] for p in info}
    values.update(changes)
    return [values[p["parameter_name"]] for p in info]


def student(index: int, url: str, values: list, go: threading.Event, began: list, out: dict, deadline: float):
    from gradio_client import Client
    record = {"index": index, "positions": [], "rank": None, "error": None, "done": None}
    out[index] = record
    try:
        client = Client(url, verbose=False)
        go.wait()
        job = client.submit(*values, api_name="/run")
        while not job.done():
            if time.monotonic() > deadline:
                job.cancel()
                record["error"] = "timed out"
                return
            status = job.status()
            if status.rank is not None and status.rank >= 0:
                record["rank"] = max(record["rank"] or 0, status.rank + 1)
            time.sleep(0.25)
        outputs = job.outputs()
        final = outputs[-1] if outputs else None
        for output in outputs:
            found = POSITION.search(str(output))
            if found:
                record["positions"].append(int(found.group(1)))
        job.result()                           # raises the run's error, if any
        record["done"] = time.monotonic() - began[0]
        summary = next((o for o in final if isinstance(o, dict) and "new_tokens" in o), None) if final else None
        record["tokens"] = summary.get("new_tokens") if summary else None
        record["speedup"] = summary.get("speedup") if summary else None
        record["shared"] = bool(summary and summary.get("labels"))
    except Exception as exc:                   # counted, not raised: the figures say how many failed
        record["error"] = f"{type(exc).__name__}: {exc}"[:300]


def rss(pid: int) -> int:
    import psutil
    process = psutil.Process(pid)
    return process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--different-prompts", action="store_true", help="one prompt per student")
    parser.add_argument("--port", type=int, default=7871)
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds for the whole class")
    parser.add_argument("--concurrency", type=int, help="SPEC_CONCURRENCY of the app (default: the app's own)")
    parser.add_argument("--log", type=Path, default=Path("/tmp/class_load_app.log"))
    args = parser.parse_args(argv)
    if not 1 <= args.students <= MAX_STUDENTS:
        parser.error(f"--students must be in [1, {MAX_STUDENTS}]")
    from gradio_client import Client
    url = f"http://127.0.0.1:{args.port}/"
    app = start_app(args.port, args.concurrency, args.log)
    try:
        wait_ready(url, app, 300)
        warm = Client(url, verbose=False)
        warm.predict(*run_values(warm, seed=12345), api_name="/run")     # loads and warms the default model
        default_prompt = run_values(warm)[0]          # "prompt" is the endpoint's first input
        rss_before, load_before = rss(app.pid), os.getloadavg()
        go, began, out, peak = threading.Event(), [0.0], {}, [0]
        deadline = time.monotonic() + args.timeout
        threads, values = [], run_values(warm)
        for i in range(args.students):
            prompt = f"{default_prompt} (Student {i + 1}.)" if args.different_prompts else default_prompt
            thread = threading.Thread(target=student, args=(i, url, [prompt] + values[1:], go, began, out, deadline),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(2)                                   # every client connected before the bell
        began[0] = time.monotonic()
        go.set()
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 30:
            peak[0] = max(peak[0], rss(app.pid))
            time.sleep(1)
        finished = sorted(r["done"] for r in out.values() if r["done"] is not None)
        errors = [r["error"] for r in out.values() if r["error"]]
        figures = {
            "students": args.students, "different_prompts": args.different_prompts,
            "finished": len(finished), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
            "first_s": round(finished[0], 1) if finished else None,
            "median_s": round(statistics.median(finished), 1) if finished else None,
            "last_s": round(finished[-1], 1) if finished else None,
            "saw_position": sum(1 for r in out.values() if r["rank"] or any(p for p in r["positions"])),
            "shared": sum(1 for r in out.values() if r.get("shared")),
            "rss_before_mb": round(rss_before / 2**20), "rss_peak_mb": round(peak[0] / 2**20),
            "rss_after_mb": round(rss(app.pid) / 2**20),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
        }
        figures["rss_growth_mb"] = figures["rss_after_mb"] - figures["rss_before_mb"]
        print(json.dumps(figures))
        return figures
    finally:
        stop_app(app)


if __name__ == "__main__":
    main()
