"""A `?scenario=<id>` link opens that scenario's every setting (ui/playground/share.py), whatever the page showed
before: a setting the link does not restore would silently run another experiment (a strict or typical scenario
opening as "exact"). No model is loaded."""
import pytest

import spec_engine as se
from ui.playground import share
from ui.playground.presets import MATCHED_FIELDS, load_presets
from ui.playground.state import RunSettings

DEFAULT_TARGET = "smollm2-135m-instruct"
PRESETS = load_presets()


def page_unlike(scenario) -> dict:
    """Page values that differ from `scenario` in every field a scenario sets."""
    return dict(prompt=scenario.prompt + " (edited)", target="gemma-3-270m" if (scenario.target or DEFAULT_TARGET)
                != "gemma-3-270m" else DEFAULT_TARGET,
                draft="prompt-lookup:6:2" if scenario.draft != "prompt-lookup:6:2" else "layer-skip",
                k=scenario.k % 8 + 1, temperature=0.35 if scenario.temperature != 0.35 else 0.45,
                top_p=0.55 if scenario.top_p != 0.55 else 0.65, top_k=scenario.top_k + 3,
                max_new_tokens=scenario.max_new_tokens + 5, seed=scenario.seed + 11,
                rule=next(r for r in se.RULES if r != scenario.rule), chat=not scenario.chat, skip_layers="",
                exit_after=0)


@pytest.mark.parametrize("scenario", PRESETS.scenarios, ids=[s.id for s in PRESETS.scenarios])
def test_a_scenario_link_restores_every_setting_of_its_scenario(scenario):
    start = page_unlike(scenario)
    clean, found = share.read_link({"scenario": scenario.id}, start, PRESETS, DEFAULT_TARGET)
    assert found == scenario.id
    for field in MATCHED_FIELDS:
        assert clean[field] == getattr(scenario, field), field
        assert clean[field] != start[field], field
    assert clean["target"] == (scenario.target or DEFAULT_TARGET) != start["target"]
    assert share.read_link(share_params(clean, scenario.id), start, PRESETS, DEFAULT_TARGET) == (clean, scenario.id)


def share_params(clean: dict, scenario: str) -> dict:
    """The pairs the browser hands back for the link the Share button makes of `clean`."""
    from urllib.parse import parse_qsl
    return dict(parse_qsl(share.link_query(RunSettings(**clean), scenario)[1:], keep_blank_values=True))


def test_every_rule_in_the_scenarios_is_restored_not_only_exact():
    assert {s.rule for s in PRESETS.scenarios} - {"exact"}, "the presets have no scenario with another rule"
