"""RoundEvents and run history -> Plotly figures. Pure functions: same input, same figure; no model, no Gradio."""
from __future__ import annotations

import plotly.graph_objects as go

from ui.views import metrics

HEIGHT = 300
COLORS = {"accepted": "#2f9e5b", "rejected": "#d64545", "correction": "#e39a26", "bonus": "#4a7fe0",
          "theory": "#7c3aed", "plain": "#6b7280", "target": "#1f77b4", "draft": "#e36a1f"}


AXIS = {"gridcolor": "#e5e7eb", "zeroline": False, "linecolor": "#d1d5db", "automargin": True}


def layout(title: str, x_title: str, y_title: str, height: int = HEIGHT, **extra) -> dict:
    """A compact light layout, spelled out (no named template) so figures can skip validation."""
    out = {
        "title": {"text": title, "font": {"size": 13}, "x": 0.01, "xanchor": "left"},
        "height": height, "margin": {"l": 48, "r": 12, "t": 34, "b": 84},
        "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"size": 11, "color": "#374151"},
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.3, "xanchor": "left", "x": 0, "font": {"size": 10}},
        "xaxis": dict(AXIS, title={"text": x_title}), "yaxis": dict(AXIS, title={"text": y_title}),
        "uirevision": "keep",
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def figure(traces: list[dict], layout_: dict) -> go.Figure:
    """Built from plain dicts without Plotly's validation: these figures are rebuilt on every streamed round,
    and validation costs more than the model's forward pass on a small CPU."""
    return go.Figure(data=traces, layout=layout_, _validate=False)


def base_layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(**layout(title, x_title, y_title, height))
    return fig


def empty_figure(title: str, message: str = "Run to see this plot") -> go.Figure:
    note = {"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
            "font": {"size": 13, "color": "#9ca3af"}}
    return figure([], layout(title, "", "", annotations=[note], xaxis={"visible": False}, yaxis={"visible": False}))


def round_numbers(rounds) -> list[int]:
    return [r.index + 1 for r in rounds]


def scatter(x, y, name: str, mode: str = "lines", **style) -> dict:
    return {"type": "scatter", "x": list(x), "y": list(y), "name": name, "mode": mode, **style}


def acceptance_figure(rounds) -> go.Figure:
    """Per-round acceptance (accepted / drafted) and the running acceptance rate."""
    if not rounds:
        return empty_figure("Acceptance rate")
    x = round_numbers(rounds)
    run = metrics.running_acceptance(rounds)
    traces = [
        scatter(x, [metrics.round_acceptance(r) for r in rounds], "this round", "markers",
                marker={"color": COLORS["accepted"], "size": 6, "opacity": 0.7}),
        scatter(x, run, "running", line={"color": "#111827", "width": 2}),
    ]
    return figure(traces, layout(f"Acceptance rate: {run[-1]:.0%} of drafted tokens", "round", "accepted / drafted",
                                 yaxis={"range": [-0.05, 1.05], "tickformat": ".0%"}))


def accepted_figure(rounds) -> go.Figure:
    """Accepted draft tokens per round (bars) against the most each round could keep (the dashed line): its drafts
    for a chain, its depth for a tree (one path at most is kept; RoundEvent.draft_length). Not k: a tree of 4 nodes
    under k = 12 can keep at most its depth, and a chain that found nothing to copy drafted fewer than k."""
    if not rounds:
        return empty_figure("Accepted tokens per round")
    x = round_numbers(rounds)
    most = [r.draft_length for r in rounds]
    trees = any(r.is_tree for r in rounds)
    mean, mean_most = sum(r.accepted for r in rounds) / len(rounds), sum(most) / len(rounds)
    hover = [f"round {n}: at most {m}" + (f" (a tree of {len(r.drafted)} nodes, {m} deep)" if r.is_tree
                                          else f" ({m} drafted of k = {r.k})")
             for n, m, r in zip(x, most, rounds)]
    traces = [
        {"type": "bar", "x": x, "y": [r.accepted for r in rounds], "name": "accepted drafts",
         "marker": {"color": COLORS["accepted"]}},
        {"type": "bar", "x": x, "y": [m - r.accepted for m, r in zip(most, rounds)],
         "name": "not kept (to the tree's depth)" if trees else "rejected + discarded", "marker": {"color": "#e5e7eb"}},
        scatter(x, most, f"most it could keep ({'drafts; a tree: its depth' if trees else 'its drafts'})",
                line={"color": "#111827", "dash": "dash", "width": 1.5, "shape": "hvh"},
                hovertext=hover, hoverinfo="text"),
    ]
    return figure(traces, layout(f"Accepted per round: mean {mean:.2f} of a possible {mean_most:.2f}", "round",
                                 "draft tokens", barmode="stack", bargap=0.15,
                                 yaxis={"range": [0, max(most + [1]) + 0.6]}))


