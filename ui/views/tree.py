"""Tree rounds (RoundEvents with `tree_parents`) -> a Plotly figure and the token view's HTML. Pure functions.

A tree round lists every node in `drafted`; `tree_parents` says how they hang (-1: the root, the last committed
token), `tree_path` which were kept, `tree_tried` which the sampling rule judged, in order (its `accept_probs` and
`uniforms` follow that order; under greedy every child of the root and of a kept node is compared with the
target's argmax). Each node is one of:

    accepted    on the accepted path
    rejected    judged and refused (sampling: tried by the rule; greedy: not the target's argmax)
    unreached   never judged: its parent was refused, or the path ended before it

and the round's emitted token after the path is drawn as one more child: the correction (every sibling at that
level refused, drawn from the residual left after them; under greedy, the target's argmax) or the bonus (the path
ended at a leaf, drawn from p).

Token text comes from a model: every string is escaped with `html.escape` before it reaches the HTML view or the
figure (Plotly reads `<b>`, `<br>`, `<a href>` and friends in text and hover labels; it decodes `&lt;`, `&gt;` and
`&amp;` but not `&quot;`, and quotes outside a tag are plain text there, so the figure escapes <, > and & only).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

import spec_engine as se

from ui.views import plots
from ui.views.render import RenderOptions, candidates_text, esc, fmt_prob, show_text, token_span
from ui.views.tokens import Labeler

TREE_ROUNDS = 6             # the run view draws the newest tree rounds, this many
ROW_PX = 34                 # vertical room per leaf
LABEL_CHARS = 14            # token text on the figure is cut to this (the hover has it whole)
NODE_KINDS = {
    "accepted": ("accepted: on the kept path", plots.COLORS["accepted"]),
    "rejected": ("rejected: judged and refused", plots.COLORS["rejected"]),
    "unreached": ("never reached: below a refused node", "#b8bec7"),
    "correction": ("correction: every sibling refused, drawn from the residual", plots.COLORS["correction"]),
    "bonus": ("bonus: the path reached a leaf", plots.COLORS["bonus"]),
}


NOTHING_DRAFTED = "no match to copy, or no tree worth its verify"     # why a tree round drafts no node


def tree_draft_names() -> list[str]:
    """The registered draft modes that draft trees (spec_engine's registry: a new one is named without an edit)."""
    return [name for name, mode in se.draft_modes().items() if mode.tree]


def kind_name(kind: str, opts: RenderOptions) -> str:
    """The legend's words for a kind of node: a correction's source follows the decision (greedy takes the target's
    argmax and has no residual; only the exact rule draws from the residual the refused siblings left)."""
    if kind == "correction" and opts.greedy:
        return "correction: no child was the target's argmax, so the argmax is taken"
    if kind == "correction" and opts.rule != "exact":
        return plotly_text(f"correction: every sibling refused, chosen by rule '{opts.rule}'")
    return NODE_KINDS[kind][0]


def node_kinds(ev) -> list[str]:
    """The kind of every node of a tree round (see the module docstring)."""
    path = set(ev.tree_path or [])
    if ev.tree_tried:
        judged = set(ev.tree_tried)
    else:            # greedy: the children of the root and of every kept node were compared with the argmax
        judged = {i for i, parent in enumerate(ev.tree_parents) if parent < 0 or parent in path}
    ended = ev.correction is None and ev.bonus is None          # EOS inside the path: nothing after it was judged
    return ["accepted" if i in path else "rejected" if i in judged and not ended else "unreached"
            for i in range(len(ev.drafted))]


def depths(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def next_kind(ev) -> tuple[str, int] | None:
    """("correction" | "bonus", token) of the round's emitted token after the path, or None (EOS on the path)."""
    if ev.correction is not None:
        return "correction", ev.correction
    if ev.bonus is not None:
        return "bonus", ev.bonus
    return None


def judged_text(ev, i: int, kind: str, label: Labeler, opts: RenderOptions) -> list[str]:
    """How node i was judged: the rule's numbers (sampling) or the argmax test (greedy)."""
    tried = list(ev.tree_tried or [])
    if i in tried and tried.index(i) < len(ev.accept_probs):
        j = tried.index(i)
        a, u = ev.accept_probs[j], ev.uniforms[j] if j < len(ev.uniforms) else None
        earlier = any(ev.tree_parents[t] == ev.tree_parents[i] for t in tried[:j])
        lines = [f"min(1, r/q) = {fmt_prob(a)}" + ("  (r: the residual the earlier siblings left)" if earlier
                                                   else "  (r = p: the first sibling tried)")]
        if u is not None:
            verdict = "<" if kind == "accepted" else "≥"
            lines.append(f"uniform draw u = {fmt_prob(u)} {verdict} {fmt_prob(a)} → {kind.upper()}")
        return lines
    if kind == "unreached":
        return ["never judged: its parent was refused (or the path ended before it)"]
    parent = ev.tree_parents[i]
    if opts.greedy or not ev.tree_tried:
        if kind == "accepted":
            return ["greedy: equals the target's argmax, ACCEPTED"]
        top = ev.target_top[parent + 1][0][0] if parent + 1 < len(ev.target_top) and ev.target_top[parent + 1] else None
        return [f"greedy: the target's argmax is {show_text(label(top)) if top is not None else '?'}, REJECTED"]
    return []


def node_tip(ev, i: int, kind: str, label: Labeler, opts: RenderOptions) -> list[str]:
    """Plain-text lines about node i (escape before use in HTML)."""
    depth = depths(ev.tree_parents)[i]
    piece = label(ev.drafted[i])
    p = ev.target_probs[i] if i < len(ev.target_probs) else None
    q = ev.draft_probs[i] if i < len(ev.draft_probs) else None
    lines = [f"round {ev.index + 1} · tree node {i + 1}/{len(ev.drafted)} · depth {depth} · {kind}",
             f"token {show_text(piece)} (id {ev.drafted[i]})",
             ("p(x) target (softmax, T=1)" if opts.greedy else "p(x) target") + f" = {fmt_prob(p)}  (after its parent)",
             f"q(x) draft = {fmt_prob(q)}" + ("  (deterministic siblings: q is one-hot)" if q == 1.0 and not opts.greedy
                                               else "")]
    lines += judged_text(ev, i, kind, label, opts)
    row = ev.tree_parents[i] + 1
    if row < len(ev.target_top) and ev.target_top[row]:
        lines.append("target top here: " + candidates_text(ev.target_top[row], label, 3))
    return lines


def next_tip(ev, kind: str, token: int, label: Labeler, opts: RenderOptions) -> list[str]:
    """Plain-text lines about the round's correction or bonus."""
    lines = [f"round {ev.index + 1} · {kind}", f"token {show_text(label(token))} (id {token})"]
    if kind == "correction":
        if opts.greedy:
            lines.append("no child of the last kept node was the target's argmax: the argmax is taken")
        elif opts.rule == "exact":
            lines.append("every sibling at this level was refused: drawn from the residual r they left")
        else:
            lines.append(f"rule '{opts.rule}' judged each sibling against p itself (wrong on purpose)")
        label_top = "residual top" if opts.rule == "exact" and not opts.greedy else "top candidates"
    else:
        lines.append("no draft this round: the target's own next token" if not ev.drafted
                     else "the path reached a leaf: a free token from the target's distribution after it")
        label_top = "top candidates"
    if ev.next_top and not opts.greedy:
        lines.append(f"{label_top}: " + candidates_text(ev.next_top, label))
    else:
        last = ev.tree_path[-1] if ev.tree_path else -1
        if last + 1 < len(ev.target_top) and ev.target_top[last + 1]:
            lines.append("target top here: " + candidates_text(ev.target_top[last + 1], label, 3))
    return lines


def hover(lines: list[str]) -> str:
    """Plotly hover text: every line escaped (Plotly renders <b>, <br>, <a> and the like), joined by <br>."""
    return "<br>".join(plotly_text(line) for line in lines)


def plotly_text(text: str) -> str:
    """Text for Plotly's pseudo-HTML: <, > and & escaped, so no tag can form (Plotly shows &quot; literally)."""
    return html.escape(text, quote=False)


def short_label(text: str) -> str:
    shown = show_text(text)[1:-1]             # JSON-quoted, control characters spelled out; quotes dropped
    return plotly_text(shown if len(shown) <= LABEL_CHARS else shown[:LABEL_CHARS - 1] + "…")


# ------------------------------------------------------------------------------------------------ the token view

def text_nodes(ev) -> list[tuple[int, str]]:
    """The nodes the token view writes into the text, in order: the kept path (accepted), then the refused
    siblings where the path stopped (rejected, struck through). The rest of the tree is in the tree view."""
    kinds = node_kinds(ev)
    last = ev.tree_path[-1] if ev.tree_path else -1
    stop = [i for i, parent in enumerate(ev.tree_parents) if parent == last and kinds[i] == "rejected"]
    return [(i, "accepted") for i in (ev.tree_path or [])] + [(i, "rejected") for i in stop]


def round_html(ev, label: Labeler, opts: RenderOptions = RenderOptions()) -> str:
    """One tree round in the token view: the accepted path, the siblings refused where it stopped, then the
    correction or bonus. Hover shows the same numbers as the tree view."""
    spans = []
    for i, kind in text_nodes(ev):
        data = {"round": ev.index, "node": i, "id": ev.drafted[i]}
        spans.append(token_span(kind, label(ev.drafted[i]), "\n".join(node_tip(ev, i, kind, label, opts)), opts, data))
    emitted = next_kind(ev)
    if emitted is not None:
        kind, token = emitted
        spans.append(token_span(kind, label(token), "\n".join(next_tip(ev, kind, token, label, opts)), opts,
                                {"round": ev.index, "id": token}))
    title = (f"round {ev.index + 1}: a draft tree of {len(ev.drafted)} nodes, depth {ev.draft_length}; "
             f"{ev.accepted} accepted on its path, emitted {len(ev.emitted)}" + (f"; {ev.note}" if ev.note else ""))
    note = '<span class="note" title="a draft tree: see the Draft tree view">🌳</span>'
    return (f'<span class="round tree" data-round="{ev.index}" data-n="{ev.index + 1}" title="{esc(title)}">'
            f'{"<wbr>".join(spans)}{note}</span><wbr>')


# ---------------------------------------------------------------------------------------------------- the figure

def layout_round(ev) -> tuple[list[float], list[int], float]:
    """(y of every node and then of the emitted token, x of the same, rows used): leaves one row apart in depth-first
    order, a parent midway between its first and last child; x is the depth (the root at 0, y of the root last)."""
    parents = list(ev.tree_parents)
    n = len(parents)
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    last = ev.tree_path[-1] if ev.tree_path else -1
    extra = n                                              # the emitted token hangs below the last kept node
    if next_kind(ev) is not None:
        children.setdefault(last, []).append(extra)
    y: dict[int, float] = {}
    row = 0

    def place(node: int) -> float:
        nonlocal row
        kids = children.get(node, [])
        if not kids:
            y[node] = float(row)
            row += 1
        else:
            spots = [place(kid) for kid in kids]
            y[node] = (spots[0] + spots[-1]) / 2
        return y[node]

    place(-1)
    depth = depths(parents)
    xs = depth + ([(depth[last] if last >= 0 else 0) + 1] if extra in y else [])
    ys = [y[i] for i in range(n)] + ([y[extra]] if extra in y else [])
    return ys + [y[-1]], xs + [0], float(max(row, 1))


def tree_figure(rounds, label: Labeler, opts: RenderOptions = RenderOptions(), last: int = TREE_ROUNDS,
                title: str | None = None) -> go.Figure:
    """The newest `last` tree rounds of `rounds` that drafted a node, one tree each, stacked top to bottom in order:
    the root (the last committed token) on the left, depth to the right. Nodes coloured by kind (NODE_KINDS); edges
    of the kept path drawn bold; hover: the token, p, q, the rule's numbers and the residual's candidates. Rounds
    that drafted nothing (suffix decoding without a match: most rounds of a text that does not repeat itself) are
    counted in the title instead: drawn, they were a lone root and bonus each and hid the rounds that drafted."""
    rounds = list(rounds)
    roots = {}
    for before, ev in zip([None] + rounds[:-1], rounds):
        roots[ev.index] = before.emitted[-1] if before is not None and before.emitted else None
    trees = [ev for ev in rounds if ev.is_tree]
    empty = sum(1 for ev in trees if not ev.drafted)
    skipped = (f"{empty} of {len(trees)} tree rounds drafted nothing, not drawn:<br>{NOTHING_DRAFTED}"
               if empty else "")
    trees = [ev for ev in trees if ev.drafted][-last:]
    if not trees:
        return plots.empty_figure(title or "Draft tree", skipped + "<br>(the target took a plain step)" if skipped else
                                  f"Tree drafts ({', '.join(tree_draft_names())}) are drawn here")
    points = {kind: {"x": [], "y": [], "text": [], "hover": []} for kind in ("root", *NODE_KINDS)}
    edges = {"path": ([], []), "other": ([], [])}
    notes = []
    offset = 0.0
    for ev in trees:
        ys, xs, rows = layout_round(ev)
        ys = [offset + v for v in ys]
        kinds = node_kinds(ev)
        n = len(ev.drafted)
        emitted = next_kind(ev)
        path = set(ev.tree_path or [])
        for i in range(n + (emitted is not None)):
            parent = ev.tree_parents[i] if i < n else (ev.tree_path[-1] if ev.tree_path else -1)
            px, py = (0, ys[-1]) if parent < 0 else (xs[parent], ys[parent])
            bold = i in path or (i == n and (parent < 0 or parent in path))
            ex, ey = edges["path" if bold else "other"]
            ex += [px, xs[i], None]
            ey += [py, ys[i], None]
        for i, kind in enumerate(kinds):
            add(points[kind], xs[i], ys[i], short_label(label(ev.drafted[i]).text),
                hover(node_tip(ev, i, kind, label, opts)))
        if emitted is not None:
            kind, token = emitted
            add(points[kind], xs[n], ys[n], short_label(label(token).text),
                hover(next_tip(ev, kind, token, label, opts)))
        root = roots.get(ev.index)
        root_text = "…" if root is None else short_label(label(root).text)
        add(points["root"], 0, ys[-1], root_text, hover([f"round {ev.index + 1} · the root",
                                                         "the last committed token: every branch continues it"]
                                                        + ([f"token {show_text(label(root))} (id {root})"]
                                                           if root is not None else [])))
        notes.append({"text": f"round {ev.index + 1}", "x": 0, "y": ys[-1], "xref": "x", "yref": "y",
                      "xanchor": "right", "xshift": -14, "showarrow": False, "font": {"size": 11, "color": "#6b7280"}})
        offset += rows + 0.8
    traces = [plots.scatter(*edges["other"], "edge", line={"color": "#cbd5e1", "width": 1.5}, hoverinfo="skip",
                            showlegend=False),
              plots.scatter(*edges["path"], "kept path", line={"color": plots.COLORS["accepted"], "width": 3},
                            hoverinfo="skip", showlegend=False)]
    for kind, pts in points.items():
        if not pts["x"]:
            continue
        name, colour = (("root: the last committed token", "#374151") if kind == "root"
                        else (kind_name(kind, opts), NODE_KINDS[kind][1]))
        symbol = "diamond" if kind in ("correction", "bonus") else "square" if kind == "root" else "circle"
        traces.append(plots.scatter(pts["x"], pts["y"], name, "markers+text", text=pts["text"],
                                    textposition="top center", textfont={"size": 11, "color": "#111827"},
                                    hovertext=pts["hover"], hoverinfo="text",
                                    marker={"color": colour, "size": 13, "symbol": symbol,
                                            "line": {"color": "#ffffff", "width": 1}}))
    depth = max(max(depths(ev.tree_parents), default=0) for ev in trees) + 1
    height = int(min(max(190 + offset * ROW_PX, 300), 1100))
    heading = title or heading_of(trees, skipped)
    shape = plots.layout(heading, "depth (0: the root)", "", height=height, annotations=notes,
                         hoverlabel={"align": "left"},
                         xaxis={"range": [-0.9, depth + 0.6], "dtick": 1, "showgrid": False},
                         yaxis={"autorange": "reversed", "visible": False},
                         margin={"l": 60, "t": 24 + 16 * (heading.count("<br>") + 1), "b": 120},
                         legend={"y": -60 / (height - 160)})
    shape["title"].update(y=1, yref="container", yanchor="top", pad={"t": 16})       # its lines go down from the top
    fig = plots.figure(traces, shape)
    return fig


def heading_of(trees: list, skipped: str) -> str:
    """The run view's title: which rounds are drawn, then (on lines of their own) the rounds that drafted nothing."""
    shown = f"the newest {len(trees)} tree rounds" if len(trees) > 1 else f"round {trees[0].index + 1}"
    return f"Draft tree: {shown} (hover a node for p, q and the decision)" + (f"<br>{skipped}" if skipped else "")


def add(points: dict, x: float, y: float, text: str, hover_text: str) -> None:
    points["x"].append(x)
    points["y"].append(y)
    points["text"].append(text)
    points["hover"].append(hover_text)
