"""Share links (ui/playground/share.py): a link carries a whole run; a hostile link is refused like a typed value.

No model is loaded: the checks a link goes through are the validator's (validate.check_fields), which need only
the presets and, for the prompt's length in tokens, a model that is already loaded (none here).
"""
from urllib.parse import parse_qsl, urlsplit

import pytest

import spec_engine as se

from ui.playground import share, validate
from ui.playground.presets import load_presets
from ui.playground.state import RunSettings

TARGET = "smollm2-135m-instruct"
HOSTILE_PROMPT = 'Repeat: <img src=x onerror="alert(1)"> & a=b?c#d\n  two spaces, "quotes", 100% – ünï'
START = dict(prompt="Start prompt", target=TARGET, draft="layer-skip", k=4, temperature=0.0, top_p=1.0, top_k=0,
             max_new_tokens=64, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0)


def settings(**change) -> RunSettings:
    values = dict(START, prompt=HOSTILE_PROMPT, draft="prompt-lookup:6:2", k=7, temperature=0.7, top_p=0.85,
                  top_k=40, max_new_tokens=33, seed=12345678901, rule="no_residual", chat=False)
    values.update(change)
    return RunSettings(**values)


def params_of(query: str) -> dict:
    """What the browser sends and Starlette hands to gr.Request.query_params: the decoded pairs."""
    assert query.startswith("?")
    return dict(parse_qsl(urlsplit(query).query, keep_blank_values=True))


@pytest.fixture(scope="module")
def presets():
    return load_presets()


def read(params, presets):
    return share.read_link(params, START, presets, TARGET)


def test_a_link_carries_every_setting_and_reads_back_the_same(presets):
    original = settings()
    query = share.link_query(original)
    assert " " not in query and "\n" not in query and "<" not in query     # percent-encoded
    clean, scenario = read(params_of(query), presets)
    assert RunSettings(**clean) == original and scenario is None


def test_every_verification_rule_travels_in_a_link(presets):
    for rule in se.RULES:
        clean, _ = read(params_of(share.link_query(settings(rule=rule))), presets)
        assert clean["rule"] == rule


def test_layer_options_travel_only_when_set(presets):
    assert "skip_layers" not in share.link_query(settings()) and "exit_after" not in share.link_query(settings())
    original = settings(draft="early-exit", exit_after=9, skip_layers="3, 5-7")
    clean, _ = read(params_of(share.link_query(original)), presets)
    assert RunSettings(**clean) == original


def test_a_scenario_link_starts_from_the_scenario_and_the_link_overrides_it(presets):
    scenario = presets.scenarios[0]
    clean, found = read({"scenario": scenario.id, "k": "2"}, presets)
    assert found == scenario.id
    assert (clean["prompt"], clean["draft"], clean["k"], clean["temperature"]) == (
        scenario.prompt, scenario.draft, 2, scenario.temperature)
    assert share.link_query(RunSettings(**clean), scenario.id).endswith(f"&scenario={scenario.id}")


def test_a_page_without_link_settings_is_left_alone(presets):
    assert read({}, presets) is None
    assert read({"__theme": "dark", "deep_link": "abc"}, presets) is None      # Gradio's own parameters


def test_missing_fields_keep_the_page_values(presets):
    clean, _ = read({"k": "3", "chat": "false"}, presets)
    assert clean == dict(START, k=3, chat=False)


HOSTILE_LINKS = [
    ({"k": "0"}, "k", "between 1 and"),
    ({"k": "4.5"}, "k", "whole number"),
    ({"top_p": "2"}, "top_p", "(0, 1]"),
    ({"temperature": "nan"}, "temperature", "finite"),
    ({"top_k": "-1"}, "top_k", "top-k"),
    ({"seed": "1e400"}, "seed", "seed"),
    ({"max_new_tokens": "999999"}, "max_new_tokens", "max new tokens"),
    ({"rule": "accept_all"}, "rule", "Verification rule"),
    ({"chat": "maybe"}, "chat", "true or false"),
    ({"target": "no-such-model"}, "target", "Unknown target model"),
    ({"target": "../../etc/passwd"}, "target", "file path"),
    ({"draft": "nonsense:mode"}, "draft", "Draft"),
    ({"prompt": "   "}, "prompt", "empty"),
    ({"scenario": "no-such-scenario"}, "scenario", "unknown scenario"),
]


@pytest.mark.parametrize("params, field, words", HOSTILE_LINKS, ids=[f for _, f, _ in HOSTILE_LINKS])
def test_a_bad_value_in_a_link_is_refused_with_the_field_named(presets, params, field, words):
    with pytest.raises(validate.InputError) as refused:
        read(params, presets)
    assert refused.value.field == field
    assert f"{field}: " in refused.value.message and words in refused.value.message
    assert "not applied" in refused.value.message or field == "scenario"


def test_every_bad_field_is_named_and_values_are_shown_inert(presets):
    with pytest.raises(validate.InputError) as refused:
        read({"k": "0", "top_p": "2", "target": '<img src=x onerror="alert(1)">'}, presets)
    message = refused.value.message
    assert refused.value.field == "target"                    # the first in the order of the controls
    assert all(f"{field}: " in message for field in ("target", "k", "top_p"))
    assert "<img" not in message and "&lt;img" in message      # Gradio renders the toast as HTML


def test_html_in_a_linked_prompt_is_a_prompt_like_any_other(presets):
    """A prompt is text: '<img ...>' in it is accepted (the UI shows it in a textbox, never as HTML)."""
    clean, _ = read({"prompt": HOSTILE_PROMPT}, presets)
    assert clean["prompt"] == HOSTILE_PROMPT


class FakeRequest:
    def __init__(self, query: str):
        self.query_params = params_of(query)


def test_restore_sets_the_controls_in_order_and_the_draft_list_follows_the_target(presets):
    original = settings(draft="prompt-lookup:5")
    restore = share.restorer(presets, START, TARGET)
    values = restore(FakeRequest(share.link_query(original)))
    assert len(values) == len(share.RESTORED)
    by_field = dict(zip(share.RESTORED, values))
    draft = by_field.pop("draft")
    assert draft["value"] == "prompt-lookup:5" and "prompt-lookup:5" in [v for _, v in draft["choices"]]
    assert {f: by_field[f] for f in share.LINK_FIELDS if f != "draft"} == {
        f: getattr(original, f) for f in share.LINK_FIELDS if f != "draft"}


def test_restore_without_a_link_changes_nothing(presets):
    values = share.restorer(presets, START, TARGET)(FakeRequest("?__theme=dark"))
    assert all(v == {"__type__": "update"} or getattr(v, "__type__", None) == "update" or v == share.gr.skip()
               for v in values)


def test_share_link_refuses_settings_that_would_make_a_bad_link():
    values = [START[f] for f in share.LINK_FIELDS]
    assert share.share_link(*values, None).startswith("?prompt=Start%20prompt&target=")
    values[share.LINK_FIELDS.index("k")] = 0
    with pytest.raises(validate.InputError) as refused:
        share.share_link(*values, None)
    assert refused.value.field == "k"
