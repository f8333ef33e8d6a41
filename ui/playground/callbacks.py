"""The controls' callbacks: the target and draft dropdowns, scenarios and prompts, the history's view controls,
"Show spaces", and the page-load model status."""
from __future__ import annotations

import dataclasses

import gradio as gr

import spec_engine as se

from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground import validate
from ui.playground.handlers import compare_figure, history_frame, status_text
from ui.playground.presets import Presets
from ui.playground.state import SessionState
from ui.views import render


def rerender(show_spaces, state: SessionState):
    """'Show spaces' toggle: re-render the current run's rounds."""
    prep = getattr(state, "active", None)
    if prep is None or prep.record is None or not prep.record.rounds:
        return gr.skip()
    prep.options = dataclasses.replace(prep.options, show_spaces=bool(show_spaces))
    prep.record.fragments = [render.round_html(ev, prep.labeler, prep.options) for ev in prep.record.rounds]
    status = status_text(prep.record, state.summary(prep.record), running=not prep.record.recorded)
    return render.view_html(prep.record.fragments, render.prompt_html(prep.prompt_text, len(prep.record.prompt_ids),
                                                                      prep.record.settings.chat), status, legend=False)


def set_compare_axis(axis, state: SessionState):
    state.compare_axis = axis
    return compare_figure(state)


def clear_history(state: SessionState):
    state.clear_history()
    return history_frame(state), compare_figure(state)


def on_target(target, draft, state: SessionState):
    """A target that cannot load here warns and reverts; otherwise the draft list follows the target."""
    previous = getattr(state, "target", None) or next(iter(reg.preset_names()))
    try:
        target = validate.check_target(target)
    except validate.InputError as exc:
        gr.Warning(render.esc(exc.message))
        return gr.update(value=previous), gr.update()
    ok, reason = reg.availability(target)
    if not ok:
        gr.Warning(render.esc(f"{reg.display_name(target)} is unavailable here: {validate.public_message(reason)}"))
        return gr.update(value=previous), gr.update()
    state.target = target
    choices = drafts.draft_choices(target)
    values = [value for _, value in choices]
    return gr.update(), gr.update(choices=choices, value=draft if draft in values else values[0])


def on_draft(draft, target):
    """Describe the chosen draft; warn if its model cannot load here."""
    try:
        kind, spec = drafts.split_draft(draft)
    except ValueError:
        return gr.update()
    if spec.model is not None:
        ok, reason = reg.availability(spec.model)
        if not ok:
            gr.Warning(render.esc(f"{reg.display_name(spec.model)} is unavailable here: {reason}"))
    return kind.lesson


def apply_scenario(scenario_id, presets: Presets, default_target: str):
    """Scenario dropdown: set every control it names, and show its caption."""
    if not scenario_id:
        return (gr.skip(),) * 12
    s = presets.scenario(scenario_id)
    target = s.target or default_target
    choices = drafts.draft_choices(target)
    return (s.prompt, target, gr.update(choices=choices, value=s.draft), s.k, s.temperature, s.top_p, s.top_k,
            s.max_new_tokens, s.seed, s.rule, s.chat, f"**{s.label}.** {s.caption}")


def apply_prompt(prompt_id, presets: Presets):
    if not prompt_id:
        return gr.skip(), gr.skip()
    p = presets.prompt(prompt_id)
    return p.text, p.chat


def model_status(default_target: str):
    """Page load: show the default target's loading progress until it is ready. A line is sent only when the
    progress changes: the app measures its speed while it warms up, and every message costs the server's event
    loop and the page's drawing a share of the cores it is measured on (layout.py hides the event's progress
    animation for the same reason)."""
    entry = reg.REGISTRY.start(default_target)
    shown = None
    while not entry.done.wait(0.5):
        line = (f"⏳ {reg.display_name(default_target)}: {validate.public_message(reg.REGISTRY.status(default_target))}"
                f"; {STARTUP_EXPECTED}")
        if line != shown:
            shown = line
            yield line
    yield model_status_line(default_target)


# Measured on a 2-core CPU (README, "Set up"): the first start dequantizes the GGUF and packs and measures once.
STARTUP_EXPECTED = ("not ready until warmed up: on 2 quiet CPU cores about 40 s on a machine's first start, "
                    "about 20 s later; longer on a busy host")


def model_status_line(default_target: str) -> str:
    parts = []
    for preset in se.list_presets():
        status = reg.REGISTRY.status(preset.name)
        if status != "not loaded":
            parts.append(f"{preset.display_name}: {validate.public_message(status)}")
    return "Models: " + (" · ".join(parts) if parts else "none loaded yet")