def forward_figure(rounds) -> go.Figure:
    """Tokens per target forward (= per round): this round, running mean, the theory from the measured
    per-token acceptance a (accepted / judged drafts), and plain decoding's 1."""
    if not rounds:
        return empty_figure("Tokens per target forward")
    x = round_numbers(rounds)
    toks = metrics.tokens_so_far(rounds)
    mean = [t / n for t, n in zip(toks, range(1, len(x) + 1))]
    k = max(r.k for r in rounds)
    theory = [metrics.expected_tokens_per_round(a, k) for a in metrics.running_judged_acceptance(rounds)]
    traces = [
        scatter(x, [len(r.emitted) for r in rounds], "this round", "markers",
                marker={"color": COLORS["bonus"], "size": 6, "opacity": 0.6}),
        scatter(x, mean, "measured (running)", line={"color": "#111827", "width": 2}),
        scatter(x, theory, "theory (1−a^(k+1))/(1−a)", line={"color": COLORS["theory"], "dash": "dot", "width": 2}),
        scatter([x[0], x[-1]], [1, 1], "plain decoding", line={"color": COLORS["plain"], "dash": "dash", "width": 1}),
    ]
    return figure(traces, layout(f"Tokens per target forward: {mean[-1]:.2f} (theory {theory[-1]:.2f})",
                                 "round", "tokens", yaxis={"range": [0, k + 1.4]}))


def position_figure(rounds) -> go.Figure:
    """Acceptance by draft position (a tree: by depth), RunStats.acceptance_by_position, against what one overall
    acceptance a predicts (the i.i.d. model: a at every position); the title sets E = 1 + sum_i prod_{j<=i} alpha_j
    beside the measured tokens per target forward."""
    alphas = metrics.acceptance_by_position(rounds)
    if not alphas:
        return empty_figure("Acceptance by position", "Run with sampling or greedy drafts to see this plot")
    a = metrics.judged_acceptance(rounds)
    x = list(range(1, len(alphas) + 1))
    reach, kept = 1.0, []
    for alpha in alphas:
        reach *= alpha
        kept.append(reach)
    expected = metrics.expected_tokens_by_position(alphas)
    measured = sum(len(r.emitted) for r in rounds) / len(rounds)
    traces = [
        {"type": "bar", "x": x, "y": alphas, "name": "α_i measured", "marker": {"color": COLORS["accepted"]},
         "hovertemplate": "position %{x}: %{y:.3f}<extra>kept / judged</extra>"},
        scatter(x, [a] * len(x), f"i.i.d.: a = {a:.2f} everywhere", line={"color": COLORS["theory"], "dash": "dot",
                                                                             "width": 2}),
        scatter(x, kept, "reached and kept: Π α_j", "lines+markers", line={"color": "#111827", "width": 2}),
        scatter(x, [a ** i for i in x], "i.i.d.: a^i", line={"color": COLORS["plain"], "dash": "dash", "width": 1.5}),
    ]
    return figure(traces, layout(f"By position: E = 1 + ΣΠα = {expected:.2f} vs {measured:.2f} measured tokens per "
                                 "forward", "draft position (tree: depth)", "share kept",
                                 yaxis={"range": [-0.05, 1.05]}, xaxis={"dtick": 1}))


