"""bench/lesson_memory.py drives each scenario through /run with what choosing it in the page sets (no app started)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import lesson_memory  # noqa: E402

from ui.layout import SCENARIO_CONTROLS  # noqa: E402
from ui.playground import callbacks  # noqa: E402
from ui.playground.presets import load_presets  # noqa: E402
from spec_engine.models import default_model_name  # noqa: E402


def test_each_scenario_runs_with_the_settings_the_scenario_list_sets():
    presets = load_presets()
    for scenario in presets.scenarios:
        shown = dict(zip(SCENARIO_CONTROLS, callbacks.apply_scenario(scenario.id, presets, default_model_name())))
        shown["draft"] = shown["draft"]["value"]            # a gr.update of the draft list: choices and value
        settings = lesson_memory.scenario_settings(scenario)
        expected = {name: value for name, value in shown.items()
                    if name != "target" or value != default_model_name()}      # the page's default target stays
        assert settings == expected, scenario.id
