"""The share panel's handlers (ui/playground/share.py) on a registry of fakes: the chat-templated prompt llama.cpp's
programs get, the local checkpoint named when the Hub id cannot load here, what `equivalent` hands the snippets and
how it shows their notes, and the scenario a share link carries. No model is loaded."""
import html
from types import SimpleNamespace

import pytest
import torch

from spec_engine import models as se_models
from ui.playground import drafts, registry as reg, share, validate
from ui.playground.presets import load_presets
from ui.playground.state import RunSettings
from ui.views import equivalent_code

TARGET = "smollm2-135m-instruct"
DRAFT_MODEL = "smollm2-360m-instruct"
START = dict(prompt="Start prompt", target=TARGET, draft=DRAFT_MODEL, k=4, temperature=0.0, top_p=1.0, top_k=0,
             max_new_tokens=64, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0)
PRESETS = load_presets()


class Tokenizer:
    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, **options):
        self.calls.append((messages, options))
        return "<user>" + messages[0]["content"]


def loaded_model(source: str = "", chat_template: bool | None = True):
    """A loaded model as far as share.py and the validator read it (a 4-layer model, any prompt 3 tokens long)."""
    network = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048),
                              model=SimpleNamespace(layers=[None] * 4))
    model = SimpleNamespace(source=source, tokenizer=Tokenizer(), model=network, name="fake",
                            encode_prompt=lambda prompt, chat: torch.zeros(1, 3))
    if chat_template is not None:
        model.has_chat_template = chat_template
    return model


@pytest.fixture
def registry(monkeypatch):
    """reg.REGISTRY.loaded answering from a dict (name -> loaded model); hub ids cannot load (offline, uncached)."""
    models: dict = {}
    monkeypatch.setattr(reg.REGISTRY, "loaded", models.get)
    monkeypatch.setattr(se_models, "hub_source", lambda hub_id, gated=False: (None, "offline"))
    return models


def test_the_chat_prompt_is_the_loaded_targets_template_of_the_prompt(registry):
    settings = RunSettings(**START)
    assert share.chat_text(settings) is None                                   # the target is not loaded here
    registry[DRAFT_MODEL] = loaded_model()
    assert share.chat_text(settings) is None                                   # another model is
    registry[TARGET] = target = loaded_model()
    assert share.chat_text(settings) == "<user>Start prompt"
    assert target.tokenizer.calls == [([{"role": "user", "content": "Start prompt"}],
                                       {"add_generation_prompt": True, "tokenize": False})]
    assert share.chat_text(RunSettings(**dict(START, chat=False))) is None     # the chat switch off
    registry[TARGET] = loaded_model(chat_template=False)
    assert share.chat_text(settings) is None
    registry[TARGET] = loaded_model(chat_template=None)                        # a model that does not say
    assert share.chat_text(settings) is None


def test_the_local_checkpoint_is_named_only_for_a_cache_load_whose_hub_id_cannot_load(registry, monkeypatch):
    asked = []
    monkeypatch.setattr(se_models, "hub_source", lambda hub_id, gated=False: asked.append(hub_id) or (None, "off"))
    assert share.local_checkpoint(TARGET) is None                              # not loaded
    registry[TARGET] = loaded_model("cache:/models/a:b")
    assert share.local_checkpoint(TARGET) == "/models/a:b"                     # the path after the first colon
    assert asked == [equivalent_code.model_id(TARGET)] != [TARGET]
    monkeypatch.setattr(se_models, "hub_source", lambda hub_id, gated=False: ("hub", "online"))
    assert share.local_checkpoint(TARGET) is None                              # the Hub id loads: named instead
    registry["org/custom"] = loaded_model("cache:/models/custom")
    assert share.local_checkpoint("org/custom") == "/models/custom"            # no other id to name
    registry[TARGET] = loaded_model("gguf:/models/x.gguf")
    assert share.local_checkpoint(TARGET) is None
    registry[TARGET] = SimpleNamespace()                                       # no source at all
    assert share.local_checkpoint(TARGET) is None


def test_equivalent_hands_the_snippets_the_local_paths_and_chat_prompt_and_lists_the_notes(registry, monkeypatch):
    handed = []

    def snippets(settings, **paths):
        handed.append(paths)
        return equivalent_code.Snippets("t", "v", "l", ("a <b> & c", "second"))
    monkeypatch.setattr(equivalent_code, "snippets", snippets)
    registry[TARGET] = loaded_model("cache:/models/target")
    registry[DRAFT_MODEL] = loaded_model("cache:/models/draft")
    assert share.equivalent(*START.values()) == ("t", "v", "l", "- a &lt;b&gt; &amp; c\n- second")
    assert handed == [dict(target_path="/models/target", draft_path="/models/draft", chat_prompt="<user>Start prompt")]
    share.equivalent(*dict(START, draft="prompt-lookup", chat=False).values())    # no draft model, no chat
    assert handed[-1] == dict(target_path="/models/target", draft_path=None, chat_prompt=None)


def test_a_share_link_carries_the_scenario_it_was_made_from():
    values = list(START.values())
    assert share.share_link(*values, "S1").endswith("&scenario=S1")
    assert "scenario" not in share.share_link(*values, "") and "scenario" not in share.share_link(*values, None)


def test_a_link_spells_the_chat_switch_as_a_digit_and_encodes_every_reserved_character():
    query = share.link_query(RunSettings(**dict(START, prompt="a/b?c", chat=False)))
    assert query.endswith("&chat=0") and "prompt=a%2Fb%3Fc&" in query
    assert share.link_query(RunSettings(**START)).endswith("&chat=1")


def test_a_refused_link_lists_its_problems_in_the_order_of_the_controls():
    presets = PRESETS
    with pytest.raises(validate.InputError) as refused:
        share.read_link({"top_p": "2", "k": "0"}, START, presets, TARGET)
    assert refused.value.message.startswith("This link's settings were not applied. k: ")
    assert "; top_p: " in refused.value.message


def test_restoring_a_scenario_link_picks_the_scenario_and_shows_its_caption():
    presets = PRESETS
    scenario = presets.scenarios[0]
    restore = share.restorer(presets, START, TARGET)
    values = restore(SimpleNamespace(query_params={"scenario": scenario.id}))
    assert values[-2:] == (scenario.id, f"**{html.escape(scenario.label)}.** {html.escape(scenario.caption)}")
    values = restore(SimpleNamespace(query_params={"k": "3", "draft": "prompt-lookup"}))    # no scenario: both kept
    assert values[share.RESTORED.index("draft")]["choices"] == drafts.draft_choices(TARGET)     # the target's drafts
    assert values[share.RESTORED.index("k")] == 3 and values[-2:] == (share.gr.skip(), share.gr.skip())


def test_a_links_chat_word_is_read_in_any_case_and_an_unknown_scenario_is_named_with_the_known_ones():
    presets = PRESETS
    for word, chat in (("true", True), ("Yes", True), (" ON ", True), ("1", True), ("off", False), ("0", False)):
        assert share.read_link({"chat": word}, dict(START, chat=not chat), presets, TARGET)[0]["chat"] is chat
    with pytest.raises(validate.InputError) as refused:
        share.read_link({"scenario": "no-such"}, START, presets, TARGET)
    known = ", ".join(s.id for s in presets.scenarios)
    assert refused.value.message == f"scenario: unknown scenario {validate.shown('no-such')}; known: {known}"


def test_a_page_load_without_a_request_changes_nothing():
    assert share.restorer(PRESETS, START, TARGET)(None) == (share.gr.skip(),) * len(share.RESTORED)
