"""Classroom tabs: step through a run one round at a time, and export / replay traces; plus the run explanation.

`build_tabs` is called inside the layout's lower `gr.Tabs()`; it places two tabs and wires their events.
The step-through uses the same controls as the main run (passed in as `c`) and keeps one `StepSession` per
visitor in its own `gr.State`; a replay needs no model: it renders from the trace alone.
"""
from __future__ import annotations


import gradio as gr

import spec_engine as se
from spec_engine.classroom import trace as tr

from ui.playground import handlers, limits, validate
from ui.views import plots, render
from ui.classroom import replay, stepper
from ui.playground import registry as reg
from ui.playground.state import SessionState

STEP_INPUTS = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule",
               "chat", "skip_layers", "exit_after", "show_spaces")
STEP_OUTPUTS = ("status", "round", "residual", "kv", "tokens", "explain", "tree")
REPLAY_OUTPUTS = ("status", "tokens", "stats", "explain", "acceptance_plot", "forward_plot")
SPEEDS = (0.2, 3.0, 1.0)      # autoplay: seconds per round (min, max, default)

TRACE_CAPTION = ("**Trace export and replay.** Download a run (settings, model names and every round) as JSON; "
                 "load it anywhere, even without models or compute, and it renders exactly as it did live. "
                 "Step through a loaded trace in the Step-through tab.")
RESIZE_JS = "() => { setTimeout(() => window.dispatchEvent(new Event('resize')), 50); }"
PRIVATE = {"api_visibility": "private"}
COMPUTE = {"concurrency_id": "compute", "concurrency_limit": None}   # shares the main run's limit


# ------------------------------------------------------------------------------------------ step-through

def step_view(session, timer=None, note: str | None = None) -> tuple:
    v = stepper.view(session)
    # A trace's models and stop reason are anyone's text: shown literally (a live session's are presets or names
    # validated as Hub ids).
    literal = replay.plain_markdown if getattr(session, "origin", None) == "trace" else str
    v["status"] = literal(v["status"])
    if note:
        v["status"] = f"**{literal(note)}** {v['status']}"
    current = session.stepper.current if session is not None else None
    v["tree"] = gr.Plot(v["tree"], visible=current is not None and current.is_tree)   # shown for tree rounds only
    return (session, *[v[name] for name in STEP_OUTPUTS], gr.skip() if timer is None else timer)


def message(text: str) -> tuple:
    return (gr.skip(), text) + (gr.skip(),) * len(STEP_OUTPUTS)


def settings_from(values: dict):
    return handlers.parse_settings(*[values[name] for name in STEP_INPUTS[:-1]])


def start(values: dict):
    """Generator: loading messages as step outputs; returns a fresh live StepSession."""
    settings = settings_from(values)
    gen = stepper.start_live(settings, reg.REGISTRY, bool(values["show_spaces"]))
    while True:
        try:
            text = next(gen)
        except StopIteration as stop:
            return stop.value
        yield message(text)


def advance(session) -> bool:
    """One step forward under the session's lock (a new round from the engine at the end of the recording);
    False when there is nothing more to show."""
    with session.lock, stepper.engine(session):
        return session.stepper.forward() is not None


def step_forward(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
                 exit_after, show_spaces, session):
    """Forward / api_name="step": show the next round (computed by the engine only at the end of the
    recording). Starts a session with the current controls when there is none."""
    values = dict(zip(STEP_INPUTS, (prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                    chat, skip_layers, exit_after, show_spaces)))
    with handlers.friendly_errors():
        if session is None:
            session = yield from start(values)
        if not advance(session):
            gr.Info("This run has ended: press Reset to start again, or Back to look at earlier rounds.")
        yield step_view(session)


def step_reset(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
               exit_after, show_spaces, session):
    """Reset / api_name="step_reset": a new session with the current controls, no round shown yet (the prompt
    is prefilled)."""
    values = dict(zip(STEP_INPUTS, (prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                    chat, skip_layers, exit_after, show_spaces)))
    with handlers.friendly_errors():
        session = yield from start(values)
        yield step_view(session, gr.Timer(active=False))


