"""The share panel as the page builds it (ui/playground/share.build_panel) inside a bare gr.Blocks, not launched: its
controls keep the ids the browser tests and the page's script use, its code boxes start from the page's settings, and
its events are wired to the handlers (private: no API endpoint). No model is loaded."""
from types import SimpleNamespace

import gradio as gr

from ui.playground import share
from ui.views import equivalent_code
from ui.playground.presets import load_presets

TARGET = "smollm2-135m-instruct"
START = dict(prompt="Start prompt", target=TARGET, draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, top_k=0,
             max_new_tokens=64, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0)


def build(start: dict):
    presets = load_presets()
    with gr.Blocks() as demo:
        controls = {field: (gr.Checkbox(value) if isinstance(value, bool) else
                            gr.Number(value) if isinstance(value, (int, float)) else gr.Textbox(value))
                    for field, value in start.items()}
        scenario, caption = gr.Dropdown([s.id for s in presets.scenarios], value=None), gr.Markdown("")
        out = share.build_panel(demo, controls, scenario, caption, presets, TARGET)
    return demo, controls, scenario, caption, out


def test_the_panel_as_the_page_builds_it():
    """One build, every check (mutation testing attributes a module-scoped fixture's build to its first test only,
    and a build per test would cost about half a second each)."""
    panel = build(START)
    parts_keep_their_ids_and_start_from_the_pages_settings(panel)
    events_are_wired_to_the_handlers_and_private(panel)
    laid_out_as_designed(panel)
    code_events_redraw_quietly_and_the_link_gets_the_pages_address(panel)


def parts_keep_their_ids_and_start_from_the_pages_settings(panel):
    _, _, _, _, out = panel
    assert {name: part.elem_id for name, part in out.items()} == {
        "share_btn": "spec-share", "share_link": "spec-share-link", "equivalent_notes": "spec-equivalent-notes",
        "code_transformers": "spec-code-transformers", "code_vllm": "spec-code-vllm",
        "code_llama_cpp": "spec-code-llama-cpp"}
    code = share.equivalent(*START.values())
    shown = (out["code_transformers"].value, out["code_vllm"].value, out["code_llama_cpp"].value)
    assert [value.strip() for value in shown] == [value.strip() for value in code[:3]] and all(shown)
    assert out["equivalent_notes"].value == code[3]
    assert (out["code_transformers"].language, out["code_vllm"].language, out["code_llama_cpp"].language) == (
        "python", "python", "shell")
    assert not out["code_vllm"].interactive and not out["share_link"].interactive
    assert out["share_link"].label == "Link to these settings" and out["share_btn"].value == "Share link"


def events_are_wired_to_the_handlers_and_private(panel):
    demo, controls, scenario, caption, out = panel
    fns = list(demo.fns.values())
    by_name = {}
    for fn in fns:
        by_name.setdefault(getattr(fn.fn, "__name__", None), []).append(fn)
    (share_event,) = by_name["share_link"]
    assert [c._id for c in share_event.inputs] == [controls[f]._id for f in share.LINK_FIELDS] + [scenario._id]
    assert [c._id for c in share_event.outputs] == [out["share_link"]._id]
    (code_event,) = by_name["equivalent"]
    assert [c._id for c in code_event.outputs] == [out[n]._id for n in (
        "code_transformers", "code_vllm", "code_llama_cpp", "equivalent_notes")]
    assert len(code_event.targets) == len(share.LINK_FIELDS) + 1 and code_event.trigger_mode == "always_last"
    (restore_event,) = by_name["restore"]
    assert [c._id for c in restore_event.outputs] == [controls[f]._id for f in share.LINK_FIELDS] + [
        scenario._id, caption._id]
    link_js = [fn for fn in fns if fn.fn is None and fn.js == share.FULL_LINK_JS]
    assert len(link_js) == 1 and [c._id for c in link_js[0].outputs] == [out["share_link"]._id]
    for fn in (share_event, code_event, restore_event, link_js[0]):
        assert fn.api_visibility == "private"


def laid_out_as_designed(panel):
    """Closed until opened; a small button beside a read-only link box with a copy button; the library rules listed;
    a read-only code box per library on its own tab."""
    demo = panel[0]
    by_kind: dict = {}
    for block in demo.blocks.values():
        by_kind.setdefault(type(block).__name__, []).append(block.get_config())
    (accordion,), (row,) = by_kind["Accordion"], by_kind["Row"]
    assert (accordion["label"], accordion["open"], accordion["elem_id"]) == (
        "Share this setting · run it elsewhere", False, "spec-share-panel")
    assert row["equal_height"] is True
    (button,) = by_kind["Button"]
    assert (button["size"], button["scale"], button["min_width"]) == ("sm", 0, 120)
    link = next(c for c in by_kind["Textbox"] if c["elem_id"] == "spec-share-link")
    assert (link["value"], link["buttons"], link["interactive"], link["scale"], link["placeholder"]) == (
        "", ["copy"], False, 5, "Press 'Share link': a link that opens these settings")
    rules = next(c for c in by_kind["Markdown"] if c["elem_id"] == "spec-library-rules")["value"]
    assert rules == ("The same settings in the libraries you deploy with. Option names and the versions they were "
                     "checked against are in each snippet's first line. Their verification rules by default:\n"
                     + "\n".join(f"- {line}" for line in equivalent_code.library_rules_text().split("\n")))
    assert [tab["label"] for tab in by_kind["Tab"]] == ["transformers", "vLLM", "llama.cpp"]
    assert [code["interactive"] for code in by_kind["Code"]] == [False, False, False]


def code_events_redraw_quietly_and_the_link_gets_the_pages_address(panel):
    demo, controls, _, _, out = panel
    fns = list(demo.fns.values())
    (code_event,) = [fn for fn in fns if getattr(fn.fn, "__name__", None) == "equivalent"]
    assert code_event.show_progress == "hidden"
    assert [c._id for c in code_event.inputs] == [controls[f]._id for f in share.LINK_FIELDS]
    (accordion,) = [block for block in demo.blocks.values() if isinstance(block, gr.Accordion)]
    assert (accordion._id, "expand") in code_event.targets                  # opening the panel redraws the code
    (restore_event,) = [fn for fn in fns if getattr(fn.fn, "__name__", None) == "restore"]
    link = SimpleNamespace(query_params={"scenario": load_presets().scenarios[0].id, "k": "3"})
    assert restore_event.fn(link) == share.restorer(load_presets(), START, TARGET)(link)
    (link_js,) = [fn for fn in fns if fn.fn is None]
    assert link_js.js == share.FULL_LINK_JS and [c._id for c in link_js.inputs] == [out["share_link"]._id]


def test_a_page_whose_settings_are_not_valid_yet_starts_with_empty_code_and_says_why():
    out = build(dict(START, prompt=""))[4]
    assert (out["code_transformers"].value, out["code_vllm"].value, out["code_llama_cpp"].value) == ("", "", "")
    assert out["equivalent_notes"].value.startswith("The code follows once the settings are valid: ")
