"""The run path's Gradio handlers (Run, Stop, Measure again) and the helpers the other handlers share
(`friendly_errors`, `relay`, `fold`, `run_view`): generators that turn settings into streamed UI updates. The
tokenizer-mismatch demo is in `mismatch`, Sweep k in `sweep`, the controls' callbacks in `callbacks`.

They validate inputs with `validate` (user mistakes become `gr.Error`; the same checks run earlier as the
events' `validator=`), prepare a run with `runner`, ask a GPU function (`compute.run_job`) for its results, fold
them into the session (`fold`) and render with `render` and `plots`. Every output tuple follows RUN_OUTPUTS (or
MISMATCH_OUTPUTS); values not worth resending are `gr.skip()`. Per-user data lives in the `SessionState` passed
in and never reaches a GPU function (on ZeroGPU those run in another process: see compute.py); the only
process-wide objects are the model registry and the limits.

Computing handlers yield once per engine round (an all-skip update between renders), so when Gradio closes
the generator (Stop's `cancels=`, a cancelled API job, a closed tab) it ends within one round; every run ends
in `runner.release`, which closes its GPU function and lets go of the models it held, however it ended.
"""
from __future__ import annotations

import functools
import dataclasses
import logging
import time
from time import perf_counter

import gradio as gr
import pandas as pd

import spec_engine as se

from ui.playground import batching, coalesce, compute, engine_thread, limits, runner, validate
from ui.views import plots, render, tree
from ui.playground import registry as reg
from ui.playground.state import HISTORY_COLUMNS, RunSettings, SessionState

log = logging.getLogger("ui.playground.handlers")

RENDER_INTERVAL = 0.15          # seconds between streamed UI updates (the final round is always sent)
# Seconds between streamed updates of the plots and the KV table (the tokens and stats go every RENDER_INTERVAL):
# re-drawing five Plotly figures at every update kept the browser's main thread busy 64-97% of the time while a run
# streamed (long tasks, measured in headless Chromium), so a click on Stop waited seconds for its turn.
PLOT_INTERVAL = 1.0
UI_MAX_NEW_TOKENS = 1024        # the engine allows 2048; the server's cap is limits.current().max_new_tokens

RUN_INPUTS = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule",
              "chat", "skip_layers", "exit_after", "auto_baseline", "show_spaces")
RUN_OUTPUTS = ("tokens", "stats", "text", "acceptance_plot", "accepted_plot", "forward_plot", "speed_plot",
               "kv_plot", "kv_table", "history", "compare_plot", "summary", "explain", "tree_plot", "position_plot",
               "time_plot")

RULE_CHOICES = [(se.RULE_INFO[name].label, name) for name in se.RULES]      # spec_engine.core.rule.RULE_INFO


# ----------------------------------------------------------------------------------------- input checks

def as_int(name: str, value, lo: int, hi: int) -> int:
    """A whole number in [lo, hi] or gr.Error naming `name` (see validate.check_int)."""
    return validate.check_int(name, value, lo, hi)


def as_float(name: str, value) -> float:
    """A finite number or gr.Error naming `name` (see validate.check_number)."""
    return validate.check_number(name, value)


def parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                   skip_layers="", exit_after=0) -> RunSettings:
    """Widget or API values -> RunSettings, or gr.Error saying what to change (validate.check_settings)."""
    return validate.check_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                   chat, skip_layers, exit_after)


validate_run = validate.run_validator            # validator= of run and sweep_k (same inputs)
validate_mismatch = validate.mismatch_validator  # validator= of mismatch