def draft_position(value) -> int:
    """The finder's i, checked: a whole number from 1 to the largest k."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
            or not 1 <= value <= se.MAX_K:
        raise validate.refusal(f"Draft position i must be a whole number from 1 to {se.MAX_K}, got {value!r}.")
    return int(value)


def find_round(values: dict, session, until: str, what: str):
    """Generator behind the finders: start a session if there is none, then go forward (computing rounds with
    the engine, as Forward does) to the next round for which `until` holds (stepper.wanted_by); say so when the
    run ends first."""
    if session is None:
        session = yield from start(values)
    yield message(f"Looking for the next {what}…")
    with session.lock, stepper.engine(session, until):
        shown = session.stepper.position
        found = session.stepper.find(stepper.wanted_by(until))
        ended = f"the run ended: {session.stop_reason}" if session.stepper.finished else "no more recorded rounds"
        total = len(session.stepper.events)
    if found is not None:
        yield step_view(session, gr.Timer(active=False))
        return
    where = f"after round {shown}" if shown else "in this run"
    still = f"still showing round {shown}" if shown else "nothing shown yet"
    note = (f"No {what} {where} ({ended}, {total} rounds): {still}. Forward shows the rounds computed on the way; "
            f"try another seed or more new tokens, then Reset.")
    gr.Info(note)
    yield step_view(session, gr.Timer(active=False), note=note)


def step_find_rejection(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                        skip_layers, exit_after, show_spaces, position, session):
    """'Next round rejecting draft i': forward to the next round whose first rejection is draft i (1-based)."""
    values = dict(zip(STEP_INPUTS, (prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                    chat, skip_layers, exit_after, show_spaces)))
    with handlers.friendly_errors():
        i = draft_position(position)
        k = session.settings.k if session is not None else settings_from(values).k
        if i > k:
            raise validate.refusal(f"Draft position {i} is past k = {k}: a round drafts at most k tokens.")
        yield from find_round(values, session, f"reject:{i}", f"round rejecting draft {i}")


def step_find_accepted(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                       skip_layers, exit_after, show_spaces, session):
    """'Next all-accepted round': forward to the next round that accepted every draft."""
    values = dict(zip(STEP_INPUTS, (prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                    chat, skip_layers, exit_after, show_spaces)))
    with handlers.friendly_errors():
        yield from find_round(values, session, stepper.ALL_ACCEPTED, "round with every draft accepted")


# "Show me" for the step-through's lesson: one click from the tab to a round that rejects the 4th of 5 drafts.
# Layer-skip drafts all k tokens every round (no cost sizing), greedy, the chat-sky prompt: on SmolLM2-135M the first
# round already rejects draft 4 of 5 (rounds 1, 17 and 24 of 35 do); another target finds its own or says so.
LESSON = dict(prompt_id="chat-sky", draft="layer-skip", k=5, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=128,
              seed=0, rule="exact", chat=True, skip_layers="", exit_after=0)
LESSON_CONTROLS = ("prompt", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule", "chat",
                   "skip_layers", "exit_after")
LESSON_POSITION = 4


def step_lesson(target, show_spaces):
    """'Show me: draft 4 of 5 rejected': sets the controls to the lesson's settings (visibly, on the left), starts
    a step-through with them and goes to the first round whose 4th draft is the rejected one."""
    from ui.playground.presets import load_presets
    lesson = {name: value for name, value in LESSON.items() if name != "prompt_id"}
    lesson["prompt"] = load_presets().prompt(LESSON["prompt_id"]).text
    values = dict(lesson, target=target, show_spaces=show_spaces)
    controls = tuple(lesson[name] for name in LESSON_CONTROLS) + (LESSON_POSITION,)
    first = True
    with handlers.friendly_errors():
        for out in find_round(values, None, f"reject:{LESSON_POSITION}",
                              f"round rejecting draft {LESSON_POSITION}"):
            yield out + (controls if first else (gr.skip(),) * len(controls))
            first = False


def step_back(session):
    if session is None:
        return step_view(None)
    with session.lock:
        session.stepper.back()
    return step_view(session)


def step_tick(*args):
    """Autoplay: one Forward per timer tick; the timer stops itself at the end of the run."""
    values, session = dict(zip(STEP_INPUTS, args[:-1])), args[-1]
    with handlers.friendly_errors():
        if session is None:
            session = yield from start(values)
        moved = advance(session)
        yield step_view(session, gr.skip() if moved and session.stepper.can_forward else gr.Timer(active=False))


def play(speed):
    return gr.Timer(value=float(speed), active=True)


def pause():
    return gr.Timer(active=False)


def set_speed(speed):
    return gr.Timer(value=float(speed))


# ------------------------------------------------------------------------------------------ trace tab

def export_run(state: SessionState):
    """Export / api_name="trace_export": the newest finished run of this session as a JSON trace file."""
    try:
        trace = replay.export_latest(state)
        path = replay.write_temp(trace)
    except ValueError as exc:
        raise validate.refusal(exc) from None
    keep_export(state.exports, state.lock, path)
    return str(path), (f"Exported run {trace.display.get('run_id')}: {len(trace.rounds)} rounds, "
                       f"{len(trace.tokens)} tokens ({path.stat().st_size / 1024:.0f} KiB).")


def keep_export(folders: list, lock, path) -> None:
    """Note an export's folder in its session, whose expiry deletes it (older ones are gone already: only the
    newest replay.KEEP_EXPORTS of the process stay)."""
    with lock:
        folders.append(path.parent)
        del folders[:-replay.KEEP_EXPORTS]


def export_steps(session):
    """Export the step-through's recorded rounds (without models this is a replay of a replay)."""
    if session is None or not session.stepper.events:
        raise validate.refusal("Nothing to export yet: step at least one round in the Step-through tab.")
    with session.lock:
        rounds = list(session.stepper.events)
        try:
            trace = replay.make(session.settings, session.draft_label, session.prompt_ids, rounds, session.labeler,
                                session.options, session.stop_reason, session.baseline,
                                {"status": f"Step-through: {len(rounds)} rounds"}, source="step-through")
            path = replay.write_temp(trace)
        except ValueError as exc:
            raise validate.refusal(exc) from None
    keep_export(session.exports, session.lock, path)
    return str(path), f"Exported the step-through: {len(rounds)} rounds, {len(trace.tokens)} tokens."


