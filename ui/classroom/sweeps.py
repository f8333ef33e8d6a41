"""The "Sweeps" tab: one click runs the main panel's prompt and settings for k = 1..8, a list of temperatures,
or a list of drafts, and plots measured acceptance, tokens per target forward (with the analytic curve at the
measured acceptance) and measured speedup over plain decoding (median and min-max over repeated runs, beside the
speedup predicted from the measured draft and verify costs); a best is marked only when it beats the others beyond
that spread, and settings that gave identical rounds are named. The runs are done by
`spec_engine.classroom.sweep`; they do not enter the run history (the quick "Sweep k" button beside Run does that).
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import pandas as pd

import spec_engine as se
from spec_engine.classroom import sweep

from ui.playground import coalesce, compute, engine_thread, handlers, runner, validate
from ui.views import lab_plots
from ui.classroom import lab as exactness_lab
from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground.state import RunSettings
from ui.views.render import esc

AXIS_CHOICES = [("k = 1..8", "k"), ("temperature 0..1.5", "temperature"), ("drafts", "draft")]
MAX_POINTS = 16
MAX_TEMPERATURE = 2.0
OUTPUTS = ("status", "plot", "table")

CAPTION = """**When does it pay?** One click runs the main panel's prompt and settings (same seed) for each k,
temperature or draft below, measures plain decoding once per sampling setting, and plots measured acceptance,
tokens per target forward against the analytic (1 − a^(k+1)) / (1 − a) at the measured acceptance a, and the
measured speedup (median, with min-max bars over the repeats) beside the speedup E/(v + c) predicted from the
measured draft and verify costs. Timings are wall-clock on this machine and vary: a star marks a best only when it
beats every other setting beyond that spread; otherwise the sweep says "within noise". Drafters that cut their
drafts to what pays (prompt lookup, the EAGLE head) stop changing above some k; **fixed-length drafts** makes them
draft k every round, as the theory line assumes. The verify cost v (in plain decoding steps) is measured from the
runs themselves: on a busy shared machine (more runnable threads than cores) a verify forward over several rows can
cost many plain steps (measured at a load of 6-8 on 2 cores: 4 rows ×3.2 one row with 2 threads, ×1.5 with one), so
v and the speedups read low there; the server's `--threads 1` helps."""


def available_drafts(target: str) -> list[str]:
    """The draft values of the main panel's list that can run here for `target`."""
    out = []
    for _, value in drafts.draft_choices(target):
        _, spec = drafts.split_draft(value)
        if spec.model is None or reg.availability(spec.model)[0]:
            out.append(value)
    return out


def default_values(axis: str, target: str | None = None) -> str:
    if axis == "temperature":
        return ", ".join(f"{t:g}" for t in sweep.DEFAULT_TEMPERATURES)
    if axis == "draft":
        return ", ".join(available_drafts(target or se.models.default_model_name()))
    return ", ".join(str(k) for k in sweep.DEFAULT_KS)


def parse_values(axis: str, text, target: str) -> list:
    """The values box -> a list for `sweep.sweep_points`, or gr.Error naming the bad entry."""
    items = [part.strip() for part in str(text or "").replace(";", ",").split(",") if part.strip()]
    if not items:
        raise gr.Error(f"List at least one {axis} value, separated by commas (e.g. {default_values(axis, target)})")
    if len(items) > MAX_POINTS:
        raise gr.Error(f"A sweep runs at most {MAX_POINTS} settings, got {len(items)}")
    if axis == "k":
        return [handlers.as_int("k", item, 1, se.MAX_K) for item in items]
    if axis == "temperature":
        values = [handlers.as_float("temperature", item) for item in items]
        bad = [v for v in values if not 0 <= v <= MAX_TEMPERATURE]
        if bad:
            raise gr.Error(f"temperatures must lie in [0, {MAX_TEMPERATURE:g}], got {bad[0]:g}")
        return values
    for item in items:
        problem = drafts.check_draft_value(item)
        if problem:
            raise gr.Error(f"Draft {item!r}: {problem}")
        kind, _ = drafts.split_draft(item)
        ok, reason = kind.available(target)
        if not ok:
            raise gr.Error(f"Draft {item!r} is not available for {reg.display_name(target)}: {reason}")
    return items


def check_axis(axis) -> str:
    if axis not in sweep.AXES:
        raise validate.InputError("axis", f"Sweep over one of {', '.join(sweep.AXES)}, got {validate.shown(axis)}")
    return axis