def speed_figure(rounds, baseline=None) -> go.Figure:
    """Tokens generated vs engine time, speculative against measured plain decoding; the title says the
    measured speedup, or that the baseline is pending."""
    if not rounds:
        return empty_figure("Speed vs plain decoding")
    t = metrics.elapsed_seconds(rounds)
    toks = metrics.tokens_so_far(rounds)
    spec_tps = toks[-1] / t[-1] if t[-1] > 0 else 0.0
    traces = [scatter([0.0] + t, [0] + toks, f"speculative {spec_tps:.1f} tok/s", "lines+markers",
                      line={"color": COLORS["accepted"], "width": 2, "shape": "hv"}, marker={"size": 4})]
    bt, btoks = metrics.baseline_curve(baseline)
    notes = []
    if bt:
        base_tps = baseline.tokens_per_second
        traces.append(scatter([0.0] + bt, [0] + btoks, f"plain {base_tps:.1f} tok/s",
                              line={"color": COLORS["plain"], "width": 2, "dash": "dash"}))
        speedup = spec_tps / base_tps if base_tps > 0 else 0.0
        title = f"Speedup ×{speedup:.2f} vs plain decoding (measured)"
    else:
        title = f"Speculative {spec_tps:.1f} tok/s: baseline pending"
        notes.append({"text": "plain decoding: baseline pending", "showarrow": False, "x": 0.02, "y": 0.95,
                      "xref": "paper", "yref": "paper", "xanchor": "left",
                      "font": {"size": 11, "color": COLORS["plain"]}})
    return figure(traces, layout(title, "seconds (engine time)", "tokens generated", annotations=notes))


TIME_TITLE = "Where the time goes"
TIME_PENDING = "Appears once the speed is measured: the run timed again and plain decoding, nothing drawn"


def time_figure(rounds, baseline=None) -> go.Figure:
    """Each round's draft, verify and overhead stacked in plain decoding steps (metrics.round_costs), the tokens
    it emitted beside them, and a dashed line at one step (what verifying costs on a GPU). Give it the timed
    run's rounds and the plain run measured with it; without both it says when it will appear."""
    costs = metrics.round_costs(rounds, baseline) if rounds else []
    if not costs:
        return empty_figure(TIME_TITLE, TIME_PENDING)
    x = [c.round for c in costs]
    step_ms = 1000 * metrics.plain_step_seconds(baseline)
    hover = "round %{x}: %{y:.2f} plain steps<extra>%{fullData.name}</extra>"
    traces = [
        {"type": "bar", "x": x, "y": [getattr(c, part) for c in costs], "name": part, "marker": {"color": color},
         "hovertemplate": hover}
        for part, color in (("draft", COLORS["draft"]), ("verify", COLORS["target"]), ("overhead", "#c4c8cf"))
    ]
    traces += [
        scatter(x, [c.tokens for c in costs], "tokens emitted", "markers", hovertemplate="round %{x}: %{y} tokens",
                marker={"color": COLORS["accepted"], "symbol": "diamond", "size": 7,
                        "line": {"color": "white", "width": 1}}),
        scatter([x[0] - 0.5, x[-1] + 0.5], [1, 1], "1 plain step", line={"color": COLORS["plain"], "dash": "dash",
                                                                          "width": 1.5}, hoverinfo="skip"),
    ]
    n = len(costs)
    mean = {part: sum(getattr(c, part) for c in costs) / n for part in ("draft", "verify", "overhead")}
    tokens = sum(c.tokens for c in costs) / n
    title = (f"{TIME_TITLE}: {sum(mean.values()):.2f} plain steps a round for {tokens:.2f} tokens (draft "
             f"{mean['draft']:.2f}, verify {mean['verify']:.2f}, overhead {mean['overhead']:.2f}; "
             f"1 step = {step_ms:.1f} ms)")
    return figure(traces, layout(title, "round (timed run)", "plain decoding steps", barmode="stack", bargap=0.15))


