"""The share panel as the page builds it (ui/playground/share.build_panel) inside a bare gr.Blocks, not launched: its
controls keep the ids the browser tests and the page's script use, its code boxes start from the page's settings, and
its events are wired to the handlers (private: no API endpoint). No model is loaded."""
import gradio as gr
import pytest

from ui.playground import share
from ui.playground.presets import load_presets

TARGET = "smollm2-135m-instruct"
START = dict(prompt="Start prompt", target=TARGET, draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, top_k=0,
             max_new_tokens=64, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0)


@pytest.fixture(scope="module")
def panel():
    presets = load_presets()
    with gr.Blocks() as demo:
        controls = {field: (gr.Checkbox(value) if isinstance(value, bool) else
                            gr.Number(value) if isinstance(value, (int, float)) else gr.Textbox(value))
                    for field, value in START.items()}
        scenario, caption = gr.Dropdown([s.id for s in presets.scenarios], value=None), gr.Markdown("")
        out = share.build_panel(demo, controls, scenario, caption, presets, TARGET)
    return demo, controls, scenario, caption, out


def test_the_panels_parts_keep_their_ids_and_start_from_the_pages_settings(panel):
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


def test_the_panels_events_are_wired_to_the_handlers_and_private(panel):
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
