"""Figures and tables of the exactness lab and the sweeps. Pure functions of engine results (spec_engine.classroom.lab
histograms and reports, spec_engine.classroom.sweep rows): no model, no Gradio, and no probability computed here."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go

import spec_engine as se
from ui.views.plots import COLORS, empty_figure, figure, layout
from ui.views.render import esc

SAMPLER_NAMES = {"exact_target": "exact (from the model)", "plain": "plain sampling",
                 **{name: f"speculative{' tree' if not info.chains else ''}, {info.label}"
                    for name, info in se.RULE_INFO.items()},               # spec_engine.core.rule.RULE_INFO
                 "exact": "speculative, exact rule", "tree_best_sibling": "speculative tree, best sibling (wrong)"}
SAMPLER_COLORS = {"exact_target": "#111827", "plain": COLORS["plain"], "exact": COLORS["accepted"],
                  "strict": "#0f766e", "invariant": "#7c3aed", "typical": COLORS["theory"],
                  "q_mismatch": COLORS["draft"],
                  "topp_membership": COLORS["rejected"], "no_residual": COLORS["correction"],
                  "tree_best_sibling": COLORS["rejected"]}
ALPHA = 1e-3          # the table's verdict: "rejects" when the chi-square p-value is below this
LAB_COLUMNS = ["sampler", "N", "acceptance", "TV (whole continuation)", "TV (next token)", "chi-square", "dof",
               "p-value", f"verdict at α = {ALPHA:g}", "in one line", "seconds"]
SWEEP_COLUMNS = ["value", "draft", "k", "T", "acceptance", "tokens / forward", "theory", "rounds", "tokens",
                 "tok/s", "plain tok/s", "speedup", "speedup min", "speedup max", "repeats", "longest draft",
                 "draft cost c", "verify cost v", "predicted", "best"]
# Table columns in pixels, so all eleven fit a 1440 px window (about 1,200 px for the table): sized to their
# content, the sampler names and the verdicts pushed "in one line" and "seconds" past the right edge. Narrower
# windows scroll the table sideways.
LAB_WIDTHS = ["205px", "50px", "90px", "95px", "75px", "70px", "45px", "75px", "170px", "245px", "80px"]
HEIGHT = 340
TITLE_CHARS = 50      # a title line's most characters: fits a figure half a 1440 px window wide, and a phone's
TITLE_LINE_PX = 16


def outcome_labels(outcomes, label) -> list[str]:
    """x labels for histogram outcomes (token-id tuples; () = every other outcome), escaped for Plotly."""
    return [esc(label(seq)) if seq else "(all others)" for seq in outcomes]


def distribution_figure(hist, samplers: list[str], labels: list[str], title: str) -> go.Figure:
    """Grouped bars: the exact distribution, then the empirical frequencies of each sampler in `samplers`."""
    if hist is None or not hist.outcomes:
        return empty_figure(title, "Press 'Run the exactness lab'")
    traces = [{"type": "bar", "x": labels, "y": hist.exact, "name": SAMPLER_NAMES["exact_target"],
               "marker": {"color": "rgba(0,0,0,0)", "line": {"color": SAMPLER_COLORS["exact_target"], "width": 2}},
               "hovertemplate": "%{x}: exact %{y:.4f}<extra></extra>"}]
    for sampler in samplers:
        if sampler in hist.empirical:
            traces.append({"type": "bar", "x": labels, "y": hist.empirical[sampler], "name": SAMPLER_NAMES[sampler],
                           "marker": {"color": SAMPLER_COLORS[sampler]},
                           "hovertemplate": "%{x}: %{y:.4f}<extra>" + SAMPLER_NAMES[sampler] + "</extra>"})
    lines = title.count("<br>") + 1
    shape = layout(title, "", "probability / frequency", height=HEIGHT + (lines - 1) * TITLE_LINE_PX,
                   barmode="group", bargap=0.2, xaxis={"tickangle": -30}, margin={"t": 24 + lines * TITLE_LINE_PX})
    shape["title"].update(y=1, yref="container", yanchor="top", pad={"t": 16})    # the lines go down from the top
    return figure(traces, shape)


def fmt_p(p: float) -> str:
    if p == 0:
        return "< 1e-300"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def verdict(report) -> str:
    if report.chi.dof == 0:
        return "nothing to test (one outcome)"
    if report.chi.impossible:
        return f"rejects: {report.chi.impossible} draws the target can never produce"
    return "rejects: differs from the target" if report.chi.pvalue < ALPHA else "consistent with the target"


def one_line(report) -> str:
    """The sampler's verdict in one line: "exact (acceptance 0.52)" when the rule is exact (RULE_INFO) and the test
    does not reject; "changes what is sampled (TV 0.09, p = 1e-30)" when it rejects; else what was not shown."""
    info = se.RULE_INFO.get(report.sampler)
    accept = "" if report.acceptance is None else f"acceptance {report.acceptance:.2f}"
    if report.chi.dof == 0:
        return "nothing to test (one outcome)"
    if report.chi.impossible or report.chi.pvalue < ALPHA:
        flag = " (an exact rule: sampling noise at α, or a bug)" if info is not None and info.exact else ""
        return f"changes what is sampled (TV {report.tv:.2f}, p = {fmt_p(report.chi.pvalue)}){flag}"
    if info is None:
        return "exact (plain sampling)"
    if info.exact:
        return f"exact ({accept})"
    return f"not caught at this N ({'lossy' if info.kind == 'lossy' else 'wrong'}; TV {report.tv:.2f}, {accept})"


def lab_rows(reports) -> list[list]:
    rows = []
    for r in reports:
        rows.append([SAMPLER_NAMES[r.sampler], r.n, "–" if r.acceptance is None else round(r.acceptance, 3),
                     round(r.tv, 4), round(r.tv_next, 4),
                     "∞" if math.isinf(r.chi.statistic) else round(r.chi.statistic, 1), r.chi.dof,
                     fmt_p(r.chi.pvalue), verdict(r), one_line(r), round(r.seconds, 1)])
    return rows


def short_name(sampler: str) -> str:
    """A sampler's name without "speculative, " and without its parenthesis: "q before warping"."""
    name = SAMPLER_NAMES[sampler].removeprefix("speculative, ").removeprefix("speculative tree, ")
    return name.split(" (", 1)[0]


