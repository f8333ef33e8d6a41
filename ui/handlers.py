"""Gradio handlers: generators that turn settings into streamed UI updates.

They validate inputs (user mistakes become `gr.Error`), call `runner` and render with `render` and `plots`.
Every output tuple follows RUN_OUTPUTS (or MISMATCH_OUTPUTS); values not worth resending are `gr.skip()`.
Per-user data lives in the `SessionState` passed in; the only process-wide object is the model registry.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from time import perf_counter

import gradio as gr
import pandas as pd

import spec_engine as se

from . import plots, render, runner
from . import registry as reg
from .presets import Presets
from .state import HISTORY_COLUMNS, RunSettings, SessionState, summarize

log = logging.getLogger("ui.handlers")

try:   # ZeroGPU on Hugging Face Spaces: the decorated handlers get a GPU while they run
    import spaces   # type: ignore[import-not-found]
    gpu = spaces.GPU(duration=120)
except Exception:   # not on a Space, or no `spaces` package: run as is
    def gpu(fn):
        return fn

RENDER_INTERVAL = 0.15          # seconds between streamed UI updates (the final round is always sent)
UI_MAX_NEW_TOKENS = 1024
SWEEP_K = (1, 2, 3, 4, 6, 8, 12)
MISMATCH_MAX_NEW_TOKENS = 40
MISMATCH_DRAFT_MODEL = "gemma-3-270m"

RUN_INPUTS = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule",
              "chat", "skip_layers", "exit_after", "auto_baseline", "show_spaces")
RUN_OUTPUTS = ("tokens", "stats", "text", "acceptance_plot", "accepted_plot", "forward_plot", "speed_plot",
               "kv_plot", "kv_table", "history", "compare_plot", "summary")
MISMATCH_OUTPUTS = ("mm_status", "mm_table", "mm_plot", "mm_views", "mm_tokenization", "history", "compare_plot")
MISMATCH_COLUMNS = ["draft", "what the target receives", "acceptance", "tokens/forward", "tok/s", "rounds", "note"]

RULE_CHOICES = [("exact (rejection sampling)", "exact"), ("top-p membership (wrong)", "topp_membership"),
                ("no residual (wrong)", "no_residual")]


# ----------------------------------------------------------------------------------------- input checks

def as_int(name: str, value, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise gr.Error(f"{name} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise gr.Error(f"{name} must be a whole number, got {value!r}")
    if not lo <= number <= hi:
        raise gr.Error(f"{name} must be between {lo} and {hi}, got {int(number)}")
    return int(number)


def as_float(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise gr.Error(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise gr.Error(f"{name} must be a finite number, got {value!r}")
    return number


def parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                   skip_layers="", exit_after=0) -> RunSettings:
    """Widget values -> RunSettings, or gr.Error saying what to change."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise gr.Error("The prompt is empty: type something for the model to continue.")
    if target not in reg.preset_names():
        raise gr.Error(f"Unknown target model {target!r}; pick one from the list.")
    problem = reg.check_draft_value(draft or "")
    if problem:
        raise gr.Error(f"Draft: {problem}")
    if rule not in se.RULES:
        raise gr.Error(f"Verification rule must be one of {', '.join(se.RULES)}, got {rule!r}")
    settings = RunSettings(
        target=target, draft=draft, k=as_int("k", k, 1, se.MAX_K),
        temperature=as_float("temperature", temperature), top_p=as_float("top-p", top_p),
        top_k=as_int("top-k", top_k, 0, 1_000_000),
        max_new_tokens=as_int("max new tokens", max_new_tokens, 1, min(UI_MAX_NEW_TOKENS, se.MAX_NEW_TOKENS)),
        seed=as_int("seed", seed, 0, 2**63 - 1), rule=rule, chat=bool(chat), prompt=prompt,
        skip_layers=str(skip_layers or ""), exit_after=as_int("exit after", exit_after or 0, 0, 1000))
    try:
        settings.sampling()
    except ValueError as exc:
        raise gr.Error(f"Sampling: {exc}") from None
    return settings