def sweep_validator(axis, values, prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                    chat, skip_layers, exit_after, state=None, repeats=sweep.DEFAULT_REPEATS,
                    fixed_length=False) -> list[dict]:
    """`validator=` of lab_sweep: the axis and its values, then the main panel's settings as a run checks them,
    the session state, the repeats and the fixed-length switch."""
    run = validate.run_validator(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                 chat, skip_layers, exit_after, True, False)[:len(validate.RUN_FIELDS)]
    known_target = target if isinstance(target, str) and target in reg.preset_names() else None
    axis_and_values = validate.verdicts(
        lambda: check_axis(axis),
        (lambda: parse_values(axis, values, known_target)) if axis in sweep.AXES and known_target else None)
    return axis_and_values + run + validate.verdicts(None, lambda: check_repeats(repeats),
                                                    lambda: validate.check_bool("fixed_length", fixed_length))


def sweep_view(rows, axis: str, status: str, sized: bool = True) -> tuple:
    """(status markdown, figure, table) for the rows so far (run_sweep's stream; the newest row of each point)."""
    rows = sweep.latest(rows)
    verdict = sweep.verdict(rows, axis, sized)
    table = pd.DataFrame(lab_plots.sweep_rows(rows, verdict.best), columns=lab_plots.SWEEP_COLUMNS)
    text = esc(status) + (f"\n\n{esc(verdict.text)}" if verdict.text else "")
    return text, lab_plots.sweep_figure(rows, axis, verdict.best), table


def describe(settings, repeats: int = 1, fixed_length: bool = False) -> str:
    drafts = ("fixed-length drafts (k every round where the drafter can)" if fixed_length else
              "drafts sized by the drafter (cost- or confidence-sized drafters cut them to what pays)")
    return (f"{reg.display_name(settings.target)}, draft {settings.draft}, k = {settings.k}, temperature "
            f"{settings.temperature:g}, top-p {settings.top_p:g}, top-k {settings.top_k}, rule {settings.rule}, "
            f"seed {settings.seed}, at most {settings.max_new_tokens} new tokens; {drafts}; {repeats} "
            f"repeat{'s' if repeats != 1 else ''} of each run")


def check_repeats(repeats) -> int:
    return handlers.as_int("repeats", repeats, 1, sweep.MAX_REPEATS)


def run_sweep(axis, values, prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
              skip_layers, exit_after, state, repeats=sweep.DEFAULT_REPEATS, fixed_length=False,
              progress=gr.Progress()):
    """'Run the sweep' / api_name="lab_sweep": one row per point, updated after each of its repeats, streamed.
    Ends early (and says so) on Stop or at the server's time limit (ui.playground.limits.max_run_seconds)."""
    check_axis(axis)
    settings = handlers.parse_settings(prompt=prompt, target=target, draft=draft, k=k, temperature=temperature,
                                       top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, seed=seed, rule=rule,
                                       chat=chat, skip_layers=skip_layers, exit_after=exit_after)
    values = parse_values(axis, values, settings.target)
    repeats = check_repeats(repeats)
    state.stop_event.clear()
    budget, held = runner.Budget(state.stop_event), []
    try:
        with handlers.friendly_errors():
            yield from sweep_runs(axis, values, settings, budget, held, progress, repeats,
                                  validate.check_bool("fixed_length", fixed_length, "fixed-length drafts"))
    finally:
        budget.cancel.set()
        for name in held:
            reg.REGISTRY.release(name)


@dataclass(frozen=True)
class SweepJob:
    """One sweep for `sweep_job`: the main panel's settings and the points, checked."""
    axis: str
    points: tuple
    settings: RunSettings
    prompt_ids: tuple[int, ...]
    repeats: int
    fixed_length: bool
    seconds: float


@compute.gpu(compute.job_seconds)
def sweep_job(job: SweepJob, stop: compute.Stop):
    """Yields a SweepRow after every run (spec_engine.classroom.sweep.run_sweep); ends early at Stop or at the
    job's deadline."""
    import torch
    s = job.settings
    split = {p.draft: drafts.split_draft(p.draft) for p in job.points}
    target = compute.loaded(s.target)
    models = {spec.model: compute.loaded(spec.model) for _, spec in split.values() if spec.model}
    options = drafts.DraftOptions(skip_layers=s.skip_layers, exit_after=s.exit_after, fixed_length=job.fixed_length)

    def make_drafter(name: str) -> se.Drafter:
        kind, spec = split[name]
        return drafts.build_drafter(spec, target, models.get(spec.model), options)

    input_ids = torch.tensor([list(job.prompt_ids)], dtype=torch.long, device=target.device)
    for p in job.points:
        se.validate_request(target.model, input_ids, p.k, s.max_new_tokens, p.sampling)
    budget = runner.Budget(stop, job.seconds)
    budget.start()
    yield from engine_thread.iterate(         # CPU work runs on the engine's thread (engine_thread.py)
        sweep.run_sweep(target.model, make_drafter, input_ids, job.axis, list(job.points), s.max_new_tokens,
                        s.seed, s.rule, reg.eos_ids(target), budget.should_stop, repeats=job.repeats),
        engine_thread.for_device(target.device))


