"""presets/scenarios.yaml validation and the draft catalogue (no model loaded)."""

import pytest

from ui import registry as reg
from ui.presets import SCENARIOS_PATH, load_presets

GOOD_SCENARIO = """
  - id: s1
    label: One
    prompt: p1
    draft: layer-skip
    k: 4
    temperature: 0
    top_p: 1.0
    top_k: 0
    max_new_tokens: 16
    rule: exact
    caption: A caption.
"""


def write(tmp_path, scenarios=GOOD_SCENARIO, prompts="  - {id: p1, label: P, text: hello}\n"):
    path = tmp_path / "scenarios.yaml"
    path.write_text(f"prompts:\n{prompts}scenarios:\n{scenarios}")
    return path


def test_shipped_presets_load_and_cover_the_classroom():
    presets = load_presets()
    assert len(presets.prompts) >= 4 and len(presets.scenarios) >= 6
    drafts = {s.draft for s in presets.scenarios}
    assert {"layer-skip", "early-exit", "prompt-lookup", "eagle", "eagle+lookup", "gemma-3-270m:naive-ids",
            "gemma-3-270m:cross-tokenizer"} <= drafts
    assert {s.rule for s in presets.scenarios} == {"exact", "topp_membership", "no_residual"}
    assert all(s.caption and s.prompt for s in presets.scenarios)
    assert any("Rewrite" in p.text for p in presets.prompts)          # prompt lookup's showcase


def test_a_good_file_loads(tmp_path):
    presets = load_presets(write(tmp_path))
    s = presets.scenario("s1")
    assert s.prompt == "hello" and s.k == 4 and s.temperature == 0.0 and s.seed == 0 and s.chat


@pytest.mark.parametrize("change, field, words", [
    ("k: 4", "k: 40", "field 'k' must be an integer in [1, 16]"),
    ("rule: exact", "rule: sloppy", "field 'rule' must be one of"),
    ("draft: layer-skip", "draft: nonsense-model:cross-tokenizer", "field 'draft' names an unknown model preset"),
    ("draft: layer-skip", "draft: layer-skip:3", "field 'draft'"),
    ("top_p: 1.0", "top_p: 1.5", "field 'top_p' must be in (0, 1]"),
    ("temperature: 0", "temperature: -1", "field 'temperature'"),
    ("prompt: p1", "prompt: nope", "field 'prompt' must be one of the prompt ids"),
    ("k: 4", "k: four", "field 'k' must be an integer, got 'four'"),
    ("caption: A caption.", "captions: typo", "unknown field 'captions'"),
])
def test_errors_name_the_file_entry_and_field(tmp_path, change, field, words):
    path = write(tmp_path, GOOD_SCENARIO.replace(change, field))
    with pytest.raises(ValueError) as err:
        load_presets(path)
    message = str(err.value)
    assert str(path) in message or "scenarios.yaml" in message
    assert "scenarios[0] ('s1')" in message and words in message


def test_missing_required_field_and_bad_yaml(tmp_path):
    with pytest.raises(ValueError, match=r"scenarios\[0\] \('s1'\): field 'k' is required"):
        load_presets(write(tmp_path, GOOD_SCENARIO.replace("    k: 4\n", "")))
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompts: [\n")
    with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
        load_presets(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_presets(tmp_path / "missing.yaml")


def test_duplicate_ids_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="duplicates an earlier entry"):
        load_presets(write(tmp_path, GOOD_SCENARIO + GOOD_SCENARIO))


def test_scenarios_path_is_in_the_repo():
    assert SCENARIOS_PATH.name == "scenarios.yaml" and SCENARIOS_PATH.parent.name == "presets"


def test_the_playground_starts_with_the_measured_best_draft():
    from spec_engine.eagle import recommended_settings
    settings = recommended_settings()
    draft, k = reg.default_draft("smollm2-135m-instruct")
    assert (draft, k) == (settings["draft"], settings["k"]) and reg.check_draft_value(draft) is None
    assert draft in [value for _, value in reg.draft_choices("smollm2-135m-instruct")]
    assert reg.default_draft("gemma-3-270m")[0] == "prompt-lookup"       # the head drafts for SmolLM2 only


def test_draft_catalogue_for_the_offline_default():
    values = [value for _, value in reg.draft_choices("smollm2-135m-instruct")]
    assert values[:3] == ["layer-skip", "early-exit", "prompt-lookup"]
    assert "gemma-3-270m:cross-tokenizer" in values and "gemma-3-270m:naive-ids" in values
    assert {"eagle", "eagle+lookup"} <= set(values)
    assert {"eagle", "eagle+lookup"}.isdisjoint(value for _, value in reg.draft_choices("gemma-3-270m"))   # head trained for SmolLM2
    for value in values:
        assert reg.check_draft_value(value) is None
    hub_pair = dict((v, label) for label, v in reg.draft_choices("smollm2-360m-instruct"))
    assert "smollm2-135m-instruct" in hub_pair and "Separate draft model" in hub_pair["smollm2-135m-instruct"]


def test_hub_targets_are_listed_with_a_reason_when_offline():
    choices = dict((value, label) for label, value in reg.target_choices())
    assert "smollm2-135m-instruct" in choices and "unavailable" not in choices["smollm2-135m-instruct"]
    ok, reason = reg.availability("qwen2.5-1.5b-instruct")
    if not ok:
        assert "unavailable" in choices["qwen2.5-1.5b-instruct"] and reason in choices["qwen2.5-1.5b-instruct"]


@pytest.mark.parametrize("spec, n, expected", [("3, 5-7", 30, [3, 5, 6, 7]), ("12", 30, [12]), (" ", 30, [])])
def test_parse_layers(spec, n, expected):
    assert reg.parse_layers(spec, n) == expected


@pytest.mark.parametrize("spec, words", [("0", "lie in [1, 29]"), ("30", "lie in [1, 29]"), ("9-3", "backwards"),
                                         ("x", "not a layer number"), ("1-29", "keep at least two")])
def test_parse_layers_errors(spec, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        reg.parse_layers(spec, 30)