class friendly_errors:
    """Context manager: engine and loading errors -> gr.Error with a readable message and no local paths;
    the app keeps serving."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, GeneratorExit):
            return False
        if isinstance(exc, gr.Error):
            exc.message = validate.public_message(exc.message)
            return False
        import torch
        if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
            raise gr.Error("Out of memory: lower max new tokens, shorten the prompt or pick a smaller model.") from exc
        if isinstance(exc, ValueError):
            raise gr.Error(validate.public_message(exc), print_exception=False) from exc
        if isinstance(exc, Exception):
            log.exception("run failed")
            raise gr.Error(validate.public_message(f"Something went wrong: {type(exc).__name__}: {exc}")) from exc
        return False


def renewing(handler):
    """`handler` (a generator whose last argument is the session's state) with that state appended to each update,
    for an event that lists the state as its last output. Gradio counts a gr.State's time_to_live from the latest
    time an event output it, and never for a state that is only read, as the runs read theirs; so each update of a
    run renews its session's. gradio_client leaves State outputs out of an API caller's results. The state is the
    last SessionState argument: a gr.Request, which Gradio adds where the handler's signature asks for it (run's),
    may follow it."""
    @functools.wraps(handler)
    def renewed(*args):
        state = next(a for a in reversed(args) if isinstance(a, SessionState))
        updates = handler(*args)
        try:
            for update in updates:
                yield (*update, state)
        finally:        # a cancelled job or a closed tab closes this generator: the handler's `finally` runs now,
            updates.close()     # releasing its models, not whenever a garbage collection finds it
    return renewed


def relay(gen, view, stop=None):
    """Re-yield a generator's progress messages as UI updates; returns its return value, or None when the
    `stop` event is set first (loading goes on in the registry's thread; this run just stops waiting)."""
    try:
        while True:
            if stop is not None and stop.is_set():
                return None
            try:
                message = next(gen)
            except StopIteration as done:
                return done.value
            yield view(message)
    finally:
        gen.close()     # also when this generator is closed: the inner one's cleanup runs now


# ------------------------------------------------------------------------------------------------ views

def history_frame(state: SessionState) -> pd.DataFrame:
    return pd.DataFrame(state.history_rows(), columns=HISTORY_COLUMNS)


def compare_figure(state: SessionState):
    return plots.comparison_figure(state.compared(), getattr(state, "compare_axis", "k"))


def compare_choices(state: SessionState):
    """The run picker of the comparison: every run in the history, by number and scenario; the selection keeps the
    runs still there."""
    choices = [(f"#{r.run_id} · {r.scenario or r.draft_label}", r.run_id) for r in reversed(state.history)]
    present = {r.run_id for r in state.history}
    state.compare_runs = [i for i in state.compare_runs if i in present]
    return gr.update(choices=choices, value=list(state.compare_runs))


def set_compare_runs(selected, state: SessionState):
    """Compare only the selected runs (none selected: every run)."""
    present = {r.run_id for r in state.history}
    state.compare_runs = [int(i) for i in (selected or [])
                          if isinstance(i, (int, float)) and i == i and abs(i) < 2**31 and int(i) in present]
    return compare_figure(state)


def status_text(record, summary: dict, running: bool, batch: int = 0) -> str:
    if running:
        within = f" in a batch of {batch} runs" if batch > 1 else ""
        return f"Decoding{within}… round {summary['rounds']}, {summary['new_tokens']} tokens"
    reason = {"eos": "end of sequence", "max_new_tokens": "max new tokens reached", "cancelled": "stopped",
              runner.TIME_LIMIT: "stopped at this server's time limit "
                                 f"({record.time_limit or limits.current().max_run_seconds:g} s)"
              }.get(record.stop_reason or "", record.stop_reason or "done")
    if not summary["rounds"] and record.stop_reason in ("cancelled", runner.TIME_LIMIT):
        return f"Run {record.run_id} finished: {reason} while reading the prompt, before the first round"
    return f"Run {record.run_id} finished: {reason} after {summary['rounds']} rounds, {summary['new_tokens']} tokens"


def speed_note(summary: dict) -> str:
    """Where the speed figures come from, in one line under the numbers (the baseline's provenance too, and how
    the run was computed: shared with another student, measured under load)."""
    labels = "".join(f" {label[:1].upper()}{label[1:]}." for label in summary.get("labels") or ())
    if not summary.get("timed"):
        return (f"Tokens/s as drawn live ({summary['live_tokens_per_second']:.1f}); drawing the view shares the "
                "cores, so the speedup is measured only without drawing (press 'Measure the speedup again')." + labels)
    parts = [f"Speed: speculative {summary['timing']}"]
    if summary.get("baseline_timing"):
        parts.append(f"plain decoding {summary['baseline_timing']}")
    return "; ".join(parts) + "; same prompt, settings and seed." + labels


def run_view(prep: runner.Prepared, state: SessionState, status: str | None = None, final: bool = False,
             with_plots: bool = True) -> tuple:
    """Every output of a run as it stands; without `with_plots` (a streamed update between plot refreshes) the
    plots and the KV table are left as they are. The explanation is blank until the run is final, so it never
    describes another run."""
    record = prep.record
    baseline = state.baseline_for(record)
    summary = state.summary(record)
    status = status or status_text(record, summary, running=not final)
    if final:
        status += ". " + speed_note(summary)
    tokens = render.view_html(record.fragments, render.prompt_html(prep.prompt_text, len(record.prompt_ids),
                                                                   record.settings.chat), status, legend=False)
    detail = dict(summary, text=prep.labeler.text(summary["tokens"]), settings=dataclasses.asdict(record.settings),
                  prompt_tokens=len(record.prompt_ids), final=final)
    speed_rounds = list(record.timing.rounds) if record.timing is not None else record.rounds
    figures = (
        plots.acceptance_figure(record.rounds),
        plots.accepted_figure(record.rounds),
        plots.forward_figure(record.rounds),
        plots.speed_figure(speed_rounds, baseline if record.timing is not None else None),
        plots.kv_figure(record.rounds),
        pd.DataFrame(plots.kv_rows(record.rounds), columns=plots.KV_COLUMNS),
    ) if with_plots or final else (gr.skip(),) * 6
    tree_plot = tree.tree_figure(record.rounds, prep.labeler, prep.options) if with_plots or final else gr.skip()
    # Where the time goes: the timed run's clocks against the plain run's step, once both are measured
    time_plot = (plots.time_figure(speed_rounds, baseline if record.timing is not None else None)
                 if with_plots or final else gr.skip())
    return (
        tokens,
        render.stats_html(summary, status),
        detail["text"],
        *figures,
        history_frame(state) if final else gr.skip(),
        compare_figure(state) if final else gr.skip(),
        detail,
        render.explanation_md(record.rounds, record.settings.k, record.settings.greedy, record.settings.rule)
        if final else RUNNING_EXPLANATION,
        tree_plot,
        plots.position_figure(record.rounds) if with_plots or final else gr.skip(),
        time_plot,
    )


def message_view(message: str) -> tuple:
    """Only the status changes (model loading, baseline measuring)."""
    return (gr.skip(), render.stats_html(None, message)) + (gr.skip(),) * (len(RUN_OUTPUTS) - 2)


RUNNING_EXPLANATION = "*Running… the explanation of this run appears when it finishes.*"


def starting_view() -> tuple:
    """A run's first update: the status, and the previous run's explanation replaced at once (it described another
    run; the first round can be a second away)."""
    view = list(message_view("Starting the run…"))
    view[RUN_OUTPUTS.index("explain")] = RUNNING_EXPLANATION
    return tuple(view)


def initial_outputs() -> dict[str, object]:
    empty = {
        "tokens": render.empty_view(legend=False), "stats": render.stats_html(None, "No run yet: press Run."),
        "text": "",
        "acceptance_plot": plots.acceptance_figure([]), "accepted_plot": plots.accepted_figure([]),
        "forward_plot": plots.forward_figure([]), "speed_plot": plots.speed_figure([]),
        "kv_plot": plots.kv_figure([]), "kv_table": pd.DataFrame([], columns=plots.KV_COLUMNS),
        "history": pd.DataFrame([], columns=HISTORY_COLUMNS), "compare_plot": plots.comparison_figure([]),
        "summary": {}, "explain": "", "tree_plot": tree.tree_figure([], None),
        "position_plot": plots.position_figure([]), "time_plot": plots.time_figure([]),
    }
    return empty


# --------------------------------------------------------------------------------------------- handlers

# An empty update. A run answers with one at most once per render interval, not every round: Gradio 6 rebuilds every
# output component for an empty update, about 10 ms of its event loop per message on two cores, and thirty pages
# answering every round of a batch kept the loop busy for 18 of the class's seconds.
SKIP_RUN = (gr.skip(),) * len(RUN_OUTPUTS)


def fold(prep: runner.Prepared, state: SessionState, job: compute.RunJob, budget: runner.Budget, source=None,
         shared: bool = False):
    """Run `job` on the GPU function (or take the results of `source`: a shared computation, coalesce.py, whose
    measurements are another request's when `shared`) and fold each result into the session before yielding it:
    Built starts the run's record (and the handler's deadline), rounds go into the record, the timed run becomes its
    speed and plain decoding its baseline (one measured earlier, after a Reused, with its age). Ends early when Stop
    is set or the Stop handler has recorded the live run."""
    prep.work = source if source is not None else coalesce.gated(
        lambda: compute.run_job(job, compute.Stop(state.stop_event)), state.stop_event.is_set)
    recorded = lambda: job.live and prep.record is not None and prep.record.recorded      # noqa: E731
    reused = None
    try:
        for item in compute.pull(prep.work, state.stop_event, recorded):
            if isinstance(item, compute.Built):
                runner.begin(prep, state, item.label, item.dtype, item.sizing).time_limit = job.seconds
                budget.start()
            elif isinstance(item, se.RoundEvent):
                if not runner.record_round(prep, state, item):
                    return
            elif isinstance(item, se.GenerationResult):
                runner.keep_timing(prep.record, state, item, prep.labeler, prep.options, shared=shared)
            elif isinstance(item, coalesce.Reused):
                reused = item
            elif isinstance(item, se.BaselineResult):
                runner.keep_baseline(prep.record, state, item, reused, shared=shared)
            elif isinstance(item, coalesce.Label) and prep.record is not None:
                runner.add_label(prep.record, state, item.text)
            yield item
    finally:
        if job.live:
            runner.end_rounds(prep, state, budget.timed_out)


def lead(computation: coalesce.Computation, state: SessionState, job: compute.RunJob, baseline_key: tuple):
    """The leader's results of a shared computation: its turn at the gate, then the run; every result is kept in
    `computation` for the identical requests that follow it. Plain decoding another session measured less than
    coalesce.BASELINE_FRESH_SECONDS ago is reused (after a Reused marker) instead of measured again; one measured
    here is kept for the others, reused only while other requests wait as this one's turn begins
    (coalesce.reusable_baseline)."""
    cached = None
    done = {"rounds": not job.live, "timed": not job.timed, "plain": not job.plain}

    def work():                         # called when the turn begins
        nonlocal cached
        cached = coalesce.reusable_baseline(baseline_key, id(state)) if job.plain else None
        done["plain"] = done["plain"] or cached is not None
        return compute.run_job(job if cached is None else dataclasses.replace(job, plain=False),
                               compute.Stop(state.stop_event))

    under_load = None
    try:
        for item in coalesce.gated(work, state.stop_event.is_set, on_wait=computation.wait_at):
            if isinstance(item, se.RoundEvent) and item.finished:
                done["rounds"] = item.stop_reason != "cancelled"
            elif isinstance(item, se.GenerationResult):
                done["timed"] = item.stop_reason != "cancelled"
            elif isinstance(item, coalesce.Label):
                under_load = item.text
            elif isinstance(item, se.BaselineResult) and item.stop_reason != "cancelled":
                done["plain"] = True
                coalesce.BASELINES.put(baseline_key, item, id(state), under_load=under_load)
            if not isinstance(item, coalesce.Waiting):
                computation.publish(item)
            yield item
        if cached is not None and all(done.values()):
            result, at, cached_load = cached
            for item in (coalesce.Reused(at, cached_load), result):
                computation.publish(item)
                yield item
    finally:
        computation.finish(all(done.values()) and not state.stop_event.is_set())


def lead_batched(computation: coalesce.Computation, state: SessionState, job: compute.RunJob):
    """The leader's results of a run that joins the batch (batching.py): Built, then its rounds as the batch scores
    them (each after an InBatch with the batch's size), then a Label saying that it ran in a batch. Its speed is not
    measured: its tokens/s were shared with the other runs of the batch. Kept in `computation` for identical
    requests, as a lone run's are."""
    s = job.settings
    sizes, complete = [], False
    try:                                # a failed build finishes the computation too: its followers hear of it
        cpu = engine_thread.for_device(compute.loaded(s.target).device)
        decoder, input_ids, target, built = engine_thread.call(lambda: compute.build(s, job.prompt_ids, job.sizing),
                                                               cpu)
        request = se.Request(batching.request_id(), input_ids, decoder.drafter, k=s.k,
                             max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                             eos_token_id=reg.eos_ids(target), rule=s.rule, display=True)
        yield built
        published = False               # its followers count as served from its first published result on
        for item in batching.LANES.lane(target.model, cpu).join(request, state.stop_event.is_set, job.seconds):
            if isinstance(item, coalesce.Waiting):
                computation.wait_at(item)
                yield item
                continue
            computation.wait_at(None)
            if not published:
                computation.publish(built)
                published = True
            if isinstance(item, se.GenerationResult):
                continue                    # the batch's clocks: not a timed pass of this run (fold would keep it)
            if isinstance(item, batching.InBatch):
                sizes.append(item.batch_size)
            elif isinstance(item, se.RoundEvent) and item.finished:
                complete = item.stop_reason != "cancelled"
            computation.publish(item)
            yield item
        if sizes:
            label = coalesce.Label(batching.describe(sizes))
            computation.publish(label)
            yield label
    finally:
        computation.finish(complete and not state.stop_event.is_set())


# lets the browser finish drawing the last live updates (Plotly included) before the engine is timed
SETTLE_SECONDS = 1.0


def shared_label(viewers: int) -> str:
    """The line a run shared by `viewers` identical requests shows, the leader's and every follower's alike."""
    return (f"shared with another student: one computation served {viewers} identical requests (same model, prompt, "
            "settings, seed and rule) and measured its speed once for all; press 'Measure the speedup again' for a "
            "measurement of this page's own")


MEASURING = {"warm": "Measuring the speed without drawing: a first, untimed pass (as Run's live pass)",
             "timed": "Measuring the speed without drawing: speculative decoding",
             "plain": "Measuring the speed without drawing: plain decoding (same prompt, settings and seed)"}


def final_status(record, state: SessionState, complete: bool, measured: bool) -> str | None:
    """The finished run's status line when something went short (None: the usual one): the shared computation it
    followed was stopped (not `complete`), or a run meant to be `measured` alone has no timing."""
    if not complete:
        return (status_text(record, state.summary(record), running=False) + " (the identical request this run "
                "shared was stopped: press Run to compute it yourself)")
    if measured and record.timing is None and record.stop_reason not in ("cancelled", runner.TIME_LIMIT):
        return status_text(record, state.summary(record), running=False) + " (the speed measurement hit the time limit)"
    return None


def decode(settings: RunSettings, state: SessionState, show_spaces: bool, auto_baseline: bool,
           settle: float = SETTLE_SECONDS):
    """The run pipeline as UI updates: load (progress), rounds drawn live (throttled), then the speed measurement
    with nothing drawn (both sides of the speedup, back to back: the run decoded again, then plain decoding), then
    the final view. An identical request in flight is not computed again: this one follows it and gets the same
    results (coalesce.py), and its page says plainly that the run and its speed were shared with another student;
    one that has finished is never replayed, so Run always measures otherwise. Plain decoding is measured
    anew for each run (on a shared machine only measurements made back to back compare); another session's,
    measured minutes ago, is reused only while other requests wait for their turn, and labelled with its age."""
    state.stop_event.clear()
    yield starting_view()
    budget = runner.Budget(state.stop_event)
    prep = yield from relay(runner.prepare(settings, state, reg.REGISTRY, show_spaces, hold=True),
                            message_view, state.stop_event)
    if prep is None:
        yield message_view("Stopped while loading; the model keeps loading in the background for the next run.")
        return
    alone = False
    try:
        passes = 3 if auto_baseline else 1          # the live run, then the timed run and plain decoding
        job = compute.RunJob(settings, prep.prompt_ids, compute.call_seconds(budget, passes * settings.max_new_tokens),
                             live=True, timed=auto_baseline, plain=auto_baseline, settle=settle)
        computation, leader = coalesce.COALESCER.join((settings, prep.prompt_ids, auto_baseline), id(state))
        # With something decoding or waiting, a run joins the batch (batching.py); else it is decoded and measured alone
        batched = leader and batching.enabled() and batching.LANES.choose()
        alone = leader and not batched
        source = (lead_batched(computation, state, job) if batched
                  else lead(computation, state, job, settings.baseline_key(prep.prompt_ids)) if leader
                  else computation.follow(state.stop_event.is_set))
        last, last_plots, label, batch = 0.0, float("-inf"), "", 0       # the first update draws the plots
        answered = 0.0                  # when this handler last yielded to Gradio
        for item in fold(prep, state, job, budget, source, shared=not leader):
            if isinstance(item, compute.Built):
                state.active = prep
                yield SKIP_RUN
            elif isinstance(item, se.RoundEvent):
                now = perf_counter()
                # The viewers of one shared computation, or the runs of one batch, together draw as often as one
                # viewer would: thirty pages redrawn every 0.15 s took the cores from the decoding they all wait for.
                share = max(1, computation.viewers, batch)
                if (item.finished or now - last >= RENDER_INTERVAL * share) and not state.stop_event.is_set():
                    # The last live update carries no plots: they are drawn once, after the speed is measured.
                    with_plots = not item.finished and now - last_plots >= PLOT_INTERVAL * share
                    last, last_plots = now, now if with_plots else last_plots
                    status = None
                    if batch:
                        status = status_text(prep.record, state.summary(prep.record), running=True, batch=batch)
                    answered = now
                    yield run_view(prep, state, status=status, with_plots=with_plots)
                elif now - answered >= RENDER_INTERVAL * share:     # a cancel or a closed tab lands here (SKIP_RUN)
                    answered = now
                    yield SKIP_RUN
            elif isinstance(item, batching.InBatch):
                batch = item.batch_size           # its round follows at once: that one answers (a closed tab too)
            elif isinstance(item, batching.Quiet):
                yield SKIP_RUN
            elif isinstance(item, coalesce.Waiting):
                what = ("Waiting for the model (this run joins a batch with the other students' runs when it starts)"
                        if batched else "Waiting for the model" if leader else "Waiting for an identical request's run")
                yield message_view(item.text(what))
            elif isinstance(item, (compute.Phase, str)):
                label = MEASURING[item.name] if isinstance(item, compute.Phase) else label
                yield message_view(f"{label}… {item}" if isinstance(item, str) else f"{label}…")
            else:
                yield SKIP_RUN
        record = prep.record
        if record is None or record.recorded:   # the Stop handler recorded and rendered it; a later view would race
            return
        if computation.viewers > 1:
            runner.add_label(record, state, shared_label(computation.viewers))
        state.finish(record)
        measured = auto_baseline and not batch
        yield run_view(prep, state, status=final_status(record, state, leader or computation.complete, measured),
                       final=True)
    finally:
        if alone:
            batching.LANES.done_alone()
        runner.release(prep, reg.REGISTRY)


def run(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
        exit_after, auto_baseline, show_spaces, state: SessionState, request: gr.Request = None):
    """Run button / api_name="run": streams one update per round (at most every RENDER_INTERVAL s)."""
    settings = parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                              skip_layers, exit_after)
    with friendly_errors():
        yield from decode(settings, state, bool(show_spaces), bool(auto_baseline), settle_seconds(request))