def kv_figure(rounds) -> go.Figure:
    """Cache lengths per round: after the verify forward (before trimming) and after trimming."""
    if not rounds:
        return empty_figure("KV cache length per round")
    x = round_numbers(rounds)
    traces = [
        scatter(x, [r.target_cache_len_before for r in rounds], "target before trim", "markers",
                marker={"symbol": "triangle-up", "color": COLORS["target"], "size": 7, "opacity": 0.6}),
        scatter(x, [r.target_cache_len for r in rounds], "target after trim",
                line={"color": COLORS["target"], "width": 2}),
    ]
    if any(r.draft_cache_len is not None for r in rounds):
        traces += [
            scatter(x, [r.draft_cache_len_before for r in rounds], "draft before trim", "markers",
                    marker={"symbol": "x", "color": COLORS["draft"], "size": 6}),
            scatter(x, [r.draft_cache_len for r in rounds], "draft after trim",
                    line={"color": COLORS["draft"], "width": 1.5, "dash": "dot"}),
        ]
    traces.append(scatter(x, [r.committed_len for r in rounds], "committed tokens",
                          line={"color": "#9ca3af", "width": 1, "dash": "dash"}))
    return figure(traces, layout("KV cache length per round (positions)", "round", "positions", height=300))


def signed(n: int) -> str:
    """A change in positions with its sign: "+3", "−2" (a minus sign, not a hyphen), "0"."""
    return f"+{n}" if n > 0 else f"−{-n}" if n < 0 else "0"


def cache_growth(ev, previous=None) -> tuple[int, int | None]:
    """How much each cache grew this round: its length after trimming minus the previous round's (target, draft).

    The first round's target starts from the prefill, which its verify forward extended by the last prompt token
    plus the drafts. Without a draft cache, or with no previous round (the drafter's prefill length is not in the
    events), the draft's growth is None. With no EOS the target grows by exactly the tokens emitted: accepted + 1.
    """
    start = (previous.target_cache_len if previous is not None
             else ev.target_cache_len_before - len(ev.drafted) - 1)
    draft = None
    if previous is not None and ev.draft_cache_len is not None and previous.draft_cache_len is not None:
        draft = ev.draft_cache_len - previous.draft_cache_len
    return ev.target_cache_len - start, draft


def cache_change(before: int, after: int) -> str:
    """Before → after the trim step, with the signed change (a drafter may feed positions back in after trimming)."""
    return f"{before} → {after} ({signed(after - before)})"


def kv_moves(ev) -> list[tuple[int, int]]:
    """A tree round's kept entries as (from, to) cache positions: the verify forward wrote node i at position
    start + i (start: the committed length before the round; the root sits just before it), and `keep_path` moved
    the path's j-th node to start + j, dropping every other node's entries. [] for a chain round."""
    if ev.tree_parents is None:
        return []
    start = ev.committed_len - len(ev.emitted)
    return [(start + i, start + j) for j, i in enumerate(ev.tree_path or [])]


def tree_kv_text(ev) -> str:
    """The KV table's tree column: how many node entries were kept and which moved ("–" for a chain round)."""
    if ev.tree_parents is None:
        return "–"
    moves = kv_moves(ev)
    moved = [f"{a}→{b}" for a, b in moves if a != b]
    return (f"kept {len(moves)} of {len(ev.drafted)} nodes" + (f"; moved {', '.join(moved)}" if moved else "")
            + f"; dropped {len(ev.drafted) - len(moves)}")