def wrapped(parts: list[str], width: int = TITLE_CHARS, sep: str = " · ") -> list[str]:
    """`parts` joined by `sep` into lines of at most `width` characters (a longer part gets a line of its own)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines


def figure_title(prefix: str, reports, samplers: list[str], next_token: bool) -> str:
    """The prefix, then each sampler's total-variation distance at the level shown (next token or whole), on lines
    of at most TITLE_CHARS characters joined by <br>: Plotly never wraps a title, and one line cut the right-hand
    figure's off at its edge ("q before warping (tra") in half a 1440 px window."""
    parts = [f"{short_name(r.sampler)} {r.tv_next if next_token else r.tv:.3f}"
             for r in reports if r.sampler in samplers]
    lines = [prefix.rstrip()] + (wrapped(["TV " + parts[0]] + parts[1:]) if parts else [])
    return "<br>".join(html.escape(line, quote=False) for line in lines)     # Plotly shows &#x27; as typed


def same_figures_note(groups: list[list[str]]) -> str:
    """Markdown: which samplers drew identical counts (spec_engine.classroom.lab.identical_draws), so that a reader
    who sees two rows or bars alike knows it is no display error; "" when none did."""
    lines = []
    for names in groups:
        shown = [f"*{short_name(name)}*" for name in names]
        which = " and ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else shown[0]
        lines.append(f"{which} drew the same count of every outcome from the same seeds, so their bars and figures "
                     "coincide: the rules differ, but they chose alike on these draws (on the toy pair at top-p 0.8 "
                     "typical acceptance and top-p membership do).")
    return "  \n".join(lines)


# ------------------------------------------------------------------------------------------------ sweeps

