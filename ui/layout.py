"""The Blocks layout: controls on the left; streamed tokens, numbers and plots on the right.

`build_demo()` returns the app without launching it, so tests and app.py share it. Handlers live in
`handlers`; this module only places components and wires events.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import gradio as gr

import spec_engine as se
from spec_engine.classroom.trace import MAX_BYTES as MAX_TRACE_BYTES

from ui import page_head
from ui.classroom import tabs as classroom, sweeps
from ui.playground import callbacks, handlers, limits, mismatch, share, sweep
from ui.views import plots, render, tree
from ui.classroom import lab as exactness_lab
from ui.classroom import three_ways as three_ways_tab
from ui.classroom import whatif as whatif_tab
from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground.presets import Presets, load_presets
from ui.playground.state import HISTORY_COLUMNS, SessionState, expire as expire_session

TITLE = "Speculative decoding playground"
INTRO = """# Speculative decoding playground
A small **draft** proposes *k* tokens; the **target** checks them all in one forward pass and keeps a prefix.
With the exact rule the output follows the target's distribution exactly; only the speed changes.
Hover any token for p, q, min(1, p/q), the draw and the decision."""

MISMATCH_EXPLANATION = """**Why token ids cannot cross tokenizers.** A token id is just an index into one \
tokenizer's vocabulary.
(a) The *naive-id* draft runs {draft} and hands its ids to SmolLM2 unchanged: the same number names unrelated
strings in the two vocabularies, so SmolLM2 rejects almost every draft (the output stays exact, the speed-up is \
gone).
(b) The *cross-tokenizer* draft decodes {draft}'s tokens to text and re-encodes that text with SmolLM2's tokenizer:
the same text, cut at different token boundaries, now arrives as SmolLM2's own ids.
(c) Same-tokenizer drafts (prompt lookup, layer skip) never have the problem; they are other drafters, drawn in grey
for scale. The lesson is (a) against (b), the same draft both ways; each whisker is the run's 90% interval over rounds.
All runs: the prompt above, greedy, k = 4, at most 40 new tokens. The other-tokenizer draft is Gemma 3 270M where its
package is installed, else GPT-2 124M from the Hugging Face Hub (not gated)."""



def tree_caption() -> str:
    """The Draft tree tab's caption. The tree drafts are named from the engine's registry, so a new one is never
    missing (suffix decoding was); no speed figure is quoted here, since one would be measured elsewhere and go stale:
    the numbers above the tabs are the run's own."""
    names = ", ".join(tree.tree_draft_names())
    return (f"A tree draft ({names}: pick one in the Draft list) proposes several continuations; the target scores "
            "every node in one forward. Each round is drawn as a tree from the last committed token: the kept path in "
            "green, siblings judged and refused in red, nodes never reached in grey, and the correction or bonus "
            "after the path. Hover a node for its p, q and the decision. Suffix decoding and the lookup tree copy "
            "what followed an earlier match of the text: a round without a match drafts nothing (the target takes a "
            "plain step), and such rounds are counted above the trees, not drawn. On this CPU a verify forward over "
            "many nodes costs more than a plain step, so a tree is often slower than plain decoding here: the "
            "numbers above say so, with its costs, when it is.")


TIME_CAPTION = ("**Where the time goes**, each round of the timed run in plain decoding steps: a round pays for itself "
                "when its tokens (◆) exceed its cost (the bar: draft + verify + overhead). On a CPU the verify bar "
                "grows with the rows a round checks; on a GPU verifying a few rows costs about one step (the dashed "
                "line).")
TOKEN_VIEW_HEIGHT = 430      # px; longer outputs scroll (and follow the newest round) so the plots stay in view
SCENARIO_CONTROLS = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed",
                     "rule", "chat")   # what callbacks.apply_scenario sets, in its order (then the caption)
RESIZE_JS = "() => { setTimeout(() => window.dispatchEvent(new Event('resize')), 50); }"
RUN_WAITERS = 32            # run handlers at once: each waits at the gate on a thread (anyio's pool has 40)
# Tab bars wrap onto a second row rather than hide the tabs that do not fit behind Gradio's "⋯" menu: at 1024 px the
# lower bar's last tabs (What if, About) were hidden there, where a class never finds them.
TAB_OVERFLOW = "wrap"
THEME = gr.themes.Soft(primary_hue="emerald", secondary_hue="blue")

