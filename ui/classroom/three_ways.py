"""The "Three ways to share a weight read" tab: one click measures, on the offline model and this machine, plain
decoding, batching, speculation and quantized copies of the target side by side (spec_engine.classroom.three_ways),
streams each run, and draws one picture: tokens per second per arm with its spread, each bar labelled with the
tokens one weight read yields, the bytes per weight and whether the text is plain decoding's.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

import spec_engine as se
from spec_engine.classroom import three_ways as tw

from ui.classroom import lab as exactness_lab
from ui.playground import coalesce, compute, drafts, engine_thread, handlers, runner
from ui.playground import registry as reg
from ui.views.render import esc

PROMPT = "Explain in two sentences why the sky is blue."
# What one Measure runs: small so a class waits well under a minute on two idle CPU cores (a busy machine takes longer)
TOKENS, BATCH, REPEATS = tw.DEFAULT_TOKENS, tw.DEFAULT_BATCH, tw.DEFAULT_REPEATS
OUTPUTS = ("status", "plot", "table")
COLUMNS = ["way", "arm", "tokens/s (median)", "min-max", "× plain", "tokens per weight read", "MB read per token",
           "bytes per weight", "one user's seconds", "text vs plain fp32", "top-1 agreement (held-out)",
           "KL (nats, held-out)"]
# Held-out text for how a quantized copy changed the model (teacher-forced, no decoding): prose the prompt and the
# presets do not use.
HELD_OUT = ("The river rose for three days after the storm, and the old bridge, which had stood for a century, "
            "groaned under the weight of the water. People from the village gathered on the hill to watch.")
COLORS = {"none": "#6b7280", "batching": "#2563eb", "speculation": "#059669", "quantization": "#d97706",
          "combination": "#7c3aed"}
SHORT = {"plain": "plain fp32", "batch": "batching", "speculation": "speculation", "bf16": "bf16", "int8": "int8",
         "int4": "int4", "batch+speculation": "batch + speculation", "self-draft": "bf16 self-draft"}

CAPTION = """**Three ways to share a weight read.** Decoding one token reads every weight of the model once, so on a
small model the speed is set by bytes read per token. **Quantization** reads fewer bytes per weight (bf16 2, int8 about
1, int4 about ½ instead of fp32's 4), and *changes the model*: its text can differ from the full-precision model's.
**Batching** shares one read across users: B students' next tokens come from one forward. **Speculation** shares one
read across future positions of one user: drafted tokens are checked in one forward, and the text is exactly plain
decoding's. Two combinations: speculation inside the batch, and speculation with a bf16 copy of the target as its
draft (the fp32 model's exact text at the copy's pace, where that pays). *Measure* runs each arm on the offline
model on this machine, interleaved and repeated (bars: median, whiskers: min-max), greedy, {tokens} new tokens
each, {batch} students in the batch, {repeats} repeats."""


def caption() -> str:
    return CAPTION.format(tokens=TOKENS, batch=BATCH, repeats=REPEATS)


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


def text_verdict(row: tw.WayRow) -> str:
    if not row.available:
        return row.reason
    if row.same_text is None:
        return ""
    if row.same_text:       # a quantized model may agree for a few tokens; only the exact ways must, always
        return "identical here, not guaranteed" if row.way == "quantization" else "identical"
    return f"differs from token {row.first_divergence + 1}"


def table_rows(rows: list[tw.WayRow]) -> list[list]:
    out = []
    for r in rows:
        if not r.available:
            out.append([r.way, r.label, "", "", "", "", "", "", "", r.reason, "", ""])
            continue
        out.append([r.way, r.label, fmt(r.tokens_per_second), f"{fmt(r.low)}-{fmt(r.high)}", f"{r.speedup:.2f}",
                    fmt(r.tokens_per_read), fmt(r.bytes_per_token / 1e6), fmt(r.bytes_per_weight, 2),
                    f"{r.latency:.2f}", text_verdict(r), "" if r.top1 is None else f"{r.top1:.3f}",
                    "" if r.kl is None else f"{r.kl:.4f}"])
    return out


def tick(row: tw.WayRow) -> str:
    """An arm's axis label: its name, tokens per weight read, bytes per weight and its text against plain fp32's
    (Plotly reads <br> and a few tags in text, so the parts are escaped)."""
    name = SHORT.get(row.arm, row.arm)
    if not row.available:
        return f"{html.escape(name)}<br>not available"
    parts = [name, f"{fmt(row.tokens_per_read, 2)} tok/read · {fmt(row.bytes_per_weight, 2)} B/weight",
             f"text {text_verdict(row)}"]
    return "<br>".join(html.escape(p) for p in parts)


def figure(rows: list[tw.WayRow]) -> go.Figure:
    """Bars of tokens per second per arm (median, min-max whiskers), coloured by way; an arm that could not run is
    named on the axis with "not available" and has no bar."""
    fig = go.Figure()
    for way, color in COLORS.items():
        mine = [r for r in rows if r.way == way]
        if not mine:
            continue
        fig.add_bar(x=[tick(r) for r in mine], y=[r.tokens_per_second if r.available else 0 for r in mine],
                    name=way, marker_color=color,
                    error_y={"type": "data", "symmetric": False,
                             "array": [r.high - r.tokens_per_second if r.available else 0 for r in mine],
                             "arrayminus": [r.tokens_per_second - r.low if r.available else 0 for r in mine]},
                    hovertext=[html.escape(r.label if r.available else f"{r.label}: {r.reason}") for r in mine])
    top = max([r.high for r in rows if r.available] or [1.0])
    fig.update_layout(title="Tokens per second on this machine, by way of sharing a weight read",
                      yaxis={"title": "tokens / s (median, min-max)", "range": [0, top * 1.1]},
                      xaxis={"title": None, "tickfont": {"size": 11}}, legend={"orientation": "h", "y": -0.3},
                      margin={"t": 50, "b": 40}, height=440)
    return fig


def point(rows: list[tw.WayRow]) -> str:
    """The one sentence a class should take away, from the rows measured so far."""
    by_arm = {r.arm: r for r in rows if r.available and r.runs}
    said = []
    if "batch" in by_arm:
        b = by_arm["batch"]
        said.append(f"batching: {fmt(b.tokens_per_read, 2)} tokens per weight read, ×{b.speedup:.2f} the tokens per "
                    f"second, each student waits {b.latency:.1f} s, text {text_verdict(b)}")
    if "speculation" in by_arm:
        s = by_arm["speculation"]
        said.append(f"speculation: {fmt(s.tokens_per_read, 2)} tokens per weight read, ×{s.speedup:.2f}, text "
                    f"{text_verdict(s)}")
    for arm in ("batch+speculation", "self-draft"):
        if arm in by_arm:
            c = by_arm[arm]
            said.append(f"{SHORT[arm]}: {fmt(c.tokens_per_read, 2)} tokens per weight read, ×{c.speedup:.2f}, text "
                        f"{text_verdict(c)}")
    quantized = [r for r in rows if r.way == "quantization"]
    missing = {}
    for q in quantized:
        if q.available:
            changed = "" if q.top1 is None else f", top-1 agreement {q.top1:.1%} on held-out text"
            said.append(f"{q.arm}: {fmt(q.bytes_per_weight, 2)} bytes per weight, ×{q.speedup:.2f}, text "
                        f"{text_verdict(q)}{changed}")
        else:
            missing.setdefault(q.reason, []).append(q.arm)
    said += [f"{', '.join(arms)}: {reason}" for reason, arms in missing.items()]
    lead = ("**Quantization changes the model; speculation and batching do not** (their text is checked against "
            "plain fp32 decoding, token by token).")
    return lead + ("\n\n" + "; ".join(esc(s) for s in said) + "." if said else "")


def view(rows: list[tw.WayRow], status: str) -> tuple:
    table = pd.DataFrame(table_rows(rows), columns=COLUMNS)
    return f"{esc(status)}\n\n{point(rows)}", figure(rows), table


@dataclass(frozen=True)
class Job:
    target: str
    prompt_ids: tuple[int, ...]
    tokens: int
    batch: int
    repeats: int
    seconds: float
    held_out: tuple[int, ...] = ()


@compute.gpu(compute.job_seconds)
def measure_job(job: Job, stop: compute.Stop):
    """Yields the measurement's Updates (spec_engine.classroom.three_ways.measure) until it ends, Stop or the
    job's deadline."""
    import torch
    target = compute.loaded(job.target)
    draft, k = drafts.default_draft(job.target)
    _, spec = drafts.split_draft(draft)
    ids = torch.tensor([list(job.prompt_ids)], dtype=torch.long, device=target.device)
    budget = runner.Budget(stop, job.seconds)
    budget.start()
    work = tw.measure(target.model, ids, lambda: drafts.build_drafter(spec, target, None, drafts.DraftOptions()), k,
                      draft, tokens=job.tokens, batch=job.batch, repeats=job.repeats, should_stop=budget.should_stop,
                      make_self_draft=lambda: se.make_drafter("quantized-self", target),
                      held_out=[torch.tensor([list(job.held_out)], dtype=torch.long, device=target.device)])
    yield from engine_thread.iterate(work, engine_thread.for_device(target.device))


def measure(state, progress=gr.Progress()):
    """'Measure' / api_name="three_ways": the runs streamed as they finish. Ends early (and says so) on Stop or at
    the server's time limit."""
    state.stop_event.clear()
    budget, held = runner.Budget(state.stop_event), []
    target = se.models.default_model_name()
    try:
        with handlers.friendly_errors():
            yield from measure_runs(target, budget, held, progress)
    finally:
        budget.cancel.set()
        for name in held:
            reg.REGISTRY.release(name)


def measure_runs(target: str, budget, held: list[str], progress):
    skip = (gr.skip(),) * (len(OUTPUTS) - 1)
    models = yield from handlers.relay(runner.load([target], reg.REGISTRY, held), lambda m: (esc(m),) + skip,
                                       budget.stop_event)
    if models is None:
        return
    prompt_ids = runner.encode(models[target], PROMPT, True)
    held_out = runner.encode(models[target], HELD_OUT, False)
    job = Job(target, tuple(prompt_ids), TOKENS, BATCH, REPEATS,
              compute.call_seconds(budget, (2 * BATCH + 10) * TOKENS * REPEATS), tuple(held_out))
    about = f"{reg.display_name(target)}, prompt {PROMPT!r}"
    rows, last = [], None
    yield view(rows, f"Measuring… {about}")
    for update in compute.pull(measure_job(job, compute.Stop(budget.stop_event)), budget.stop_event, gated=True):
        if isinstance(update, coalesce.Waiting):
            yield view(rows, update.text("Waiting for the model") + "…")
            continue
        last = update
        rows = update.rows or rows
        if update.total:
            progress(update.done / update.total, desc=f"{update.done} of {update.total} runs")
        yield view(rows, f"{update.text} ({update.done} of {update.total or '?'} runs). {about}")
    if last is None or last.done < last.total or not last.total:
        why = "Stopped" if budget.stop_event.is_set() else f"Time limit ({job.seconds:g} s) reached"
        yield view(rows, f"{why} before every run finished (the rows show the runs done). {about}")
        return
    yield view(rows, f"Done: {last.total} runs. {about}")


def build_tab(state, resize_js: str | None = None) -> list:
    """The tab (call inside a gr.Tabs). Returns the events the Stop button should cancel."""
    with gr.Tab("Three ways to share a weight read", elem_id="three-ways-tab") as tab:
        gr.Markdown(caption(), elem_id="three-ways-caption")
        button = gr.Button("Measure", variant="primary", elem_id="three-ways-measure")
        out = {"status": gr.Markdown("", elem_id="three-ways-status"),
               "plot": gr.Plot(figure([]), show_label=False, elem_id="three-ways-plot"),
               "table": gr.Dataframe(pd.DataFrame([], columns=COLUMNS), headers=COLUMNS, interactive=False,
                                     label="Each figure, from the runs", elem_id="three-ways-table", wrap=True)}
    event = button.click(measure, [state], [out[n] for n in OUTPUTS], api_name="three_ways",
                         **exactness_lab.compute())
    if resize_js:
        tab.select(None, None, None, js=resize_js, api_visibility="private")
    return [event]