def sweep_runs(axis: str, values: list, settings, budget, held: list[str], progress, repeats: int = 1,
               fixed_length: bool = False):
    skip = (gr.skip(),) * (len(OUTPUTS) - 1)
    try:
        points = sweep.sweep_points(axis, values, settings.draft, settings.k, settings.sampling())
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    names = [settings.target] + [spec.model for _, spec in (drafts.split_draft(p.draft) for p in points) if spec.model]
    models = yield from handlers.relay(runner.load(names, reg.REGISTRY, held), lambda m: (esc(m),) + skip,
                                       budget.stop_event)
    if models is None:
        return
    prompt_ids = runner.encode(models[settings.target], settings.prompt, settings.chat)
    about, sized, total = describe(settings, repeats, fixed_length), not fixed_length, len(points) * repeats
    job = SweepJob(axis, tuple(points), settings, tuple(prompt_ids), repeats, fixed_length,
                   compute.call_seconds(budget, 2 * total * settings.max_new_tokens))
    rows: list[sweep.SweepRow] = []
    progress(0, desc=f"run 1 of {total}")
    yield sweep_view(rows, axis, f"Running {total} runs ({len(points)} settings × {repeats}; plain decoding is "
                                 f"measured once per sampling setting and pass)… {about}", sized)
    for row in compute.pull(sweep_job(job, compute.Stop(budget.stop_event)), budget.stop_event, gated=True):
        if isinstance(row, coalesce.Waiting):
            yield sweep_view(rows, axis, row.text("Waiting for the model") + f"… {about}", sized)
            continue
        rows.append(row)
        progress(len(rows) / total, desc=f"{len(rows)} of {total} runs done")
        yield sweep_view(rows, axis, f"Measured {axis} = {row.value}, repeat {row.repeats} of {repeats} "
                                     f"({len(rows)} of {total} runs)… {about}", sized)
    if len(rows) < total:
        why = "Stopped" if budget.stop_event.is_set() else f"Time limit ({job.seconds:g} s) reached"
        yield sweep_view(rows, axis, f"{why} after {len(rows)} of {total} runs (a run cut short is not shown). "
                                     f"{about}", sized)
        return
    yield sweep_view(rows, axis, f"Done: {len(sweep.latest(rows))} settings, {len(rows)} runs. {about}", sized)


def on_axis(axis, target):
    return default_values(axis, target)


def build_tab(c: dict, state, resize_js: str | None = None) -> list:
    """The "Sweeps" tab (call inside a gr.Tabs). Returns the events the Stop button should cancel."""
    with gr.Tab("Sweeps", elem_id="sweeps-tab") as tab:
        gr.Markdown(CAPTION)
        with gr.Row():
            axis = gr.Radio(AXIS_CHOICES, value="k", label="Sweep over", elem_id="sweep-axis")
            values = gr.Textbox(default_values("k"), label="Values (comma separated)", elem_id="sweep-values",
                                info="k: 1-16; temperature: 0-2; drafts: names as in the Draft list")
            run_btn = gr.Button("Run the sweep", variant="primary", elem_id="sweep-run")
        with gr.Row():
            repeats = gr.Slider(1, sweep.MAX_REPEATS, value=sweep.DEFAULT_REPEATS, step=1, label="Repeats",
                                elem_id="sweep-repeats",
                                info="each run is repeated; a best is named only beyond the spread of the repeats")
            fixed = gr.Checkbox(False, label="Fixed-length drafts", elem_id="sweep-fixed-length",
                                info="draft k every round (no cutting to what pays), as the theory line assumes")
        out = {"status": gr.Markdown("", elem_id="sweep-status"),
               "plot": gr.Plot(lab_plots.sweep_figure([], "k"), show_label=False, elem_id="sweep-plot"),
               "table": gr.Dataframe(pd.DataFrame([], columns=lab_plots.SWEEP_COLUMNS),
                                     headers=lab_plots.SWEEP_COLUMNS, interactive=False, label="Runs",
                                     elem_id="sweep-table")}
    names = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule",
             "chat", "skip_layers", "exit_after")
    event = run_btn.click(run_sweep, [axis, values] + [c[n] for n in names] + [state, repeats, fixed],
                          [out[n] for n in OUTPUTS], api_name="lab_sweep", preprocess=False,
                          validator=sweep_validator, **exactness_lab.compute())
    private = {"api_visibility": "private"}
    axis.input(on_axis, [axis, c["target"]], [values], **private)
    if resize_js:
        tab.select(None, None, None, js=resize_js, **private)
    return [event]