# Below 1024 px Gradio stacks the two columns, which put the results after every control (the numbers 1,960 px and
# the tokens 2,272 px below the top of Run at 390x844). There the controls column lends its children to the main
# row (display: contents) and `order` puts the results column right after the Run row, the other controls after
# the results.
LAYOUT_CSS = """
.gradio-container { max-width: 1500px !important; }
#spec-tokens { min-height: 200px; }
@media (max-width: 1023px) {
  #spec-main { flex-direction: column; }
  #spec-controls { display: contents; }
  #spec-results { order: 1; }
  #spec-run-row ~ * { order: 2; }
}
"""


def launch_options() -> dict:
    """Everything launch() takes besides the address: app.py launches with it, and so does the tests' server
    (tests/conftest.py), so the browser tests see the page's own theme, layout CSS and early script (ui/page_head.py).
    Uploads are traces (spec_engine.classroom.trace caps them at 20 MiB): Gradio refuses larger files before they are
    stored. A new dict each time: Gradio adds its own entries to `app_kwargs`. Here, not in app.py, because importing
    app.py starts loading the default model."""
    return {"max_file_size": MAX_TRACE_BYTES, "theme": THEME, "css": LAYOUT_CSS,
            "app_kwargs": {"middleware": page_head.middleware()}}


@dataclass
class Controls:
    """The left column: `settings` holds the run's controls by name (handlers.RUN_INPUTS, SCENARIO_CONTROLS); the
    other fields are the buttons and pickers around them."""
    settings: dict[str, gr.components.Component]
    present: gr.Checkbox
    scenario: gr.Dropdown
    run_btn: gr.Button
    stop_btn: gr.Button
    caption: gr.Markdown
    example: gr.Dropdown
    draft_info: gr.Markdown
    baseline_btn: gr.Button
    sweep_btn: gr.Button


@dataclass
class LowerTabs:
    """The lower tab bar's components that the events wire (`out` gets the compare and KV outputs)."""
    axis: gr.Radio
    compare_runs: gr.Dropdown
    clear_btn: gr.Button
    mm_btn: gr.Button
    mm: dict[str, gr.components.Component]
    lab: dict[str, gr.components.Component]
    lab_events: list
    tabs: tuple          # tabs whose plots need their width when selected


def build_demo(default_target: str | None = None, presets: Presets | None = None, preload: bool = True) -> gr.Blocks:
    presets = presets or load_presets()
    default_target = default_target or se.models.default_model_name()
    if preload:
        reg.REGISTRY.start(default_target)
    initial = handlers.initial_outputs()
    skip_default = describe_default_skip(default_target)

    # A session's state expires session_ttl seconds after the last event that set it (handlers.renewing), and
    # Gradio's copies of the files it served (trace exports, uploads) once as old; state.expire deletes the rest.
    ttl = limits.current().session_ttl_seconds
    with gr.Blocks(title=TITLE, delete_cache=(max(1, math.ceil(ttl / 10)), math.ceil(ttl))) as demo:
        state = gr.State(SessionState, time_to_live=ttl, delete_callback=expire_session)
        gr.Markdown(INTRO)
        model_md = gr.Markdown(f"⏳ Loading {reg.display_name(default_target)}…", elem_id="spec-model-status")
        with gr.Row(equal_height=False, elem_id="spec-main"):
            controls = build_controls(presets, default_target, skip_default)
            out, tree_tab = build_results(initial)
        c = controls.settings
        shared = share.build_panel(demo, c, controls.scenario, controls.caption, presets, default_target)
        lower = build_lower_tabs(c, state, out, initial, default_target, skip_default)
        lower.tabs += (tree_tab,)
        wire_runs(controls, out, lower, state, presets, default_target)
        wire_callbacks(demo, controls, out, lower, state, presets, default_target, model_md)
    demo.spec_components = {**c, **out, **lower.mm, **lower.lab, **shared, "scenario": controls.scenario,
                            "example": controls.example, "present": controls.present}   # for tests
    return demo