class friendly_errors:
    """Context manager: engine and loading errors -> gr.Error with a readable message; the app keeps serving."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (gr.Error, GeneratorExit)):
            return False
        import torch
        if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
            raise gr.Error("Out of memory: lower max new tokens, shorten the prompt or pick a smaller model.") from exc
        if isinstance(exc, ValueError):
            raise gr.Error(str(exc)) from exc
        if isinstance(exc, Exception):
            log.exception("run failed")
            raise gr.Error(f"Something went wrong: {type(exc).__name__}: {exc}") from exc
        return False


def relay(gen, view, stop=None):
    """Re-yield a generator's progress messages as UI updates; returns its return value, or None when the
    `stop` event is set first (loading goes on in the registry's thread; this run just stops waiting)."""
    while True:
        if stop is not None and stop.is_set():
            gen.close()
            return None
        try:
            message = next(gen)
        except StopIteration as done:
            return done.value
        yield view(message)


# ------------------------------------------------------------------------------------------------ views

def history_frame(state: SessionState) -> pd.DataFrame:
    return pd.DataFrame(state.history_rows(), columns=HISTORY_COLUMNS)


def compare_figure(state: SessionState):
    return plots.comparison_figure(state.summaries(), getattr(state, "compare_axis", "k"))


def status_text(record, summary: dict, running: bool) -> str:
    if running:
        return f"Decoding… round {summary['rounds']}, {summary['new_tokens']} tokens"
    reason = {"eos": "end of sequence", "max_new_tokens": "max new tokens reached",
              "cancelled": "stopped"}.get(record.stop_reason or "", record.stop_reason or "done")
    return f"Run {record.run_id} finished: {reason} after {summary['rounds']} rounds, {summary['new_tokens']} tokens"


def run_view(prep: runner.Prepared, state: SessionState, status: str | None = None, final: bool = False) -> tuple:
    record = prep.record
    baseline = state.baselines.get(record.baseline_key)
    summary = summarize(record, baseline)
    status = status or status_text(record, summary, running=not final)
    if final and baseline is None:
        status += ". Speedup: baseline pending (press 'Measure plain decoding')."
    tokens = render.view_html(record.fragments, render.prompt_html(prep.prompt_text, len(record.prompt_ids),
                                                                   record.settings.chat), status, legend=False)
    detail = dict(summary, text=prep.labeler.text(summary["tokens"]), settings=dataclasses.asdict(record.settings),
                  prompt_tokens=len(record.prompt_ids), final=final)
    return (
        tokens,
        render.stats_html(summary, status),
        detail["text"],
        plots.acceptance_figure(record.rounds),
        plots.accepted_figure(record.rounds),
        plots.forward_figure(record.rounds),
        plots.speed_figure(record.rounds, baseline),
        plots.kv_figure(record.rounds),
        pd.DataFrame(plots.kv_rows(record.rounds), columns=plots.KV_COLUMNS),
        history_frame(state) if final else gr.skip(),
        compare_figure(state) if final else gr.skip(),
        detail,
    )


def message_view(message: str) -> tuple:
    """Only the status changes (model loading, baseline measuring)."""
    return (gr.skip(), render.stats_html(None, message)) + (gr.skip(),) * (len(RUN_OUTPUTS) - 2)


def initial_outputs() -> dict[str, object]:
    empty = {
        "tokens": render.empty_view(legend=False), "stats": render.stats_html(None, "No run yet: press Run."), "text": "",
        "acceptance_plot": plots.acceptance_figure([]), "accepted_plot": plots.accepted_figure([]),
        "forward_plot": plots.forward_figure([]), "speed_plot": plots.speed_figure([]),
        "kv_plot": plots.kv_figure([]), "kv_table": pd.DataFrame([], columns=plots.KV_COLUMNS),
        "history": pd.DataFrame([], columns=HISTORY_COLUMNS), "compare_plot": plots.comparison_figure([]),
        "summary": {},
    }
    return empty


# --------------------------------------------------------------------------------------------- handlers

def decode(settings: RunSettings, state: SessionState, show_spaces: bool, auto_baseline: bool):
    """The run pipeline as UI updates: load (progress), rounds (throttled), baseline, final view."""
    state.stop_event.clear()
    prep = yield from relay(runner.prepare(settings, state, reg.REGISTRY, show_spaces), message_view, state.stop_event)
    if prep is None:
        yield message_view("Stopped while loading; the model keeps loading in the background for the next run.")
        return
    state.active = prep
    last = 0.0
    for event in runner.rounds(prep, state):
        now = perf_counter()
        if (event.finished or now - last >= RENDER_INTERVAL) and not state.stop_event.is_set():
            last = now
            yield run_view(prep, state)
    record = prep.record
    if record.recorded:        # the Stop handler recorded and rendered it; a later view would only race with it
        return
    if auto_baseline and record.stop_reason != "cancelled" and state.baseline_for(record) is None:
        yield message_view("Measuring plain decoding with the same prompt, settings and seed…")
        runner.baseline(prep.target, record, state)
        if record.recorded:
            return
    state.finish(record)
    yield run_view(prep, state, final=True)


@gpu
def run(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
        exit_after, auto_baseline, show_spaces, state: SessionState):
    """Run button / api_name="run": streams one update per round (at most every RENDER_INTERVAL s)."""
    settings = parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                              skip_layers, exit_after)
    with friendly_errors():
        yield from decode(settings, state, bool(show_spaces), bool(auto_baseline))


