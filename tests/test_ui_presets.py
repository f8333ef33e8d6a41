"""presets/scenarios.yaml validation and the draft catalogue (no model loaded)."""

import pytest

from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground.presets import SCENARIOS_PATH, load_presets

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
    assert {s.rule for s in presets.scenarios} == {"exact", "topp_membership", "no_residual", "strict", "typical"}
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
    from spec_engine.drafters.eagle import recommended_settings
    settings = recommended_settings()
    draft, k = drafts.default_draft("smollm2-135m-instruct")
    assert (draft, k) == (settings["draft"], settings["k"]) and drafts.check_draft_value(draft) is None
    assert draft in [value for _, value in drafts.draft_choices("smollm2-135m-instruct")]
    assert drafts.default_draft("gemma-3-270m")[0] == "prompt-lookup"       # the head drafts for SmolLM2 only


def test_draft_catalogue_for_the_offline_default():
    values = [value for _, value in drafts.draft_choices("smollm2-135m-instruct")]
    assert values[:5] == ["layer-skip", "layer-skip-tree", "early-exit", "prompt-lookup", "lookup-tree"]  # trees follow
    assert drafts.kind_by_key("layer-skip-tree").tree and drafts.kind_by_key("lookup-tree").tree
    assert "gemma-3-270m:cross-tokenizer" in values and "gemma-3-270m:naive-ids" in values
    assert {"eagle", "eagle+lookup"} <= set(values)
    # the head is trained for SmolLM2
    assert {"eagle", "eagle+lookup"}.isdisjoint(value for _, value in drafts.draft_choices("gemma-3-270m"))
    for value in values:
        assert drafts.check_draft_value(value) is None
    hub_pair = dict((v, label) for label, v in drafts.draft_choices("smollm2-360m-instruct"))
    assert "smollm2-135m-instruct" in hub_pair and "Separate draft model" in hub_pair["smollm2-135m-instruct"]


def test_hub_targets_are_listed_with_a_reason_when_offline():
    choices = dict((value, label) for label, value in reg.target_choices())
    assert "smollm2-135m-instruct" in choices and "unavailable" not in choices["smollm2-135m-instruct"]
    ok, reason = reg.availability("qwen2.5-1.5b-instruct")
    if not ok:
        assert "unavailable" in choices["qwen2.5-1.5b-instruct"] and reason in choices["qwen2.5-1.5b-instruct"]


@pytest.mark.parametrize("spec, n, expected", [("3, 5-7", 30, [3, 5, 6, 7]), ("12", 30, [12]), (" ", 30, [])])
def test_parse_layers(spec, n, expected):
    assert drafts.parse_layers(spec, n) == expected


@pytest.mark.parametrize("spec, words", [("0", "lie in [1, 29]"), ("30", "lie in [1, 29]"), ("9-3", "backwards"),
                                         ("x", "not a layer number"), ("1-29", "keep at least two")])