def build_controls(presets: Presets, default_target: str, skip_default: str) -> Controls:
    """The controls column: scenario, Run / Stop, prompt, models, sampling, draft options and the extra buttons."""
    c: dict[str, gr.components.Component] = {}
    with gr.Column(scale=4, min_width=340, elem_id="spec-controls"):
        present = gr.Checkbox(False, label="Presentation mode (large type, high contrast)", elem_id="spec-present")
        scenario = gr.Dropdown([(s.label, s.id) for s in presets.scenarios], value=None,
                               label="Classroom scenario", info="Sets every control below and runs it",
                               elem_id="spec-scenario")
        # Beside the scenario picker, so Run and the results share the first screen (on a phone too: LAYOUT_CSS)
        with gr.Row(elem_id="spec-run-row"):
            run_btn = gr.Button("Run", variant="primary", elem_id="spec-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="spec-stop")
        caption = gr.Markdown("", elem_id="spec-caption")
        example = gr.Dropdown([(p.label, p.id) for p in presets.prompts], value=None, label="Example prompt")
        c["prompt"] = gr.Textbox(presets.prompts[0].text, lines=5, max_lines=14, label="Prompt",
                                 elem_id="spec-prompt")
        c["chat"] = gr.Checkbox(True, label="Apply the chat template", elem_id="spec-chat")
        draft_info = model_controls(c, default_target)
        sampling_controls(c)
        draft_options(c, skip_default)
        with gr.Row():
            baseline_btn = gr.Button("Measure the speedup again", size="sm", elem_id="spec-baseline")
            sweep_btn = gr.Button(f"Sweep k {list(sweep.SWEEP_K)}", size="sm", elem_id="spec-sweep")
        with gr.Row():
            c["auto_baseline"] = gr.Checkbox(True, label="Measure the speedup after each run (nothing drawn)")
            c["show_spaces"] = gr.Checkbox(False, label="Show spaces as ·")
    return Controls(c, present, scenario, run_btn, stop_btn, caption, example, draft_info, baseline_btn, sweep_btn)


def model_controls(c: dict, default_target: str) -> gr.Markdown:
    """Target, draft (with its lesson, returned) and k."""
    custom = limits.current().allow_custom_models
    c["target"] = gr.Dropdown(reg.target_choices(), value=default_target, label="Target model",
                              info="Hub models are listed but need network access"
                              + ("; or type a Hub id (owner/name)" if custom else ""),
                              allow_custom_value=custom, elem_id="spec-target")
    start_draft, start_k = drafts.default_draft(default_target)
    c["draft"] = gr.Dropdown(drafts.draft_choices(default_target), value=start_draft, label="Draft",
                             allow_custom_value=custom, elem_id="spec-draft")
    draft_info = gr.Markdown(drafts.kind_by_key(start_draft).lesson, elem_id="spec-draft-info")
    c["k"] = gr.Slider(1, se.MAX_K, value=start_k, step=1,
                       label="k: draft tokens per round (at most; drafts are cut to what pays)", elem_id="spec-k")
    return draft_info


def sampling_controls(c: dict) -> None:
    """Temperature, top-p, top-k, length, seed and the verification rule."""
    with gr.Row():
        c["temperature"] = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)",
                                     elem_id="spec-temperature")
        c["top_p"] = gr.Slider(0.05, 1, value=1, step=0.01, label="top-p", elem_id="spec-top-p")
    with gr.Row():
        c["top_k"] = gr.Number(0, precision=0, minimum=0, label="top-k (0 = off)", elem_id="spec-top-k")
        c["max_new_tokens"] = gr.Slider(1, limits.current().max_new_tokens, value=64, step=1,
                                        label="max new tokens", elem_id="spec-max-new")
        c["seed"] = gr.Number(0, precision=0, minimum=0, label="seed", elem_id="spec-seed")
    c["rule"] = gr.Radio(handlers.RULE_CHOICES, value="exact", label="Verification rule", elem_id="spec-rule",
                         info="exact and strict are exact; typical is lossy; the rest are mistakes kept "
                              "to be measured (the exactness lab shows all of them side by side)")


def draft_options(c: dict, skip_default: str) -> None:
    with gr.Accordion("Draft options", open=False):
        c["skip_layers"] = gr.Textbox("", label="Layer-skip: layers to skip",
                                      placeholder=f"default: {skip_default}",
                                      info="e.g. 21, 23, 25-27; empty = the default set")
        c["exit_after"] = gr.Slider(0, 64, value=0, step=1, label="Early exit: after this many layers",
                                    info=f"0 = the default: {se.EARLY_EXIT_AFTER} layers "
                                         "(one less than the target has, if fewer)")


