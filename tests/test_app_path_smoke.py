"""The app's path on a random-weight model of SmolLM2-135M's shape (bench/app_path_smoke.py), on the CPU, as the GPU
check runs it on CUDA: every same-tokenizer draft the Run tab offers, plus a separate draft model, through the
handlers with the speed measurement, "measure again", and the step-through. Greedy runs must reproduce plain decoding.

It runs in a child process as a GPU machine has it: the model packages cannot be imported (the finder of
test_space_offline.py), the Hub is off and its cache empty, and SmolLM2's tokenizer comes from a saved directory
(SPEC_TOKENIZER_DIR, as bench/gpu_prepare.sh makes it), so the registered model must count as available because it
is in memory, not because a package is installed.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_space_offline import SITECUSTOMIZE, model_modules

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_every_draft_runs_through_the_app_path_on_a_random_smollm2_shape(smollm2, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    smollm2.tokenizer.save_pretrained(tokenizer_dir)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(hidden=sorted(model_modules())))
    (tmp_path / "refused.txt").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), SPACE_SIM_REFUSED=str(tmp_path / "refused.txt"),
               HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", SPEC_TOKENIZER_DIR=str(tokenizer_dir),
               SPEC_ENGINE_CACHE=str(tmp_path / "engine-cache"))
    done = subprocess.run([sys.executable, "bench/app_path_smoke.py", "--device", "cpu", "--tokens", "8"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    checks = {line["check"]: line for line in lines if "check" in line}
    failed = [f"{name}: {line['error']}" for name, line in checks.items() if not line["ok"]]
    assert done.returncode == 0 and not failed, "\n".join(failed) or done.stderr[-3000:]
    assert lines[0]["model"].startswith("random weights") and lines[0]["dtype"] == "torch.float32"
    assert checks["availability"]["reason"] == "loaded"
    expected = {"layer-skip", "early-exit", "prompt-lookup", "eagle", "eagle+lookup", "smollm2-135m-instruct"}
    assert {f"run {draft} greedy" for draft in expected} <= set(checks)
    assert all(checks[f"run {d} greedy"]["matches_baseline"] is True for d in expected)
    assert checks["run smollm2-135m-instruct greedy"]["acceptance_rate"] == 1.0      # itself as its draft
    assert checks["step-through eagle+lookup"]["rounds"] > 0
    assert (tmp_path / "refused.txt").read_text()          # a model package was looked for, and refused


def test_gpu_check_static_step_dry_runs_on_the_cpu(smollm2, tmp_path):
    """bench/gpu_check.sh's static step (bench/gpu_static.py) as a lent GPU runs it, on the CPU with tiny settings:
    the captured path is its CPU fallback (the fixed-shape forward, eager), so this checks the plumbing, and that in
    fp32 both paths give the same tokens on the SmolLM2-135M shape."""
    tokenizer_dir = tmp_path / "tokenizer"
    smollm2.tokenizer.save_pretrained(tokenizer_dir)
    out = tmp_path / "gpu"
    env = {**os.environ, "DEVICE": "cpu", "STEPS": "static", "PY": sys.executable, "OUT": str(out),
           "SPEC_TOKENIZER_DIR": str(tokenizer_dir), "STATIC_MODELS": "random-smollm2-135m:float32",
           "STATIC_TOKENS": "4", "STATIC_REPEATS": "1", "STATIC_ROWS": "1 2", "STATIC_CONTEXT": "16",
           "STATIC_SECONDS": "900"}
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=960)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (model,) = json.loads((out / "static.json").read_text())["models"]
    assert model["model"] == "random-smollm2-135m" and model["same_tokens"] is True
    assert [v["rows"] for v in model["verify"]] == [1, 2]
    assert set(model["drafts"]) == {"prompt-lookup", "eagle (random head)"}
    assert "| captured |" in (out / "static.txt").read_text()
