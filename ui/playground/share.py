"""Share links and 'Run this elsewhere': a setting travels as a URL, and as code for other libraries.

A share link is the playground's own address with the run settings as query parameters
(`?prompt=...&target=...&draft=...&k=4&temperature=0&top_p=1&top_k=0&max_new_tokens=64&seed=0&rule=exact&chat=1`,
plus `scenario=<id>` when the settings came from a classroom scenario). Why query parameters rather than Gradio's
DeepLinkButton: a deep link names a snapshot the server keeps for a while, so a link pasted into slides stops
working after a restart or on another server; the settings themselves, in the URL, open anywhere the same presets
exist. Gradio hands the page's query parameters to the page-load event (`gr.Request.query_params`), and every value
read from a link goes through the checks a typed value goes through (`validate.check_fields`): a hostile link gets
the same named refusals as an API call, and nothing of it is applied.

`link_query` and `read_link` are pure; `restore`, `share_link` and `equivalent` are the handlers layout.py wires.
"""
from __future__ import annotations

import html
from collections.abc import Mapping
from urllib.parse import urlencode, quote

import gradio as gr

import spec_engine as se

from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground import validate
from ui.playground.presets import Presets
from ui.playground.state import RunSettings
from ui.views import equivalent_code

LINK_FIELDS = validate.RUN_FIELDS        # prompt, target, draft, k, ..., chat, skip_layers, exit_after: a whole run
LINK_KEYS = LINK_FIELDS + ("scenario",)
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# What the page-load handler sets, in order: the run controls, then the scenario picker and its caption.
RESTORED = LINK_FIELDS + ("scenario", "caption")


def link_query(settings: RunSettings, scenario: str | None = None) -> str:
    """'?prompt=...&...': every run setting (so the link means the same run after the app's defaults change),
    percent-encoded (a space is %20, a newline %0A), the scenario last."""
    values = {field: getattr(settings, field) for field in LINK_FIELDS}
    values["chat"] = int(settings.chat)
    if not values["skip_layers"]:
        del values["skip_layers"]              # empty and 0 mean the defaults; no need to carry them
    if not values["exit_after"]:
        del values["exit_after"]
    if scenario:
        values["scenario"] = scenario
    return "?" + urlencode(values, quote_via=quote, safe="")


def link_words(params: Mapping[str, str]) -> dict[str, object]:
    """The link's own keys (Gradio's and anyone else's are ignored), with the chat switch read from a word."""
    words: dict[str, object] = {key: params[key] for key in LINK_KEYS if key in params}
    chat = words.get("chat")
    if isinstance(chat, str) and chat.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        words["chat"] = chat.strip().lower() in TRUE_WORDS
    return words


def read_link(params: Mapping[str, str], start: Mapping[str, object], presets: Presets,
              default_target: str) -> tuple[dict, str | None] | None:
    """A link's query parameters -> (clean run values, scenario id), or None when the link carries no settings.
    Fields the link leaves out keep `start` (the page's initial values), or its scenario's. Raises
    validate.InputError naming every bad field (the first one as `.field`) when anything is refused."""
    words = link_words(params)
    if not words:
        return None
    base = dict(start)
    scenario = words.pop("scenario", None)
    if scenario is not None:
        known = [s.id for s in presets.scenarios]
        if scenario not in known:
            raise validate.InputError("scenario", f"scenario: unknown scenario {validate.shown(scenario)}; "
                                                  f"known: {', '.join(known)}")
        s = presets.scenario(scenario)
        base.update(prompt=s.prompt, target=s.target or default_target, draft=s.draft, k=s.k,
                    temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
                    seed=s.seed, rule=s.rule, chat=s.chat)
    base.update(words)
    clean, problems = validate.check_fields(**{field: base.get(field) for field in LINK_FIELDS})
    if problems:
        first = next(field for field in LINK_FIELDS if field in problems)
        listed = "; ".join(f"{field}: {problems[field]}" for field in LINK_FIELDS if field in problems)
        raise validate.InputError(first, f"This link's settings were not applied. {listed}")
    return clean, scenario


# ------------------------------------------------------------------------------------------------ handlers

def restorer(presets: Presets, start: Mapping[str, object], default_target: str):
    """The page-load handler: a link's settings into the controls (outputs in RESTORED order); without a link,
    nothing changes. A closure, not functools.partial: Gradio finds the gr.Request argument by the function's
    own type hints."""
    def restore(request: gr.Request):
        params = dict(request.query_params) if request is not None else {}
        found = read_link(params, start, presets, default_target)
        if found is None:
            return (gr.skip(),) * len(RESTORED)
        clean, scenario = found
        choices = drafts.draft_choices(clean["target"])
        if clean["draft"] not in [value for _, value in choices]:
            choices = [*choices, (clean["draft"], clean["draft"])]
        controls = [gr.update(choices=choices, value=clean["draft"]) if field == "draft" else clean[field]
                    for field in LINK_FIELDS]
        caption = ""
        if scenario is not None:
            s = presets.scenario(scenario)
            caption = f"**{html.escape(s.label)}.** {html.escape(s.caption)}"
        return (*controls, scenario if scenario is not None else gr.skip(), caption or gr.skip())
    return restore


def settings_from(values: tuple) -> RunSettings:
    """The controls' values (LINK_FIELDS order) as RunSettings, or InputError naming the bad field."""
    return validate.check_settings(*values)


def share_link(*values):
    """'Share link' button: the query string of the current settings (the page adds its own address in the
    browser); the scenario comes last among the inputs."""
    *run_values, scenario = values
    return link_query(settings_from(tuple(run_values)), scenario or None)