def build_results(initial: dict) -> tuple[dict[str, gr.components.Component], gr.Tab]:
    """The results column: the numbers, the token views in tabs, and the plots; returns the outputs by name and the
    draft tree's tab."""
    out: dict[str, gr.components.Component] = {}
    with gr.Column(scale=7, min_width=480, elem_id="spec-results"):
        out["stats"] = gr.HTML(initial["stats"], css_template=render.CSS, elem_id="spec-stats")
        with gr.Tabs(overflow_behavior=TAB_OVERFLOW):
            with gr.Tab("Tokens"):
                gr.HTML(render.legend_view(), css_template=render.CSS, elem_id="spec-legend")
                out["tokens"] = gr.HTML(initial["tokens"], css_template=render.CSS, elem_id="spec-tokens",
                                        max_height=TOKEN_VIEW_HEIGHT, autoscroll=True,
                                        js_on_load=render.TOOLTIP_JS)
                out["explain"] = gr.Markdown("", elem_id="spec-explain")
            with gr.Tab("Draft tree", elem_id="spec-tree-tab") as tree_tab:
                gr.Markdown(tree_caption())
                out["tree_plot"] = gr.Plot(initial["tree_plot"], show_label=False, elem_id="plot-tree")
            with gr.Tab("Generated text"):
                out["text"] = gr.Textbox("", lines=8, label="Generated text (decoded)",
                                         buttons=["copy"], elem_id="spec-text")
            with gr.Tab("Run details (JSON)"):
                out["summary"] = gr.JSON({}, label="Summary of the latest run", elem_id="spec-summary")
        result_plots(out, initial)
    return out, tree_tab


def result_plots(out: dict, initial: dict) -> None:
    with gr.Row():
        out["acceptance_plot"] = gr.Plot(initial["acceptance_plot"], show_label=False, elem_id="plot-acceptance")
        out["accepted_plot"] = gr.Plot(initial["accepted_plot"], show_label=False, elem_id="plot-accepted")
    with gr.Row():
        out["forward_plot"] = gr.Plot(initial["forward_plot"], show_label=False, elem_id="plot-forward")
        out["speed_plot"] = gr.Plot(initial["speed_plot"], show_label=False, elem_id="plot-speed")
    gr.Markdown(TIME_CAPTION, elem_id="spec-time-caption")
    out["time_plot"] = gr.Plot(initial["time_plot"], show_label=False, elem_id="plot-time")
    out["position_plot"] = gr.Plot(initial["position_plot"], show_label=False, elem_id="plot-position")


def build_lower_tabs(c: dict, state: gr.State, out: dict, initial: dict, default_target: str,
                     skip_default: str) -> LowerTabs:
    """The lower tab bar: compare, KV cache, tokenizer mismatch, the classroom tabs and About."""
    with gr.Tabs(overflow_behavior=TAB_OVERFLOW):
        with gr.Tab("Compare runs") as compare_tab:
            axis, compare_runs, clear_btn = compare_panel(out, initial)
        with gr.Tab("KV cache") as kv_tab:
            kv_panel(out, initial)
        with gr.Tab("Tokenizer mismatch") as mm_tab:
            mm_btn, mm = mismatch_panel()
        lab = classroom.build_tabs(c, state)
        lab_events = exactness_lab.build_tab(c, state, RESIZE_JS) + sweeps.build_tab(c, state, RESIZE_JS)
        whatif_tab.build_tab(state)
        lab_events += three_ways_tab.build_tab(state, RESIZE_JS)
        with gr.Tab("About"):
            gr.Markdown(about_text(default_target, skip_default))
    return LowerTabs(axis, compare_runs, clear_btn, mm_btn, mm, lab, lab_events, (compare_tab, kv_tab, mm_tab))


def compare_panel(out: dict, initial: dict) -> tuple[gr.Radio, gr.Dropdown, gr.Button]:
    with gr.Row():
        axis = gr.Radio(list(plots.COMPARE_AXES), value="k", label="Compare by")
        compare_runs = gr.Dropdown([], value=[], multiselect=True, label="Runs to compare (none: every run)",
                                   info="runs of a classroom scenario are named by it (S5: scenario 5)",
                                   elem_id="spec-compare-runs")
    out["compare_plot"] = gr.Plot(initial["compare_plot"], show_label=False, elem_id="plot-compare")
    out["history"] = gr.Dataframe(initial["history"], headers=HISTORY_COLUMNS, interactive=False,
                                  label="Finished runs (newest first)", wrap=False,
                                  elem_id="spec-history", max_height=360)
    clear_btn = gr.Button("Clear history", size="sm")
    return axis, compare_runs, clear_btn


