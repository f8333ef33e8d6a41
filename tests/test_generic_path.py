"""The exactness suites again with the speed layer off (SPEC_ENGINE_ACCEL=0): the core's device-generic code, the
code a GPU runs, forced on this CPU. Run in a child pytest because the layer is chosen when spec_engine is imported.

Skipped inside that child (and wherever the whole suite already runs with SPEC_ENGINE_ACCEL=0): one pass each way.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The exactness core, once more on the device-generic code (the other suites run once, with the layer the
# environment selects): the rules enumerated, the chi-square tests (the trees' included), the engine's KV invariants
# and identities on tiny models, and greedy identity against stock Hugging Face generate() on SmolLM2. Two children
# run at once, each on one core (the suite runs torch on one thread, conftest.py): the pass is single-threaded
# Python over tiny models, so one child left the second core idle (343 s alone on a busy host). The halves are
# balanced by their measured times (the chi-square tests dominate both).
EXACTNESS_SUITES = [
    [
        "tests/test_tree_statistical.py",      # chi-square for every tree drafter, siblings drawn as labelled
        "tests/test_eagle.py::test_sampled_output_follows_the_target_distribution",   # chi-square, EAGLE drafts
        "tests/test_verify_enumeration.py",    # the rule, reference and engine, enumerated
        "tests/test_tree_rule.py",             # the tree rule, enumerated; verify_tree replayed into it
        "tests/test_engine.py",                # KV invariants every round, forced outcomes, greedy identity (tiny)
        "tests/test_batch.py",                 # batched rounds: identity alone vs in a batch, chi-square, seeds
    ],
    [
        "tests/test_statistical.py",           # chi-square for every drafter kind and rule
        "tests/test_hf_stock_identity.py",     # greedy identity against stock Hugging Face generate()
    ],
]

# Left to the parent's pass: the power checks, which show that the chi-square test rejects a wrong rule (its
# statistics, not the code path; the wrong rules run through the same forwards as the right ones, which stay here).
WITHOUT_POWER_CHECKS = "not test_the_same_test_rejects and not test_the_wrong_tree_rule_is_rejected"

pytestmark = pytest.mark.slow


@pytest.mark.skipif(os.environ.get("SPEC_ENGINE_ACCEL") == "0", reason="this run already has the speed layer off")
def test_the_exactness_suites_pass_with_the_speed_layer_off(request, tmp_path):
    env = {**os.environ, "SPEC_ENGINE_ACCEL": "0"}
    tier = ["--full"] if request.config.getoption("--full") else []     # the children run the parent's tier
    children = []
    for i, suites in enumerate(EXACTNESS_SUITES):
        out, err = (open(tmp_path / f"child{i}.{name}", "w+") for name in ("out", "err"))
        children.append((subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                           "-n", "0", *tier, "-k", WITHOUT_POWER_CHECKS, *suites],
                                          cwd=ROOT, env=env, stdout=out, stderr=err, text=True), out, err))
    try:
        for child, out, err in children:
            child.wait(timeout=3000)
            out.seek(0), err.seek(0)
            stdout, stderr = out.read(), err.read()
            summary = stdout.strip().splitlines()[-1] if stdout.strip() else ""
            assert child.returncode == 0, f"with SPEC_ENGINE_ACCEL=0: {summary}\n{stdout[-6000:]}\n{stderr[-2000:]}"
            assert " passed" in summary and " failed" not in summary, summary
    finally:
        for child, out, err in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            out.close(), err.close()


def test_the_child_really_runs_without_the_speed_layer():
    """The switch works: a fresh interpreter with SPEC_ENGINE_ACCEL=0 has no speed layer, and its loaded models run
    transformers' own modules (no lean forward, no packed products, no engine attention)."""
    code = ("import spec_engine as se, torch\n"
            "from tiny import tiny_llama\n"
            "m = tiny_llama()\n"
            "from spec_engine.core.cache import new_cache\n"
            "print(se.speed_layer(), m.config._attn_implementation, hasattr(m, '_spec_engine_lean'),\n"
            "      sorted({type(x).__name__ for x in m.modules() if 'Linear' in type(x).__name__}),\n"
            "      sorted({type(l).__name__ for l in new_cache(m).layers}))\n")
    env = {**os.environ, "SPEC_ENGINE_ACCEL": "0", "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["off", "sdpa", "False", "['Linear']", "['DynamicLayer']"], out
    env.pop("SPEC_ENGINE_ACCEL")
    on = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300, check=True).stdout.split()
    assert on[:3] == ["cpu", "spec_engine_sdpa", "True"] and on[-1] == "['GrowingLayer']", on