def settle_seconds(request: gr.Request | None) -> float:
    """The pause between the live run and its timing: only a browser on this machine draws on the engine's cores
    while the last live updates arrive. An API client (gradio_client marks its calls `x-gradio-user: api`) draws
    nothing, a visitor's browser draws on the visitor's machine, and on ZeroGPU no browser shares the GPU: a class
    of thirty waits for no pause of another's. No request (a direct call) pauses, as a local browser's run does.
    tests/test_speed_browser.py holds a page's figures (paused) against the API's (not paused)."""
    if compute.ZEROGPU:
        return 0.0
    if request is None:
        return SETTLE_SECONDS
    headers = getattr(request, "headers", None) or {}
    host = getattr(getattr(request, "client", None), "host", None)
    if headers.get("x-gradio-user") == "api" or (host is not None and not is_loopback(host)):
        return 0.0
    return SETTLE_SECONDS


def is_loopback(host: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


STOP_REASSERT_SECONDS = 2.0


def stop(state: SessionState):
    """Stop button: the engine polls this flag between rounds; the run is recorded as it stands. The stopped view
    is sent twice: at once, and again STOP_REASSERT_SECONDS later, because a streamed update the run computed just
    before the click can still be delivered after it (Gradio sends a cancelled event's last output; measured: 1.3 s
    after the Stop's view on two busy cores) and would put "Decoding…" back on screen."""
    state.stop_event.set()
    prep = getattr(state, "active", None)
    if prep is None or prep.record is None or prep.record.recorded or not prep.record.rounds:
        yield (gr.skip(),) * len(RUN_OUTPUTS)
        return
    state.finish(prep.record, "cancelled")
    view = run_view(prep, state, status=f"Stopped after {len(prep.record.rounds)} rounds", final=True)
    yield view
    time.sleep(STOP_REASSERT_SECONDS)
    if state.active is prep:                   # unless a new run has started since
        yield view


def measure_baseline(state: SessionState):
    """'Measure the speedup again' button: measure the latest run's speed again, both sides without drawing, as Run
    measures it (measurement_job: a fresh decoder's untimed first pass, then its timed pass, then plain decoding with
    the same prompt, settings and seed), always anew, never shared with another request; then
    show the speedup everywhere (every run in the history with the same baseline key uses the new baseline)."""
    shown = getattr(state, "active", None)
    if shown is None or shown.record is None or not shown.record.rounds:
        raise gr.Error("Run something first: the baseline uses the latest run's prompt, settings and seed.",
                       print_exception=False)
    record = shown.record
    if record.stop_reason in ("cancelled", runner.TIME_LIMIT):
        raise gr.Error("The latest run was stopped before its end: run it to the end, then measure.",
                       print_exception=False)
    state.stop_event.clear()
    budget = runner.Budget(state.stop_event)
    with state.lock:          # they said how the measurement being replaced was made (shared, under load)
        replaced, record.labels[:] = list(record.labels), []
    with friendly_errors():
        yield message_view("Loading the models to measure the speed again…")
        prep = yield from relay(runner.prepare(record.settings, state, reg.REGISTRY, shown.options.show_spaces,
                                               hold=True, record=record), message_view, state.stop_event)
        if prep is None:
            yield message_view("Measurement stopped.")
            return
        try:
            job = measurement_job(record.settings, prep.prompt_ids, budget, sizing=record.sizing)
            timing, plain, label = None, None, ""
            for item in fold(prep, state, job, budget):
                if isinstance(item, se.GenerationResult):
                    timing = item.stop_reason != "cancelled"
                elif isinstance(item, se.BaselineResult):
                    plain = item.stop_reason != "cancelled"
                label = MEASURING[item.name] if isinstance(item, compute.Phase) else label
                yield message_view(f"{label}… {item}" if isinstance(item, str) else f"{label}…")
            if not timing:
                with state.lock:        # the speed shown is still the one they describe
                    record.labels[:] = replaced + [label for label in record.labels if label not in replaced]
            if not (timing and plain):
                yield message_view("Measurement stopped.")
                return
            state.active = prep
            yield run_view(prep, state, final=True)
        finally:
            runner.release(prep, reg.REGISTRY)


def measurement_job(settings: RunSettings, prompt_ids, budget: runner.Budget, sizing=None, plain: bool = True,
                    first_pass: bool = False) -> compute.RunJob:
    """A run measured without a drawn live pass ("Measure the speedup again", a Sweep k point), timed as Run times
    its own: a first pass of the same decoder, untimed (Run's live pass; with `first_pass`, its rounds become the
    record's, for a record with none yet: a sweep point; else nothing of it is kept), the timed pass with nothing
    built for a view, as Run's, then plain decoding back to back (`plain`)."""
    passes = 2 + plain
    return compute.RunJob(settings, tuple(prompt_ids), compute.call_seconds(budget, passes * settings.max_new_tokens),
                          live=first_pass, warm=not first_pass, timed=True, plain=plain, sizing=sizing)


def progress_line(prep: runner.Prepared, event: se.RoundEvent, label: str) -> str:
    return f"{label}: round {event.index + 1}, {event.committed_len - len(prep.prompt_ids)} tokens"