def kv_rows(rounds, last: int = 200) -> list[list]:
    """Table rows: round, drafted, accepted, committed, target before → after trim (change), draft before → after
    (change), how much each cache grew this round, and for a tree round which node entries were kept and moved."""
    rows = []
    rounds = list(rounds)
    for n in range(max(len(rounds) - last, 0), len(rounds)):
        r = rounds[n]
        previous = rounds[n - 1] if n and rounds[n - 1].index == r.index - 1 else None
        target_grew, draft_grew = cache_growth(r, previous)
        no_draft = r.draft_cache_len is None or r.draft_cache_len_before is None
        rows.append([r.index + 1, len(r.drafted), r.accepted, r.committed_len,
                     cache_change(r.target_cache_len_before, r.target_cache_len),
                     "–" if no_draft else cache_change(r.draft_cache_len_before, r.draft_cache_len),
                     signed(target_grew), "–" if draft_grew is None else signed(draft_grew), tree_kv_text(r)])
    return rows[::-1]


KV_COLUMNS = ["round", "drafted", "accepted", "committed", "target cache", "draft cache", "target grew", "draft grew",
              "tree entries"]

COMPARE_AXES = {"k": "k", "temperature": "temperature", "top-p": "top_p", "draft": "draft", "rule": "rule"}