def stop(state: SessionState):
    """Stop button: the engine polls this flag between rounds; the run is recorded as it stands."""
    state.stop_event.set()
    prep = getattr(state, "active", None)
    if prep is None or prep.record.recorded or not prep.record.rounds:
        return (gr.skip(),) * len(RUN_OUTPUTS)
    state.finish(prep.record, "cancelled")
    return run_view(prep, state, status=f"Stopped after {len(prep.record.rounds)} rounds", final=True)


@gpu
def measure_baseline(state: SessionState):
    """'Measure plain decoding' button: (re)measure the baseline of the latest run, then show the speedup
    everywhere (every run in the history with the same baseline key uses the new measurement)."""
    prep = getattr(state, "active", None)
    if prep is None or not prep.record.rounds:
        raise gr.Error("Run something first: the baseline uses the latest run's prompt, settings and seed.")
    state.stop_event.clear()
    with friendly_errors():
        yield message_view("Measuring plain decoding with the same prompt, settings and seed…")
        if runner.baseline(prep.target, prep.record, state, force=True) is None:
            yield message_view("Baseline stopped.")
            return
        yield run_view(prep, state, final=True)


@gpu
def sweep_k(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
            exit_after, auto_baseline, show_spaces, state: SessionState):
    """Run the current settings for several k (one plain-decoding baseline serves all) into the history."""
    base = parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                          skip_layers, exit_after)
    state.stop_event.clear()
    with friendly_errors():
        for n, k_value in enumerate(SWEEP_K):
            if state.stop_event.is_set():
                break
            settings = dataclasses.replace(base, k=k_value)
            label = f"Sweep {n + 1}/{len(SWEEP_K)}: k = {k_value}"
            prep = yield from relay(runner.prepare(settings, state, reg.REGISTRY, bool(show_spaces)),
                                    lambda m: message_view(f"{label}: {m}"))
            state.active = prep
            yield message_view(f"{label}: decoding…")
            for _ in runner.rounds(prep, state):
                pass
            if prep.record.recorded:
                return
            if state.baseline_for(prep.record) is None:
                yield message_view(f"{label}: measuring plain decoding once for the sweep…")
                runner.baseline(prep.target, prep.record, state)
            state.finish(prep.record)
            yield run_view(prep, state, status=f"{label} done", final=True)


def mismatch_drafts(target: str) -> list[tuple[str, str, str]]:
    """(draft value, label, what the target receives) for the tokenizer-mismatch demo."""
    return [
        (f"{MISMATCH_DRAFT_MODEL}:naive-ids", "(a) naive ids", "Gemma's token ids, reused as SmolLM2 ids"),
        (f"{MISMATCH_DRAFT_MODEL}:cross-tokenizer", "(b) cross-tokenizer", "Gemma's text, re-tokenized by SmolLM2"),
        ("prompt-lookup", "(c) same tokenizer", "SmolLM2 ids copied from the context"),
        ("layer-skip", "(c') same tokenizer", "SmolLM2 ids from the target minus some layers"),
    ]