def replay_outputs(trace: tr.Trace) -> tuple:
    view = replay.replay_view(trace)
    settings = replay.settings_of(trace)
    created = f", recorded {trace.created}" if trace.created else ""
    status = replay.plain_markdown(
        f"Replaying a trace ({trace.source}{created}): {trace.models.get('target', settings.target)} with "
        f"{trace.models.get('draft', settings.draft)}, k={settings.k}, "
        f"{'greedy' if settings.greedy else f'T={settings.temperature}'}, {len(trace.rounds)} rounds. No model used.")
    values = dict(view, status=status)
    return (trace,) + tuple(values[name] for name in REPLAY_OUTPUTS)


def replay_file(path):
    """Upload / api_name="trace_replay": load a trace file and render it as the live run rendered it."""
    if not path:
        raise validate.refusal("Choose a trace file (.json) first.")
    try:
        trace = tr.load(path)
    except tr.TraceError as exc:
        raise validate.refusal(f"Cannot replay this file: {exc}") from None
    return replay_outputs(trace)


def replay_example():
    return replay_file(str(replay.EXAMPLE_PATH))


def step_trace(trace):
    """'Step through this trace': the loaded trace becomes the step-through session (no models)."""
    if trace is None:
        raise validate.refusal("Load a trace first (upload one, or load the example).")
    return step_view(stepper.from_trace(trace), gr.Timer(active=False))


# ------------------------------------------------------------------------------------------ layout

