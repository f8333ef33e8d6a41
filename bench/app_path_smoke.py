"""The app's own path on any device, without the packaged model: a random-weight model of SmolLM2-135M's shape (with
SmolLM2's tokenizer) is registered under the default preset's name, then every draft the Run tab offers for it runs
through the Gradio handlers exactly as a click does: the registry, the preset and draft lists, the run with the
speed measurement (the baseline), "measure again", and the step-through. Greedy runs must reproduce plain decoding
(the "same text as plain" chip), so a device or dtype bug that changes a token fails here.

    python bench/app_path_smoke.py --device cpu --tokens 12        # tests/test_app_path_smoke.py runs this
    python bench/app_path_smoke.py --device cuda                   # bench/gpu_check.sh runs this

Random weights make the text noise, but every code path a visitor reaches runs with real shapes. Run it in its own
process: it replaces the default preset's model in the app's registry. Prints one JSON line per check and exits 1
if any failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = "smollm2-135m-instruct"
STRICT_GREEDY = True          # main() sets it from the model's dtype
PROMPT = "List the planets of the solar system, then list them again."


def register_random_target(device: str, dtype: str | None):
    """The random-weight SmolLM2-135M shape, under the default preset's name, in the app's registry."""
    from spec_engine.bench import random_target
    from ui.playground import registry as reg
    loaded = random_target("random-smollm2-135m", device=device, dtype=dtype)
    reg.REGISTRY.put(dataclasses.replace(loaded, name=TARGET))
    return loaded


def run_values(draft: str, tokens: int, temperature: float = 0.0, auto_baseline: bool = True) -> dict:
    return dict(prompt=PROMPT, target=TARGET, draft=draft, k=4, temperature=temperature, top_p=0.9, top_k=0,
                max_new_tokens=tokens, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0,
                auto_baseline=auto_baseline, show_spaces=False)


def check_run(draft: str, tokens: int, temperature: float) -> dict:
    """One Run click to the end, with the automatic speed measurement; the final summary's numbers."""
    from ui.playground import handlers
    from ui.playground.state import SessionState
    values, state = run_values(draft, tokens, temperature), SessionState()
    outputs = list(handlers.run(*[values[name] for name in handlers.RUN_INPUTS], state))
    final = outputs[-1][handlers.RUN_OUTPUTS.index("summary")]
    assert isinstance(final, dict) and final.get("final"), f"the run ended without a final summary: {final!r}"
    assert final["rounds"] > 0 and final["new_tokens"] > 0, final
    assert final["speedup"] is not None and final["baseline_tokens_per_second"] > 0, "no speed measurement"
    if temperature == 0 and STRICT_GREEDY:               # fp32; bf16's near-ties may differ (the app says so)
        assert final["matches_baseline"] is True, "greedy run differs from plain decoding"
    again = list(handlers.measure_baseline(state))[-1][handlers.RUN_OUTPUTS.index("summary")]
    assert again["speedup"] is not None, "measure again gave no speedup"
    return {k: final[k] for k in ("rounds", "new_tokens", "acceptance_rate", "tokens_per_forward", "speedup",
                                  "matches_baseline")}


def check_steps(draft: str, tokens: int) -> dict:
    """The step-through: Forward to the end, one Back; its rounds are the ones the Run tab's handler computes."""
    from ui.classroom import tabs as classroom
    from ui.playground import handlers
    from spec_engine.drafters.sizing import CostCurve
    from ui.playground.state import SessionState
    values = run_values(draft, tokens, auto_baseline=False)
    step_values = [values[name] for name in classroom.STEP_INPUTS]
    session = None
    # Both decoders size their drafts by the verify-cost curve as it stands when each is built; the timed forwards
    # between them would correct it (sizing.CostCurve), and the two could draft different lengths by timing alone.
    observe, CostCurve.observe = CostCurve.observe, lambda self, rows, seconds: None
    try:
        for _ in range(tokens + 2):
            session = list(classroom.step_forward(*step_values, session))[-1][0]
            if session.stepper.finished:
                break
        assert session.stepper.finished, "the step-through did not reach the end of the run"
        classroom.step_back(session)
        main = SessionState()
        list(handlers.run(*[values[name] for name in handlers.RUN_INPUTS], main))
    finally:
        CostCurve.observe = observe
    stepped = [(e.drafted, e.accepted, e.emitted) for e in session.stepper.events]
    ran = [(e.drafted, e.accepted, e.emitted) for e in main.active.record.rounds]
    assert stepped == ran, "the step-through's rounds differ from the run's"
    return {"rounds": len(stepped)}


def check_available() -> dict:
    """A model in the registry is available, whether or not its package is installed (a GPU machine has none)."""
    from ui.playground import registry as reg
    ok, reason = reg.availability(TARGET)
    assert ok, f"the registered model is unavailable: {reason}"
    return {"reason": reason}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: the app's rule (fp32 for this size)")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args(argv)
    import torch
    from ui.playground import handlers
    from ui.playground import drafts
    torch.set_num_threads(min(2, torch.get_num_threads()))
    handlers.SETTLE_SECONDS = 0.0                        # no browser draws here
    global STRICT_GREEDY
    loaded = register_random_target(args.device, args.dtype)
    STRICT_GREEDY = loaded.dtype == torch.float32
    print(json.dumps({"model": loaded.source, "device": str(loaded.device), "dtype": str(loaded.dtype)}), flush=True)
    drafts = [value for label, value in drafts.draft_choices(TARGET) if ":" not in value]   # same tokenizer only
    drafts.append(TARGET)                                # a separate draft model (itself: every draft accepted)
    checks = [("availability", check_available)]
    for draft in drafts:
        checks.append((f"run {draft} greedy", lambda d=draft: check_run(d, args.tokens, 0.0)))
    checks.append(("run prompt-lookup sampled", lambda: check_run("prompt-lookup", args.tokens, 0.7)))
    checks.append(("step-through eagle+lookup", lambda: check_steps("eagle+lookup", min(args.tokens, 12))))
    checks.append(("step-through layer-skip-tree", lambda: check_steps("layer-skip-tree", min(args.tokens, 12))))
    failed = 0
    for name, check in checks:
        start = time.perf_counter()
        try:
            result, ok_ = check(), True
        except Exception as exc:                         # report every check, then fail
            result, ok_ = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)}, False
            failed += 1
        print(json.dumps({"check": name, "ok": ok_, "seconds": round(time.perf_counter() - start, 2), **result}),
              flush=True)
    print(json.dumps({"checks": len(checks), "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