@gpu
def mismatch_demo(prompt, target, max_new_tokens, chat, state: SessionState):
    """Same prompt, greedy, k=4, with a naive-id draft, a cross-tokenizer draft and same-tokenizer drafts."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise gr.Error("The prompt is empty: type something first.")
    n_tokens = min(as_int("max new tokens", max_new_tokens, 1, UI_MAX_NEW_TOKENS), MISMATCH_MAX_NEW_TOKENS)
    state.stop_event.clear()
    results, views = [], []
    skip = (gr.skip(),) * (len(MISMATCH_OUTPUTS) - 1)
    with friendly_errors():
        for draft, label, receives in mismatch_drafts(target):
            settings = RunSettings(target=target, draft=draft, k=4, temperature=0.0, top_p=1.0, top_k=0,
                                   max_new_tokens=n_tokens, seed=0, rule="exact", chat=bool(chat), prompt=prompt)
            prep = yield from relay(runner.prepare(settings, state, reg.REGISTRY),
                                    lambda m: (f"{label}: {m}",) + skip)
            yield (f"{label}: decoding {n_tokens} tokens…",) + skip
            for _ in runner.rounds(prep, state):
                pass
            state.finish(prep.record)
            summary = summarize(prep.record)
            notes = sorted({r.note for r in prep.record.rounds if r.note})
            results.append(dict(summary, label=label, receives=receives, note="; ".join(notes)))
            views.append((label, receives, summary, prep))
            if state.stop_event.is_set():
                break
        table = pd.DataFrame([[r["label"] + ": " + r["draft"], r["receives"], round(r["acceptance_rate"], 3),
                               round(r["tokens_per_forward"], 2), round(r["tokens_per_second"], 1), r["rounds"],
                               r["note"]] for r in results], columns=MISMATCH_COLUMNS)
        yield ("Done: hover the tokens to see why each draft was accepted or rejected.", table,
               plots.mismatch_figure(results), mismatch_views_html(views), tokenization_demo(views, target),
               history_frame(state), compare_figure(state))


def mismatch_views_html(views) -> str:
    parts = []
    for label, receives, summary, prep in views:
        head = (f'<div class="mm-head"><b>{render.esc(label)}</b>: {render.esc(receives)} · acceptance '
                f'{summary["acceptance_rate"]:.0%} · {summary["tokens_per_forward"]:.2f} tokens per target forward</div>')
        parts.append(head + f'<div class="mm-box">{render.view_html(prep.record.fragments, legend=False)}</div>')
    return "".join(parts)


def tokenization_demo(views, target: str) -> str:
    """The same generated text cut by both tokenizers: different boundaries, and different ids for a piece."""
    same = next((prep for label, _, _, prep in views if "same" in label), None)
    if same is None:
        return ""
    text = same.labeler.text(same.record.tokens[:14])
    rows = []
    for name in (target, MISMATCH_DRAFT_MODEL):
        loaded = reg.REGISTRY.loaded(name)
        if loaded is None:
            continue
        ids = loaded.tokenizer.encode(text, add_special_tokens=False)
        labeler = reg.REGISTRY.labeler(loaded)
        rows.append((reg.display_name(name), [(i, labeler(i)) for i in ids]))
    return render.tokenization_html(text, rows)


def rerender(show_spaces, state: SessionState):
    """'Show spaces' toggle: re-render the current run's rounds."""
    prep = getattr(state, "active", None)
    if prep is None or not prep.record.rounds:
        return gr.skip()
    prep.options = dataclasses.replace(prep.options, show_spaces=bool(show_spaces))
    prep.record.fragments = [render.round_html(ev, prep.labeler, prep.options) for ev in prep.record.rounds]
    status = status_text(prep.record, summarize(prep.record), running=not prep.record.recorded)
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
    ok, reason = reg.availability(target)
    previous = getattr(state, "target", None) or next(iter(reg.preset_names()))
    if not ok:
        gr.Warning(f"{reg.display_name(target)} is unavailable here: {reason}")
        return gr.update(value=previous), gr.update()
    state.target = target
    choices = reg.draft_choices(target)
    values = [value for _, value in choices]
    return gr.update(), gr.update(choices=choices, value=draft if draft in values else values[0])


def on_draft(draft, target):
    """Describe the chosen draft; warn if its model cannot load here."""
    try:
        kind, spec = reg.split_draft(draft)
    except ValueError:
        return gr.update()
    if spec.model is not None:
        ok, reason = reg.availability(spec.model)
        if not ok:
            gr.Warning(f"{reg.display_name(spec.model)} is unavailable here: {reason}")
    return kind.lesson


def apply_scenario(scenario_id, presets: Presets, default_target: str):
    """Scenario dropdown: set every control it names, and show its caption."""
    if not scenario_id:
        return (gr.skip(),) * 12
    s = presets.scenario(scenario_id)
    target = s.target or default_target
    choices = reg.draft_choices(target)
    return (s.prompt, target, gr.update(choices=choices, value=s.draft), s.k, s.temperature, s.top_p, s.top_k,
            s.max_new_tokens, s.seed, s.rule, s.chat, f"**{s.label}.** {s.caption}")


def apply_prompt(prompt_id, presets: Presets):
    if not prompt_id:
        return gr.skip(), gr.skip()
    p = presets.prompt(prompt_id)
    return p.text, p.chat


def model_status(default_target: str):
    """Page load: show the default target's loading progress until it is ready."""
    entry = reg.REGISTRY.start(default_target)
    while not entry.done.wait(0.5):
        yield f"⏳ {reg.display_name(default_target)}: {reg.REGISTRY.status(default_target)}"
    yield model_status_line(default_target)


def model_status_line(default_target: str) -> str:
    parts = []
    for preset in se.list_presets():
        status = reg.REGISTRY.status(preset.name)
        if status != "not loaded":
            parts.append(f"{preset.display_name}: {status}")
    return "Models: " + (" · ".join(parts) if parts else "none loaded yet")