def sweep_figure(rows, axis: str, best=None) -> go.Figure:
    """Acceptance, tokens per target forward (measured and analytic) and measured speedup (median, min-max error
    bars over the repeats, and the speedup E[tokens per round] / (v + c) predicted from the measured draft and
    verify costs) against the swept setting. `best` (spec_engine.classroom.sweep.verdict: only a setting that beats the
    others beyond the spread) is starred."""
    from plotly.subplots import make_subplots
    if not rows:
        return empty_figure("Sweep", "Press 'Run the sweep'")
    x = [str(r.value) if axis == "draft" else r.value for r in rows]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=("acceptance (measured)", "tokens per target forward",
                                        "speedup vs plain (measured, min-max)"))
    line = {"color": COLORS["accepted"], "width": 2}
    fig.add_trace(go.Scatter(x=x, y=[r.acceptance for r in rows], mode="lines+markers", name="acceptance",
                             line=line, showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=[r.tokens_per_forward for r in rows], mode="lines+markers", name="measured",
                             line={"color": "#111827", "width": 2}), row=1, col=2)
    fig.add_trace(go.Scatter(x=x, y=[r.expected_tokens_per_forward for r in rows], mode="lines+markers",
                             name="theory (1−a^(k+1))/(1−a) at the measured a",
                             line={"color": COLORS["theory"], "dash": "dot", "width": 2}), row=1, col=2)
    spread = {"type": "data", "symmetric": False, "array": [r.high - r.speedup for r in rows],
              "arrayminus": [r.speedup - r.low for r in rows], "thickness": 1.5, "width": 5}
    fig.add_trace(go.Scatter(x=x, y=[r.speedup for r in rows], mode="lines+markers", name="speedup",
                             error_y=spread, line={"color": COLORS["bonus"], "width": 2}, showlegend=False),
                  row=1, col=3)
    if any(r.predicted_speedup is not None for r in rows):
        fig.add_trace(go.Scatter(x=x, y=[r.predicted_speedup for r in rows], mode="lines+markers",
                                 name="predicted E/(v+c) from the measured costs",
                                 line={"color": COLORS["theory"], "dash": "dot", "width": 2}), row=1, col=3)
    for col in (2, 3):
        fig.add_hline(y=1.0, line={"color": "#9ca3af", "dash": "dash", "width": 1}, row=1, col=col)
    title = f"Sweep over {axis}"
    if best is not None:
        best_x = str(best.value) if axis == "draft" else best.value
        fig.add_trace(go.Scatter(x=[best_x], y=[best.speedup], mode="markers", name=f"best {axis} (beyond noise)",
                                 marker={"symbol": "star", "size": 16, "color": "#f59e0b",
                                         "line": {"color": "#111827", "width": 1}}), row=1, col=3)
        title += f": best {axis} = {best.value} (×{best.speedup:.2f} vs plain decoding)"
    elif len(rows) > 1:
        title += f": no best {axis} beyond the spread of the repeats"
    fig.update_yaxes(range=[-0.05, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text=axis, dtick=1 if axis == "k" else None, gridcolor="#e5e7eb")
    fig.update_yaxes(gridcolor="#e5e7eb", zeroline=False)
    fig.update_annotations(font_size=12)
    fig.update_layout(title={"text": esc(title), "font": {"size": 13}, "x": 0.01}, height=360,
                      paper_bgcolor="white", plot_bgcolor="white", font={"size": 11, "color": "#374151"},
                      margin={"l": 48, "r": 12, "t": 70, "b": 90},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0})
    return fig


def rounded(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def sweep_rows(rows, best=None) -> list[list]:
    out = []
    for r in rows:
        p = r.point
        out.append([str(r.value), p.draft, p.k, p.sampling.temperature, round(r.acceptance, 3),
                    round(r.tokens_per_forward, 2), round(r.expected_tokens_per_forward, 2), r.rounds, r.new_tokens,
                    round(r.tokens_per_second, 1), round(r.plain_tokens_per_second, 1), round(r.speedup, 2),
                    round(r.low, 2), round(r.high, 2), r.repeats, r.longest_draft, rounded(r.draft_cost),
                    rounded(r.verify_cost), rounded(r.predicted_speedup), "★" if r is best else ""])
    return out