def chat_text(settings: RunSettings) -> str | None:
    """The chat-templated prompt as text (llama.cpp's programs take raw text), when the target is loaded here."""
    loaded = reg.REGISTRY.loaded(settings.target)
    if not settings.chat or loaded is None or not getattr(loaded, "has_chat_template", False):
        return None
    return loaded.tokenizer.apply_chat_template([{"role": "user", "content": settings.prompt}],
                                                add_generation_prompt=True, tokenize=False)


def local_checkpoint(name: str) -> str | None:
    """The directory the playground loaded `name` from, when that is the checkpoint it made from the packaged GGUF
    and the model's Hub id cannot load here (offline and not in the Hugging Face cache): the transformers code then
    names that directory, so it runs as shown on the machine where the playground runs. None otherwise (the Hub id
    works, or the model is not loaded)."""
    loaded = reg.REGISTRY.loaded(name)
    if loaded is None:
        return None
    kind, _, where = str(getattr(loaded, "source", "")).partition(":")
    if kind != "cache":
        return None
    hub = equivalent_code.model_id(name)
    if hub != name and se.hub_source(hub)[0] is not None:
        return None
    return where


def equivalent(*values):
    """The 'Run this elsewhere' panel: transformers, vLLM and llama.cpp code for the current settings, and the
    notes on what has no equivalent. Unfinished settings (an empty prompt while typing) leave it as it is."""
    try:
        settings = settings_from(values)
    except validate.InputError as exc:
        return gr.skip(), gr.skip(), gr.skip(), f"The code follows once the settings are valid: {exc.message}"
    draft_model = equivalent_code.plan(settings.draft, settings.exit_after).draft_model
    code = equivalent_code.snippets(settings, target_path=local_checkpoint(settings.target),
                                    draft_path=local_checkpoint(draft_model) if draft_model else None,
                                    chat_prompt=chat_text(settings))
    notes = "\n".join(f"- {html.escape(note)}" for note in code.notes)
    return code.transformers, code.vllm, code.llama_cpp, notes


# -------------------------------------------------------------------------------------------------- layout

# The page's own address + the query string the server built (the server cannot know the address a visitor sees
# behind a proxy or a Space's domain; the browser can).
FULL_LINK_JS = "(query) => query.startsWith('?') ? window.location.origin + window.location.pathname + query : query"


def build_panel(demo: gr.Blocks, controls: Mapping[str, gr.components.Component], scenario: gr.Dropdown,
                caption: gr.Markdown, presets: Presets, default_target: str) -> dict[str, gr.components.Component]:
    """The 'Share this setting · run it elsewhere' accordion and its events, placed where it is called (inside
    the Blocks): a Share link button and box, and the equivalent code, redrawn when a setting changes. Also the
    page-load event that applies a link's settings."""
    start = {field: controls[field].value for field in LINK_FIELDS}
    inputs = [controls[field] for field in LINK_FIELDS]
    first = equivalent(*start.values())
    out: dict[str, gr.components.Component] = {}
    with gr.Accordion("Share this setting · run it elsewhere", open=False, elem_id="spec-share-panel") as panel:
        with gr.Row(equal_height=True):
            out["share_btn"] = gr.Button("Share link", size="sm", scale=0, min_width=120, elem_id="spec-share")
            # Gradio 6 draws a Textbox's copy button in its label row: with show_label=False there was none.
            out["share_link"] = gr.Textbox("", label="Link to these settings", buttons=["copy"], interactive=False,
                                           scale=5,
                                           placeholder="Press 'Share link': a link that opens these settings",
                                           elem_id="spec-share-link")
        gr.Markdown("The same settings in the libraries you deploy with. Option names and the versions they were "
                    "checked against are in each snippet's first line. Their verification rules by default:\n"
                    + "\n".join(f"- {line}" for line in equivalent_code.library_rules_text().split("\n")),
                    elem_id="spec-library-rules")
        out["equivalent_notes"] = gr.Markdown(first[3] if isinstance(first[3], str) else "",
                                              elem_id="spec-equivalent-notes")
        with gr.Tabs():
            with gr.Tab("transformers"):
                out["code_transformers"] = gr.Code(first[0] if isinstance(first[0], str) else "", language="python",
                                                   interactive=False, elem_id="spec-code-transformers")
            with gr.Tab("vLLM"):
                out["code_vllm"] = gr.Code(first[1] if isinstance(first[1], str) else "", language="python",
                                           interactive=False, elem_id="spec-code-vllm")
            with gr.Tab("llama.cpp"):
                out["code_llama_cpp"] = gr.Code(first[2] if isinstance(first[2], str) else "", language="shell",
                                                interactive=False, elem_id="spec-code-llama-cpp")
    private = {"api_visibility": "private"}
    code_outputs = [out["code_transformers"], out["code_vllm"], out["code_llama_cpp"], out["equivalent_notes"]]
    # Opening the panel redraws the code too: a model loaded since the page was built may now name its local path.
    gr.on([control.change for control in inputs] + [panel.expand], equivalent, inputs, code_outputs,
          trigger_mode="always_last", show_progress="hidden", **private)
    out["share_btn"].click(share_link, [*inputs, scenario], [out["share_link"]], **private).success(
        None, [out["share_link"]], [out["share_link"]], js=FULL_LINK_JS, **private)
    demo.load(restorer(presets, start, default_target), None, [*inputs, scenario, caption], **private)
    return out