def build_tabs(c: dict, state: gr.State) -> dict:
    """The 'Step through' and 'Trace export / replay' tabs; `c` holds the main run's controls.

    Every component, the `gr.State`s included, is created inside a `gr.Tab`: the caller's `gr.Tabs` must hold
    only tabs. A State created directly in the Tabs shifted the browser's tab bookkeeping (clicking "Step
    through" relabelled the tab two places on, "Exactness lab", and made it unreachable until a reload)."""
    s: dict[str, gr.components.Component] = {}
    r: dict[str, gr.components.Component] = {}
    with gr.Tab("Step through") as step_tab:
        w = step_panel(s)
    with gr.Tab("Trace export / replay") as trace_tab:
        t = trace_panel(r)
    step_outputs = wire_step(c, w, s)
    wire_trace(state, w, t, r, step_outputs)
    for tab in (step_tab, trace_tab):   # plots drawn while their tab was hidden get their width now
        tab.select(None, None, None, js=RESIZE_JS, **PRIVATE)
    return {**{f"step_{k}": v for k, v in s.items()}, **{f"trace_{k}": v for k, v in r.items()},
            "step_state": w["step_state"], "trace_file": t["trace_file"], "timer": w["timer"]}


def step_panel(s: dict) -> dict:
    """The step-through tab's components: its views go into `s` (STEP_OUTPUTS); the buttons, state and timer are
    returned by name."""
    w: dict[str, gr.components.Component] = {}
    w["step_state"] = gr.State(None, time_to_live=limits.current().session_ttl_seconds,
                               delete_callback=stepper.expire)
    gr.Markdown(stepper.CAPTION)
    with gr.Row():
        w["reset_btn"] = gr.Button("⟲ Reset", size="sm", elem_id="step-reset")
        w["back_btn"] = gr.Button("◀ Back", size="sm", elem_id="step-back")
        w["forward_btn"] = gr.Button("Forward ▶", variant="primary", size="sm", elem_id="step-forward")
        w["play_btn"] = gr.Button("▶ Play", size="sm", elem_id="step-play")
        w["pause_btn"] = gr.Button("⏸ Pause", size="sm", elem_id="step-pause")
        w["speed"] = gr.Slider(*SPEEDS[:2], value=SPEEDS[2], step=0.1, label="seconds per round (autoplay)",
                               elem_id="step-speed", min_width=200)
    with gr.Row():
        w["position"] = gr.Number(2, precision=0, minimum=1, maximum=se.MAX_K,
                                  label="draft position i (1 = first)", elem_id="step-position", min_width=220,
                                  scale=0)
        w["find_rejection_btn"] = gr.Button("Next round rejecting draft i ▶▶", size="sm",
                                            elem_id="step-find-rejection")
        w["find_accepted_btn"] = gr.Button("Next all-accepted round ▶▶", size="sm", elem_id="step-find-accepted")
        w["lesson_btn"] = gr.Button(f"Show me: draft {LESSON_POSITION} of {LESSON['k']} rejected", size="sm",
                                    variant="secondary", elem_id="step-lesson")
    w["timer"] = gr.Timer(SPEEDS[2], active=False)
    initial = stepper.view(None)
    s["status"] = gr.Markdown(initial["status"], elem_id="step-status")
    s["round"] = gr.HTML(initial["round"], css_template=stepper.STEP_CSS, elem_id="step-round",
                         js_on_load=stepper.SCROLL_HINT_JS)
    s["tree"] = gr.Plot(initial["tree"], show_label=False, elem_id="step-tree", visible=False)
    with gr.Row(equal_height=False):
        s["residual"] = gr.Plot(initial["residual"], show_label=False, elem_id="step-residual", scale=3)
        s["kv"] = gr.HTML(initial["kv"], css_template=stepper.STEP_CSS, elem_id="step-kv", scale=2,
                          js_on_load=stepper.SCROLL_HINT_JS)
    s["tokens"] = gr.HTML(initial["tokens"], css_template=render.CSS, elem_id="step-tokens", max_height=320,
                          autoscroll=True, js_on_load=render.TOOLTIP_JS)
    s["explain"] = gr.Markdown("", elem_id="step-explain")
    return w