def kv_panel(out: dict, initial: dict) -> None:
    gr.Markdown("After the verify forward the target's cache holds the committed text plus all "
                "drafts; trimming keeps only the committed text (minus the newest token). "
                "Markers: before trimming; lines: after. Each round the target's cache grows by the "
                "accepted drafts + 1 (the correction or bonus): the \"target grew\" column. A tree round's "
                "forward writes every node; its kept path's entries are moved into place after the "
                "committed text and the other nodes' dropped: the \"tree entries\" column.")
    # The table gets the full width: its eight columns (the growth ones last) were cut off beside the plot.
    out["kv_table"] = gr.Dataframe(initial["kv_table"], headers=plots.KV_COLUMNS, interactive=False,
                                   label="Per round (newest first)", max_height=300,
                                   elem_id="spec-kv-table")
    out["kv_plot"] = gr.Plot(initial["kv_plot"], show_label=False, elem_id="plot-kv")


def mismatch_panel() -> tuple[gr.Button, dict[str, gr.components.Component]]:
    gr.Markdown(MISMATCH_EXPLANATION.format(draft=reg.short_name(reg.mismatch_draft_model())))
    mm_btn = gr.Button("Run the tokenizer-mismatch demo", variant="primary", elem_id="spec-mismatch")
    mm: dict[str, gr.components.Component] = {}
    mm["mm_status"] = gr.Markdown("", elem_id="spec-mismatch-status")
    mm["mm_table"] = gr.Dataframe(headers=mismatch.MISMATCH_COLUMNS, interactive=False, wrap=True,
                                  column_widths=mismatch.MISMATCH_WIDTHS,
                                  label="Same prompt, three kinds of draft", elem_id="spec-mismatch-table")
    with gr.Row():
        mm["mm_plot"] = gr.Plot(plots.mismatch_figure([]), show_label=False, scale=2,
                                elem_id="spec-mismatch-plot")
        mm["mm_tokenization"] = gr.HTML("", css_template=render.CSS, scale=3)
    mm["mm_views"] = gr.HTML("", css_template=render.CSS, js_on_load=render.TOOLTIP_JS)
    return mm_btn, mm


def wire_runs(controls: Controls, out: dict, lower: LowerTabs, state: gr.State, presets: Presets,
              default_target: str) -> None:
    """The events that decode: Run, a scenario, Sweep k, the baseline, the mismatch demo; and Stop, which cancels
    them all (the classroom tabs' too)."""
    c = controls.settings
    run_inputs = [c[name] for name in handlers.RUN_INPUTS] + [state]
    run_outputs = [out[name] for name in handlers.RUN_OUTPUTS] + [state]
    renewing = handlers.renewing
    # One model queue: at most `concurrency` runs decode at once (1 by default: honest timings); the rest wait
    # in Gradio's queue (at most limits.queue_size), which shows each waiting visitor its position.
    # preprocess=False: the validators and handlers check the raw values themselves (validate.py), so an
    # API caller gets the same named, readable errors as the UI, before the request takes a queue place.
    compute = {"concurrency_id": "compute", "concurrency_limit": limits.current().concurrency}
    # Runs wait at the engine's own gate instead (ui/playground/coalesce.py), where identical requests share
    # one computation and a waiting page shows its place in line and an estimate (app.AdmissionQueue counts
    # those waiting there against the queue size).
    runs = {"concurrency_id": "run",
            "concurrency_limit": min(RUN_WAITERS, limits.current().concurrency + limits.current().queue_size)}
    # Progress on the stats box only, minimal: the run streams its own progress (tokens, then a one-line status
    # while the speed is measured), and Gradio's overlays on every output kept the browser redrawing on the
    # engine's cores during the measurement. The one small tracker left (on the stats box) shows a waiting visitor
    # "queue: 2/3" before their run starts.
    checked = {"preprocess": False, "validator": handlers.validate_run, "show_progress": "minimal",
               "show_progress_on": [out["stats"]]}
    run_event = controls.run_btn.click(renewing(handlers.run), run_inputs, run_outputs, api_name="run", **runs,
                                       **checked)
    # One click per lesson: choosing a scenario sets the controls, then runs them as the Run button would.
    scenario_event = controls.scenario.input(
        functools.partial(callbacks.apply_scenario, presets=presets, default_target=default_target),
        [controls.scenario], [c[n] for n in SCENARIO_CONTROLS] + [controls.caption], api_visibility="private",
    ).success(renewing(handlers.run), run_inputs, run_outputs, api_visibility="private", **runs, **checked)
    sweep_event = controls.sweep_btn.click(renewing(sweep.sweep_k), run_inputs, run_outputs, api_name="sweep_k",
                                           **compute, **checked)
    base_event = controls.baseline_btn.click(renewing(handlers.measure_baseline), [state], run_outputs,
                                             api_name="baseline", **compute)
    mm_outputs = [lower.mm[name] if name in lower.mm else out[name] for name in mismatch.MISMATCH_OUTPUTS] + [state]
    mm_event = lower.mm_btn.click(renewing(mismatch.mismatch_demo),
                                  [c["prompt"], c["target"], c["max_new_tokens"], c["chat"], state],
                                  mm_outputs, api_name="mismatch", **compute, preprocess=False,
                                  validator=handlers.validate_mismatch)
    controls.stop_btn.click(renewing(handlers.stop), [state], run_outputs, api_name="stop", concurrency_limit=None,
                            cancels=[run_event, scenario_event, sweep_event, base_event, mm_event,
                                     *lower.lab_events])