def comparison_figure(summaries: list[tuple[dict, object]], axis: str = "k") -> go.Figure:
    """Acceptance and measured speedup of every finished run against one setting, one colour per draft."""
    from plotly.subplots import make_subplots
    if not summaries:
        return empty_figure("Runs compared", "Finished runs appear here")
    attr = COMPARE_AXES.get(axis, "k")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance rate", "speedup vs plain (measured)"),
                        horizontal_spacing=0.1)
    by_draft: dict[str, list] = {}
    for summary, settings in summaries:
        by_draft.setdefault(summary["draft_label"], []).append((summary, settings))
    palette = ["#2f9e5b", "#4a7fe0", "#e39a26", "#d64545", "#7c3aed", "#0e9aa7", "#6b7280", "#b45309"]
    for n, (label, runs) in enumerate(by_draft.items()):
        color = palette[n % len(palette)]
        xs = [summary["draft_label"] if attr == "draft" else getattr(settings, attr) for summary, settings in runs]
        hover = [f"run {s['run_id']}{' · ' + s['scenario'] if s.get('scenario') else ''}: k={st.k}, "
                 f"T={st.temperature}, top-p={st.top_p}, {st.rule}" for s, st in runs]
        tags = [run_tag(s) for s, _ in runs]      # on the point itself: which dot is scenario 5
        fig.add_trace(go.Scatter(x=xs, y=[s["acceptance_rate"] for s, _ in runs], mode="markers+text", name=label,
                                 marker={"color": color, "size": 9}, text=tags, hovertext=hover, hoverinfo="text",
                                 textposition="middle right", textfont={"size": 10}, legendgroup=label),
                      row=1, col=1)
        sp = [(x, s["speedup"], t, h) for x, (s, _), t, h in zip(xs, runs, tags, hover) if s["speedup"] is not None]
        fig.add_trace(go.Scatter(x=[a for a, *_ in sp], y=[b for _, b, *_ in sp], mode="markers+text", name=label,
                                 marker={"color": color, "size": 9, "symbol": "diamond"}, text=[c for _, _, c, _ in sp],
                                 hovertext=[h for *_, h in sp], hoverinfo="text", textposition="middle right",
                                 textfont={"size": 10}, legendgroup=label, showlegend=False), row=1, col=2)
    fig.add_hline(y=1.0, line={"color": "#9ca3af", "dash": "dash", "width": 1}, row=1, col=2)
    fig.update_yaxes(range=[-0.05, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text=axis, dtick=1 if attr == "k" else None)
    fig.update_annotations(font_size=12)
    fig = base_layout(fig, f"Runs compared by {axis}", "", "", height=330)
    fig.update_layout(margin={"l": 48, "r": 12, "t": 70, "b": 40})
    fig.update_xaxes(title_text=axis)
    if attr == "draft":   # the x axis names the drafts already: a legend of the same names only collided with it
        fig.update_layout(showlegend=False, margin={"l": 48, "r": 12, "t": 70, "b": 90})
        fig.update_xaxes(tickangle=-25, title_text="")
    return fig


def run_tag(summary: dict) -> str:
    """A point's label: the scenario's tag ('S5') when the run was one, else its run number ('#7')."""
    scenario = summary.get("scenario") or ""
    return scenario.split(" · ", 1)[0] if scenario else f"#{summary['run_id']}"


MISMATCH_PAIR_COLORS = ("#d64545", "#e39a26")      # (a) naive ids, (b) re-tokenized
MISMATCH_SCALE_COLOR = "#9ca3af"


def mismatch_bars(group: list[dict], name: str, colour: str, meta: str) -> dict:
    """One bar trace of the mismatch figure: acceptance with its 90% interval over rounds as a whisker."""
    rate = [r["acceptance_rate"] for r in group]
    return {
        "type": "bar", "name": name, "meta": meta, "x": [r["label"] for r in group], "y": rate,
        "text": [f"{a:.0%}" for a in rate], "textposition": "outside", "cliponaxis": False,
        "marker": {"color": colour},
        "error_y": {"type": "data", "symmetric": False, "color": "#374151", "thickness": 1.2, "width": 6,
                    "array": [max(0.0, r["high"] - a) for r, a in zip(group, rate)],
                    "arrayminus": [max(0.0, a - r["low"]) for r, a in zip(group, rate)]},
        "customdata": [[r["low"], r["high"], r["tokens_per_forward"], r["rounds"]] for r in group],
        "hovertemplate": "%{x}<br>acceptance %{y:.1%} (90%: %{customdata[0]:.1%} to %{customdata[1]:.1%})"
                         "<br>%{customdata[2]:.2f} tokens per target forward, %{customdata[3]} rounds"
                         "<extra></extra>"}


def mismatch_figure(results: list[dict], draft_name: str = "the other-tokenizer draft") -> go.Figure:
    """The tokenizer-mismatch lesson as one contrast: the same other-tokenizer draft (`pair` results) with naive ids
    and re-tokenized, each with its 90% interval over rounds (`low`, `high`: metrics.acceptance_interval); the
    same-tokenizer drafts beside them in grey, for scale only, since they are other drafters. Each of the pair's bars
    is its own trace, so its legend entry shows its own colour (a legend draws one swatch per trace: one trace
    coloured per bar showed the first bar's red for both). The axis fits the bars rather than 0-100%, where every bar
    of a small model looks alike."""
    if not results:
        return empty_figure("Acceptance by draft", "Press the button to run the demo")
    top = max([r["high"] for r in results] + [r["acceptance_rate"] for r in results] + [0.04])
    pair = [r for r in results if r["pair"]]
    scale = [r for r in results if not r["pair"]]
    traces = [mismatch_bars([r], f"{r['label']}: {draft_name}", MISMATCH_PAIR_COLORS[i % 2], "pair")
              for i, r in enumerate(pair)]
    if scale:
        traces.append(mismatch_bars(scale, "same tokenizer: other drafts, for scale", MISMATCH_SCALE_COLOR, "scale"))
    notes = []
    pair = {r["label"][:3]: r for r in pair}
    naive, retok = pair.get("(a)"), pair.get("(b)")
    if naive and retok:
        gain = (f"×{retok['acceptance_rate'] / naive['acceptance_rate']:.0f} the acceptance"
                if naive["acceptance_rate"] > 0 else f"from 0 to {retok['acceptance_rate']:.0%}")
        apart = retok["low"] > naive["high"]
        notes.append({"text": f"re-tokenizing: {gain}" + ("" if apart else " (intervals overlap: within noise)"),
                      "x": 0.5, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                      "font": {"size": 12, "color": "#b45309" if apart else "#6b7280"}})
    title = "Acceptance by draft (same prompt, greedy), with 90% intervals"
    return figure(traces, layout(title, "", "accepted / drafted", height=320, annotations=notes, barmode="overlay",
                                 yaxis={"range": [0, top * 1.3], "tickformat": ".0%"}, margin={"t": 52}))