def trace_panel(r: dict) -> dict:
    """The trace tab's components: its views go into `r` (REPLAY_OUTPUTS); the buttons, state and file are
    returned by name."""
    t: dict[str, gr.components.Component] = {}
    t["replay_state"] = gr.State(None, time_to_live=limits.current().session_ttl_seconds)
    gr.Markdown(TRACE_CAPTION)
    with gr.Row():
        t["export_btn"] = gr.Button("Export the latest run", size="sm", elem_id="trace-export")
        t["export_steps_btn"] = gr.Button("Export the step-through", size="sm", elem_id="trace-export-steps")
        t["upload_btn"] = gr.UploadButton("Load a trace (.json)", file_types=[".json"], type="filepath", size="sm",
                                          elem_id="trace-upload")
        t["example_btn"] = gr.Button("Load the example trace", size="sm", elem_id="trace-example")
        t["step_trace_btn"] = gr.Button("Step through this trace", size="sm", elem_id="trace-step")
    with gr.Row():
        t["trace_file"] = gr.File(label="Trace file (download)", interactive=False, elem_id="trace-file", scale=2)
        t["export_md"] = gr.Markdown("", elem_id="trace-export-status")
    r["status"] = gr.Markdown("Load a trace to replay it here.", elem_id="trace-status")
    r["stats"] = gr.HTML(render.stats_html(None, "No trace loaded."), css_template=render.CSS,
                         elem_id="trace-stats")
    r["tokens"] = gr.HTML(render.empty_view("The replayed tokens appear here.", legend=False),
                          css_template=render.CSS, elem_id="trace-tokens", max_height=430,
                          js_on_load=render.TOOLTIP_JS)
    r["explain"] = gr.Markdown("", elem_id="trace-explain")
    with gr.Row():
        r["acceptance_plot"] = gr.Plot(plots.acceptance_figure([]), show_label=False, elem_id="trace-acceptance")
        r["forward_plot"] = gr.Plot(plots.forward_figure([]), show_label=False, elem_id="trace-forward")
    return t


def wire_step(c: dict, w: dict, s: dict) -> list:
    """The step-through's events; returns its outputs (the trace tab's "Step through this trace" fills them too)."""
    step_state, timer, position = w["step_state"], w["timer"], w["position"]
    controls = [c[name] for name in STEP_INPUTS] + [step_state]
    step_outputs = [step_state] + [s[name] for name in STEP_OUTPUTS] + [timer]
    # The validators are /run's checks: a bad value is refused by field name before it takes a place in the queue
    # (preprocess=False, as for /run: Gradio's own range checks would answer first, without the field's name).
    checked = {**COMPUTE, "validator": validate.step_validator, "preprocess": False}
    w["forward_btn"].click(step_forward, controls, step_outputs, api_name="step", **checked)
    w["reset_btn"].click(step_reset, controls, step_outputs, api_name="step_reset", **checked)
    w["back_btn"].click(step_back, [step_state], step_outputs, **PRIVATE)
    w["find_rejection_btn"].click(step_find_rejection, controls[:-1] + [position, step_state], step_outputs,
                                  **COMPUTE, validator=validate.find_validator, preprocess=False, **PRIVATE)
    w["find_accepted_btn"].click(step_find_accepted, controls, step_outputs, **checked, **PRIVATE)
    w["lesson_btn"].click(step_lesson, [c["target"], c["show_spaces"]],
                          step_outputs + [c[name] for name in LESSON_CONTROLS] + [position], **COMPUTE, **PRIVATE)
    timer.tick(step_tick, controls, step_outputs, trigger_mode="once", **checked, **PRIVATE)
    w["play_btn"].click(play, [w["speed"]], [timer], **PRIVATE)
    w["pause_btn"].click(pause, None, [timer], **PRIVATE)
    w["speed"].change(set_speed, [w["speed"]], [timer], **PRIVATE)
    return step_outputs


def wire_trace(state: gr.State, w: dict, t: dict, r: dict, step_outputs: list) -> None:
    replay_outs = [t["replay_state"]] + [r[name] for name in REPLAY_OUTPUTS]
    exported = [t["trace_file"], t["export_md"]]
    t["export_btn"].click(export_run, [state], exported, api_name="trace_export")
    t["export_steps_btn"].click(export_steps, [w["step_state"]], exported, **PRIVATE)
    t["upload_btn"].upload(replay_file, [t["upload_btn"]], replay_outs, api_name="trace_replay")
    t["example_btn"].click(replay_example, None, replay_outs, **PRIVATE)
    t["step_trace_btn"].click(step_trace, [t["replay_state"]], step_outputs, **PRIVATE)