def wire_callbacks(demo: gr.Blocks, controls: Controls, out: dict, lower: LowerTabs, state: gr.State,
                   presets: Presets, default_target: str, model_md: gr.Markdown) -> None:
    """The quick, private events: dropdowns, presentation mode, history and the page's first load."""
    c, private = controls.settings, {"api_visibility": "private"}
    c["target"].input(callbacks.on_target, [c["target"], c["draft"], state], [c["target"], c["draft"]], **private)
    c["draft"].change(callbacks.on_draft, [c["draft"], c["target"]], [controls.draft_info], **private)
    controls.present.change(None, [controls.present], None, js=render.PRESENTATION_JS, **private)
    controls.example.input(functools.partial(callbacks.apply_prompt, presets=presets), [controls.example],
                           [c["prompt"], c["chat"]], **private)
    c["show_spaces"].change(callbacks.rerender, [c["show_spaces"], state], [out["tokens"]], **private)
    lower.axis.change(callbacks.set_compare_axis, [lower.axis, state], [out["compare_plot"]], **private)
    lower.clear_btn.click(callbacks.clear_history, [state], [out["history"], out["compare_plot"]], **private)
    out["history"].change(handlers.compare_choices, [state], [lower.compare_runs], **private)
    lower.compare_runs.input(handlers.set_compare_runs, [lower.compare_runs, state], [out["compare_plot"]],
                             **private)
    demo.load(functools.partial(callbacks.model_status, default_target), None, [model_md], show_progress="hidden",
              **private)
    for tab in lower.tabs:   # plots drawn while their tab was hidden get their width now
        tab.select(None, None, None, js=RESIZE_JS, **private)


def describe_default_skip(target: str) -> str:
    return f"layers {', '.join(map(str, drafts.default_skip_layers()))} (spec_engine.DEFAULT_SKIP_LAYERS)"


def about_text(default_target: str, skip_default: str) -> str:
    return f"""**Words.** *Draft tokens*: the k proposals of a round. *Accepted*: the prefix the rule kept (green).
*Rejected*: the first draft the rule refused (red, struck through, shown where it was proposed). *Discarded*: the
drafts after it, never judged (faded). *Correction*: the token drawn at the rejection (orange). *Bonus*: the extra
token drawn when all k drafts were accepted (blue). A thin bar with a small number starts each round.

**Numbers.** Acceptance = accepted / drafted (a draft tree counts its depth: one path at most is kept). \
Tokens per target forward = tokens per round; the theory line is
(1 − a^(k+1)) / (1 − a) from the measured acceptance a. Speedup is measured, never estimated, and both sides
the same way: after the live run, its speculative decoding is run again and then plain decoding (one target forward
per token) with the same prompt, settings and seed, back to back, each with nothing drawn meanwhile (engine time,
prefill included). Drawing the live view shares the cores with the engine, so the live tokens/s is kept apart. The
draft cost c and verify cost v (seconds per round over one plain step) give the predicted speedup next to the
measured one. The line under the numbers says when each side was measured; timings on a shared machine vary from run
to run, so "Measure the speedup again" measures both again.

**Models.** The default target is {reg.display_name(default_target)}, which runs offline on a CPU. Layer-skip
default: {skip_default}. The UI only renders the engine's per-round events; it never computes a probability.

| model | parameters | available here |
|---|---|---|
{models_table()}"""


def models_table() -> str:
    rows = []
    for preset in se.list_presets():
        ok, reason = reg.availability(preset.name)
        rows.append(f"| {preset.display_name} | {preset.params} | {'yes: ' if ok else 'no: '}{reason} |")
    return "\n".join(rows)