def test_parse_layers_errors(spec, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        drafts.parse_layers(spec, 30)


def scenario_text(n: int, **changes) -> str:
    """A scenario entry numbered n (ids s1, s2, ...), GOOD_SCENARIO's settings with `changes`."""
    fields = {"id": f"s{n}", "label": f'"{n}. Scenario"', "prompt": "p1", "draft": "layer-skip", "k": 4,
              "temperature": 0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 16, "rule": "exact",
              "caption": "A caption."} | changes
    return "  - " + "\n    ".join(f"{key}: {value}" for key, value in fields.items()) + "\n"


def test_a_compared_scenario_differs_in_one_setting(tmp_path):
    one_change = scenario_text(1) + scenario_text(2, k=8, caption="Compare with scenario 1, where only k differs.")
    presets = load_presets(write(tmp_path, one_change))
    assert presets.scenario("s2").k == 8
    two_changes = scenario_text(1) + scenario_text(2, k=8, temperature=0.7, caption="Compare with scenario 1.")
    with pytest.raises(ValueError, match=r"scenarios\[1\] \('s2'\): field 'caption' compares with scenario 1 "
                                         r"\('s1'\), but a comparison must change exactly one setting; they differ "
                                         r"in: k, temperature"):
        load_presets(write(tmp_path, two_changes))
    identical = scenario_text(1) + scenario_text(2, caption="Scenarios 1 and 3 differ.") + scenario_text(3, k=2)
    with pytest.raises(ValueError, match="differ in: none: the runs are identical"):
        load_presets(write(tmp_path, identical))
    with pytest.raises(ValueError, match="names scenario 7, which is not another scenario"):
        load_presets(write(tmp_path, scenario_text(1, caption="See scenario 7.")))


def test_a_numbered_label_carries_its_position(tmp_path):
    with pytest.raises(ValueError, match=r"scenarios\[1\] \('s2'\): field 'label' starts with number 3"):
        load_presets(write(tmp_path, scenario_text(1) + scenario_text(2, label='"3. Misnumbered"')))


def test_shipped_comparisons_change_one_thing():
    from ui.playground.presets import differing_settings, mentioned_scenarios
    scenarios = load_presets().scenarios
    by_id = {s.id: s for s in scenarios}
    pairs = {("wrong-topp", "sampling-exact"): ["rule"], ("wrong-no-residual", "sampling-exact"): ["rule"],
             ("large-k", "greedy-layer-skip"): ["k"], ("cross-tokenizer", "naive-ids"): ["draft"],
             ("eagle-head", "early-exit-lesson"): ["draft"], ("eagle-head", "greedy-layer-skip"): ["draft"]}
    for (a, b), fields in pairs.items():
        assert differing_settings(by_id[a], by_id[b]) == fields, (a, b)
    named = {(s.id, scenarios[n - 1].id) for s in scenarios for n in mentioned_scenarios(s.caption)}
    assert set(pairs) <= named                                     # each caption names the scenario it differs from
    assert mentioned_scenarios("Scenarios 6 and 7 change only the rule; scenario 2's head") == [6, 7, 2]


def test_captions_say_what_to_look_for_and_how_fast_it_is_here():
    for s in load_presets().scenarios:
        caption = s.caption.lower()
        assert "look for:" in caption, s.id
        assert "slower than plain decoding" in caption or "faster than plain decoding" in caption, s.id
        assert "history tab" not in caption, s.id
    slow = ("layer-skip", "early-exit", "gemma-3-270m:", "gpt2:")
    for s in load_presets().scenarios:      # self-drafts and the mismatch drafts (not much cheaper than the target)
        if s.draft.startswith(slow):
            assert "slower than plain decoding" in s.caption.lower(), s.id
        if s.draft.startswith(("gemma-3-270m:", "gpt2:")):
            assert "not much" in s.caption and ("cheaper" in s.caption or "smaller" in s.caption), s.id


@pytest.fixture(scope="module")
def demo():
    from ui.layout import build_demo
    return build_demo(preload=False)


def test_tabs_named_in_captions_exist(demo):
    import re

    import gradio as gr
    tabs = {block.label for block in demo.blocks.values() if isinstance(block, gr.Tab)}
    assert "Compare runs" in tabs
    for s in load_presets().scenarios:
        for name in re.findall(r'"([^"]+)" tab', s.caption):
            assert name in tabs, (s.id, name)


def test_choosing_a_scenario_runs_it_like_the_run_button(demo):
    from ui.playground import handlers
    handler = lambda fn: getattr(fn.fn, "__wrapped__", fn.fn)       # noqa: E731  (handlers.renewing wraps runs)
    runs = {fn.api_name: (fn_id, fn) for fn_id, fn in demo.fns.items() if handler(fn) is handlers.run}
    button = runs.pop("run")[1]
    (chained_id, chained), = runs.values()
    scenario_id = demo.spec_components["scenario"]._id
    setter = demo.fns[chained.trigger_after]
    assert setter.targets == [(scenario_id, "input")] and chained.trigger_only_on_success
    assert [b._id for b in chained.inputs] == [b._id for b in button.inputs]
    assert [b._id for b in chained.outputs] == [b._id for b in button.outputs]
    assert (chained.validator, chained.concurrency_id, chained.preprocess) == (button.validator, "run", False)
    assert button.concurrency_id == "run"            # runs wait at the engine's gate in their own group (coalesce.py)
    assert chained.api_visibility == "private"
    stop = next(fn for fn in demo.fns.values() if handler(fn) is handlers.stop)
    cancel = next(fn for fn in demo.fns.values() if fn.is_cancel_function and fn.targets == stop.targets)
    assert chained_id in cancel.cancels                                  # Stop ends a scenario's run too


def test_presentation_mode_is_a_browser_side_toggle(demo):
    from ui.views import render
    checkbox = demo.spec_components["present"]
    toggles = [fn for fn in demo.fns.values() if fn.targets == [(checkbox._id, "change")]]
    assert len(toggles) == 1 and toggles[0].fn is None and toggles[0].js == render.PRESENTATION_JS
    assert "spec-present" in render.PRESENTATION_JS and "line-through" in render.PRESENTATION_CSS
