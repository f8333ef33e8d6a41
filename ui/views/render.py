"""RoundEvents -> HTML. Pure functions: no model, no Gradio, no probability computed here.

Every piece of model text and every tooltip goes through `html.escape`. Each token is a
`<span class="tok KIND" data-kind=... data-tip=...>` whose tooltip is drawn by CSS from `data-tip` (so it
works on hover, in a headless browser too, and never injects markup). Words as in spec_engine/core/verify.py:
accepted, rejected (struck through, where it was proposed), discarded (faded), correction, bonus.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Iterable

from ui.views.tokens import Labeler, Piece

KINDS = {
    "accepted": "accepted draft token",
    "rejected": "rejected draft token",
    "discarded": "discarded draft token (after the rejection: never judged)",
    "correction": "correction (drawn at the rejection)",
    "bonus": "bonus (all drafts accepted)",
}

CSS = """
.spec-view { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 14px;
  line-height: 2.1; padding: 6px 4px 24px 4px; color: var(--body-text-color, #1f2937); }
.spec-view .legend { font-family: var(--font, system-ui, sans-serif); font-size: 12.5px; line-height: 1.9;
  margin-bottom: 6px; display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; }
.spec-view .lg { border-radius: 4px; padding: 0 4px; border: 1px solid transparent; color: #111827; }
.spec-view .tok { position: relative; border-radius: 4px; padding: 1px 1px; margin: 0 1px;
  white-space: pre-wrap; cursor: help; border: 1px solid transparent; color: #111827; }
.spec-view .accepted { background: #c8f0d2; border-color: #7fcf97; }
.spec-view .rejected { background: #fbd5d5; border-color: #e58c8c; color: #9b1c1c;
  text-decoration: line-through; text-decoration-color: #c81e1e; text-decoration-thickness: 2px; }
.spec-view .discarded { background: #eceff3; color: #6b7280; opacity: 0.55; border-style: dashed;
  border-color: #b8bec7; }
.spec-view .correction { background: #ffdfa8; border-color: #e39a26; font-weight: 600; }
.spec-view .bonus { background: #cfe0ff; border-color: #6f9cf0; font-weight: 600; }
.spec-view .special { font-style: italic; outline: 1px dotted #7c3aed; }
.spec-view .tok.partial { text-decoration: underline dotted; }
.spec-view .ws { color: #9aa3af; }
.spec-view .tok.rejected .ws, .spec-view .tok.discarded .ws { color: inherit; }
.spec-view .tok:hover { outline: 2px solid #374151; z-index: 30; }
.spec-view .tok::after { content: attr(data-tip); display: none; position: absolute; left: 0; top: 115%;
  z-index: 40; min-width: 230px; max-width: 380px; width: max-content; white-space: pre-line;
  background: #111827; color: #f9fafb; font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace;
  font-weight: 400; text-decoration: none; padding: 6px 8px; border-radius: 6px; opacity: 1;
  box-shadow: 0 4px 14px rgba(0,0,0,.3); pointer-events: none; }
.spec-view .tok:hover::after { display: block; }
.spec-view .round { border-left: 2px solid #9ca3af; padding-left: 2px; margin-left: 3px; position: relative; }
.spec-view .round::before { content: attr(data-n); font-size: 9px; color: #6b7280; vertical-align: super;
  margin-right: 1px; font-family: system-ui, sans-serif; }
.spec-view .note { font-size: 11px; color: #7c3aed; }
.spec-view details.prompt { font-size: 12px; color: #6b7280; margin-bottom: 4px; line-height: 1.5; }
.spec-view details.prompt .ptext { white-space: pre-wrap; background: rgba(127,127,127,.08); padding: 4px 6px;
  border-radius: 4px; max-height: 160px; overflow: auto; }
.spec-view .empty-msg { color: #6b7280; font-family: system-ui, sans-serif; }
.spec-view.legend-only { padding: 0 4px; }
.spec-view .status-line { font-family: system-ui, sans-serif; font-size: 12.5px; color: #6b7280; margin-top: 6px; }
.spec-stats { display: flex; flex-wrap: wrap; gap: 6px; font-family: var(--font, system-ui, sans-serif); }
.spec-stats .chip { border: 1px solid rgba(127,127,127,.3); border-radius: 8px; padding: 4px 9px; min-width: 92px; }
.spec-stats .chip .k { font-size: 11px; color: #6b7280; display: block; }
.spec-stats .chip .v { font-size: 16px; font-weight: 600; }
.spec-stats .chip.pending .v { color: #9ca3af; font-size: 13px; font-weight: 500; }
.spec-stats .chip.good .v { color: #15803d; }
.spec-stats .chip.bad .v { color: #b91c1c; }
.spec-stats .msg { width: 100%; font-size: 12.5px; color: #6b7280; }
.mm-head { font-size: 13px; margin: 10px 0 2px 0; font-family: system-ui, sans-serif; }
.mm-box { max-height: 230px; overflow-y: auto; border: 1px solid rgba(127,127,127,.25); border-radius: 6px; }
.spec-tokcmp { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 13px; line-height: 2; }
.spec-tokcmp .row { margin: 4px 0; }
.spec-tokcmp .lbl { font-family: system-ui, sans-serif; font-size: 12px; color: #6b7280; display: inline-block;
  min-width: 150px; }
.spec-tokcmp .tok { display: inline-block; border: 1px solid #b8bec7; border-radius: 4px; padding: 0 2px; margin: 1px;
  white-space: pre; line-height: 1.6; }
.spec-tokcmp .tok sub { font-size: 9px; color: #6b7280; }
.spec-tokcmp .tok.alt { background: #eef2ff; }
"""

# Presentation mode, for a projector: large type and fills that survive a washed-out image (saturated mid-tones
# with dark 2 px borders instead of pastels). The redundant coding stays: rejected struck through, corrections and
# bonuses bold, discarded dashed. Every rule sits under `html.spec-present`, a class PRESENTATION_JS toggles in the
# browser (no server round-trip). Tick labels and axis titles follow by CSS (!important outranks the inline sizes
# Plotly writes on its SVG text); titles and legends are sized by PLOT_PRESENT_JS instead, since Plotly places them
# by their measured size. Plots take the full width, one per row, so their titles fit. The step-through's table
# (stepper.STEP_CSS) and the small buttons grow too. Gradio nests each component's css_template under the
# component's id, so every selector below gets an id's weight from `:not(#spec-id-weight)` (which matches every
# element).
PRESENTATION_CSS = """
html.spec-present { --body-text-color: #000; --body-text-color-subdued: #1f2937; --block-label-text-color: #111827;
  --block-info-text-color: #1f2937; --block-label-text-size: 16px; --block-info-text-size: 15px;
  --text-md: 17px; --text-lg: 19px; --input-text-size: 17px; --button-small-text-size: 16px;
  --button-medium-text-size: 17px; --button-large-text-size: 18px; }
html.spec-present #spec-caption p, html.spec-present #spec-explain p {
  font-size: 18px; line-height: 1.45; color: #000; }
html.spec-present .spec-view { font-size: 24px; line-height: 2.0; color: #000; }
html.spec-present .spec-view .legend { font-size: 15px; line-height: 1.7; }
html.spec-present .spec-view .legend > span:last-child { display: none; }   /* the hover hint: room for tokens */
html.spec-present .spec-view .tok, html.spec-present .spec-view .lg { color: #000; border-width: 2px; }
html.spec-present .spec-view .accepted { background: #4ade80; border-color: #14532d; }
html.spec-present .spec-view .rejected { background: #f87171; border-color: #7f1d1d; color: #000;
  text-decoration: line-through; text-decoration-color: #000; text-decoration-thickness: 3px; }
html.spec-present .spec-view .discarded { background: #d1d5db; color: #1f2937; opacity: 0.8; border-style: dashed;
  border-color: #111827; }
html.spec-present .spec-view .correction { background: #fb923c; border-color: #7c2d12; font-weight: 700; }
html.spec-present .spec-view .bonus { background: #60a5fa; border-color: #1e3a8a; font-weight: 700; }
html.spec-present .spec-view .ws { color: #374151; }
html.spec-present .spec-view .round { border-left: 3px solid #111827; }
html.spec-present .spec-view .round::before { font-size: 15px; color: #111827; font-weight: 600; }
html.spec-present .spec-view .note, html.spec-present .spec-view details.prompt,
html.spec-present .spec-view .status-line, html.spec-present .spec-view .empty-msg { font-size: 17px; color: #111827; }
html.spec-present .spec-stats .chip { border: 2px solid #374151; padding: 1px 7px; min-width: 72px; }
html.spec-present .spec-stats .chip .k { font-size: 16px; color: #111827; }
html.spec-present .spec-stats .chip .v { font-size: 21px; font-weight: 700; line-height: 1.2; }
html.spec-present .spec-stats .chip.pending .v { color: #374151; font-size: 18px; }
html.spec-present .spec-stats .chip.good .v { color: #14532d; }
html.spec-present .spec-stats .chip.bad .v { color: #7f1d1d; }
html.spec-present .spec-stats .msg { font-size: 16px; color: #111827; }
html.spec-present .spec-tokcmp { font-size: 20px; }
html.spec-present .spec-tokcmp .lbl { font-size: 16px; color: #111827; }
html.spec-present #spec-tip { font-size: 17px; max-width: 520px; }
html.spec-present .js-plotly-plot .xtick text, html.spec-present .js-plotly-plot .ytick text {
  font-size: 16px !important; fill: #000 !important; }
html.spec-present .js-plotly-plot .g-xtitle text, html.spec-present .js-plotly-plot .g-ytitle text,
html.spec-present .js-plotly-plot .annotation-text { font-size: 17px !important; fill: #000 !important; }
html.spec-present .js-plotly-plot .gtitle, html.spec-present .js-plotly-plot .legendtext { fill: #000 !important; }
html.spec-present .row:has(> .block .js-plotly-plot) { flex-wrap: wrap; }
html.spec-present .row:has(> .block .js-plotly-plot) > .block { min-width: 100% !important; }
html.spec-present .spec-step { font-size: 18px; }
html.spec-present .spec-step th { font-size: 18px; color: #111827; }
html.spec-present .spec-step .muted { color: #1f2937; }
html.spec-present .spec-step .kvbar { height: 14px; }
""".replace("html.spec-present", "html.spec-present:not(#spec-id-weight)")

# Presentation mode's plot layout, installed once by PRESENTATION_JS: larger title, legend and axis fonts, and the
# legend pinned to the figure's bottom edge, where Plotly reserves a margin for it (under the x-axis title, never on
# the plot). Plotly places titles and legends by their measured size, so the sizes go through Plotly.relayout (CSS
# alone enlarged entries Plotly had spaced for 10 px: they ran into each other and the plot), and again after every
# redraw: each streamed round brings the server's layout back. `meta` marks a layout that has them; turning the mode
# off restores the values they replaced. A title still wider than its figure is shrunk until it fits.
PLOT_PRESENT_JS = r"""
if (!window.__specPlots) {
  const PRESENT = {"font.size": 16, "title.font.size": 19, "legend.font.size": 16, "legend.yref": "container",
                   "legend.y": 0, "legend.yanchor": "bottom", "margin.b": 40, "meta": "spec-present"};
  const get = (obj, path) => path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
  const on = () => document.documentElement.classList.contains("spec-present");
  const fitTitle = (gd) => {
    const title = gd.querySelector(".gtitle");
    if (!title || !gd._fullLayout) return;
    const box = title.getBBox(), room = gd._fullLayout.width - 6 - box.x;
    if (box.width > room && room > 0) {
      return Plotly.relayout(gd, {"title.font.size": Math.max(10, Math.floor(19 * room / box.width))});
    }
    // A title of several lines, grown: its first line kept below the figure's top edge, its last above the plot.
    const full = gd._fullLayout, down = Math.max(0, Math.ceil(4 - box.y));
    const below = Math.ceil(box.y + box.height + 6) + down;
    if (down || below > full.margin.t) {
      const change = {"margin.t": Math.max(below, full.margin.t)};
      if (down) change["title.pad.t"] = ((full.title.pad || {}).t || 0) + down;
      const saved = gd.__specSaved;                        // restored when presentation mode ends
      for (const key in change) if (saved && !(key in saved)) saved[key] = get(gd.layout, key) ?? null;
      return Plotly.relayout(gd, change);
    }
  };
  const sync = (gd) => {
    if (gd.__specBusy || !gd.layout) return;
    const applied = gd.layout.meta === "spec-present";
    let change = null;
    if (on() && !applied) {
      gd.__specSaved = Object.fromEntries(Object.keys(PRESENT).map((key) => [key, get(gd.layout, key) ?? null]));
      change = PRESENT;
    } else if (!on() && applied) {
      change = gd.__specSaved || {meta: null};
    }
    if (!change) return;
    gd.__specBusy = true;
    Promise.resolve(Plotly.relayout(gd, change)).then(() => on() && fitTitle(gd))
      .finally(() => { gd.__specBusy = false; sync(gd); });
  };
  window.__specPlots = () => {
    if (!window.Plotly) return;
    for (const gd of document.querySelectorAll(".js-plotly-plot")) {
      if (!gd.__specHooked && gd.on) { gd.__specHooked = true; gd.on("plotly_afterplot", () => sync(gd)); }
      sync(gd);
    }
  };
  setInterval(window.__specPlots, 1000);      // plots drawn later (another tab, a new run) join within a second
}
"""

# The presentation-mode checkbox's js= handler: installs PRESENTATION_CSS and PLOT_PRESENT_JS once, toggles the class
# on <html>, re-lays out the plots and lets Plotly re-measure their widths.
PRESENTATION_JS = """(on) => {
  if (!document.getElementById("spec-present-css")) {
    const style = document.createElement("STYLE");
    style.id = "spec-present-css";
    style.textContent = %s;
    document.head.appendChild(style);
  }
  %s
  document.documentElement.classList.toggle("spec-present", Boolean(on));
  window.__specPlots();
  setTimeout(() => window.dispatchEvent(new Event("resize")), 50);
  return [];
}""" % (json.dumps(PRESENTATION_CSS), PLOT_PRESENT_JS)

# A floating tooltip for every `.spec-view .tok[data-tip]` on the page, installed once by the token views'
# js_on_load. It is position: fixed, so it is never clipped by the scrolling token view; its text is set with
# textContent (never parsed as HTML). Without JavaScript the CSS ::after tooltip above still works.
TOOLTIP_JS = r"""
if (!window.__specTooltip) {
  window.__specTooltip = true;
  const css = document.createElement("STYLE");
  css.textContent = "#spec-tip{position:fixed;z-index:10000;max-width:400px;white-space:pre-line;" +
    "background:#111827;color:#f9fafb;font:12px/1.45 ui-monospace,Menlo,Consolas,monospace;padding:6px 8px;" +
    "border-radius:6px;box-shadow:0 4px 14px rgba(0,0,0,.3);pointer-events:none}" +
    "#spec-tip[hidden]{display:none}" +
    "html.spec-js-tips .spec-view .tok:hover::after{display:none !important}";
  document.head.appendChild(css);
  const tip = document.createElement("DIV");
  tip.id = "spec-tip";
  tip.hidden = true;
  document.body.appendChild(tip);
  document.documentElement.classList.add("spec-js-tips");
  document.addEventListener("mouseover", (event) => {
    const tok = event.target.closest ? event.target.closest(".spec-view .tok[data-tip]") : null;
    if (!tok) { tip.hidden = true; return; }
    tip.textContent = tok.dataset.tip;
    tip.hidden = false;
    const box = tok.getBoundingClientRect();
    const left = Math.max(4, Math.min(box.left, window.innerWidth - tip.offsetWidth - 8));
    let top = box.bottom + 6;
    if (top + tip.offsetHeight > window.innerHeight - 4) top = Math.max(4, box.top - tip.offsetHeight - 6);
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  });
}
"""


@dataclass(frozen=True)
class RenderOptions:
    show_spaces: bool = False   # spaces as a visible middle dot (newlines are always shown as ↵ + break)
    greedy: bool = False        # the decision was an argmax test, not a draw
    rule: str = "exact"         # verification rule: says where a correction came from


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def piece_html(text: str, show_spaces: bool = False) -> str:
    """Token text -> escaped HTML with visible whitespace: '↵' + <br> for newlines, '→' for tabs, and spaces
    either kept (pre-wrap) or shown as '·'."""
    if text == "":
        return '<span class="ws">∅</span>'
    out = []
    for ch in text:
        if ch == "\n":
            out.append('<span class="ws">↵</span><br>')
        elif ch == "\r":
            out.append('<span class="ws">␍</span>')
        elif ch == "\t":
            out.append('<span class="ws">→</span>')
        elif ch == " " and show_spaces:
            out.append('<span class="ws">·</span>')
        else:
            out.append(html.escape(ch, quote=True))
    return "".join(out)


def show_text(piece: Piece | str) -> str:
    """A token's text for tooltips and tables: quoted, with \\n, \\t and other controls spelled out."""
    text = piece.text if isinstance(piece, Piece) else piece
    return json.dumps(text, ensure_ascii=False)


def fmt_prob(x: float | None) -> str:
    if x is None:
        return "–"
    if x != 0 and abs(x) < 1e-3:
        return f"{x:.1e}"
    return f"{x:.3f}"


def candidates_text(candidates: Iterable[tuple[int, float]], label: Labeler, limit: int = 5) -> str:
    return ", ".join(f"{show_text(label(t))} {fmt_prob(p)}" for t, p in list(candidates)[:limit])


def token_span(kind: str, piece: Piece, tip: str, opts: RenderOptions, data: dict[str, object]) -> str:
    classes = ["tok", kind] + (["special"] if piece.special else []) + (["partial"] if piece.partial else [])
    attrs = "".join(f' data-{name}="{esc(value)}"' for name, value in data.items() if value is not None)
    return (f'<span class="{" ".join(classes)}" data-kind="{kind}"{attrs} data-tip="{esc(tip)}">'
            f"{piece_html(piece.text, opts.show_spaces)}</span>")


def draft_tip(ev, i: int, kind: str, piece: Piece, label: Labeler, opts: RenderOptions) -> str:
    """Tooltip of drafted token i: p, q, min(1, p/q), the draw and the decision."""
    p = ev.target_probs[i] if i < len(ev.target_probs) else None
    q = ev.draft_probs[i] if i < len(ev.draft_probs) else None
    a = ev.accept_probs[i] if i < len(ev.accept_probs) else None
    u = ev.uniforms[i] if i < len(ev.uniforms) else None
    lines = [f"round {ev.index + 1} · draft token {i + 1}/{len(ev.drafted)} · {kind}",
             f"token {show_text(piece)} (id {ev.drafted[i]})"]
    p_name = "p(x) target (softmax, T=1)" if opts.greedy else "p(x) target"
    lines.append(f"{p_name} = {fmt_prob(p)}")
    lines.append(f"q(x) draft = {fmt_prob(q)}"
                 + ("  (deterministic draft: q is one-hot)" if q == 1.0 and not opts.greedy else ""))
    if kind in ("accepted", "rejected"):
        if u is not None and not opts.greedy and opts.rule == "strict":
            lines.append(f"strict: the target's own draw (its CDF at u = {fmt_prob(u)}) "
                         + ("is this token → ACCEPTED" if kind == "accepted" else "is another token → REJECTED"))
            lines.append(f"chance of that: p(x) = {fmt_prob(a)}")
        elif u is not None and not opts.greedy and opts.rule == "typical":
            lines.append("typical (Medusa): p(x) " + ("> min(0.09, 0.3·e^−H(p)) → ACCEPTED" if kind == "accepted"
                                                      else "≤ min(0.09, 0.3·e^−H(p)) → REJECTED") + " (no draw)")
        elif u is not None and not opts.greedy:
            lines.append(f"min(1, p/q) = {fmt_prob(a)}" + ("  (q before warping: the shipped bug)"
                                                           if opts.rule == "q_mismatch" else ""))
            verdict = "<" if kind == "accepted" else "≥"
            lines.append(f"uniform draw u = {fmt_prob(u)} {verdict} {fmt_prob(a)} → {kind.upper()}")
        else:
            top = ev.target_top[i][0][0] if i < len(ev.target_top) and ev.target_top[i] else None
            if opts.rule == "topp_membership":
                lines.append("rule: top-p membership (wrong): " + ("inside the top-p set, kept" if kind == "accepted"
                                                                   else "outside the top-p set, refused"))
            elif kind == "accepted":
                lines.append("greedy: equals the target's argmax, ACCEPTED")
            else:
                lines.append(f"greedy: the target's argmax is {show_text(label(top)) if top is not None else '?'}, "
                             "REJECTED")
    elif kind == "discarded":
        if ev.correction is None and ev.bonus is None:
            lines.append("dropped: the text ended (end of sequence) before it")
        else:
            lines.append("never judged: an earlier draft token in this round was rejected")
    if i < len(ev.target_top) and ev.target_top[i]:
        lines.append("target top here: " + candidates_text(ev.target_top[i], label, 3))
    return "\n".join(lines)


def next_tip(ev, kind: str, piece: Piece, token: int, label: Labeler, opts: RenderOptions) -> str:
    """Tooltip of the correction or bonus token, with the candidates of the distribution it came from."""
    pos = ev.accepted
    lines = [f"round {ev.index + 1} · {kind}", f"token {show_text(piece)} (id {token})"]
    if kind == "correction":
        if opts.greedy:
            lines.append("the target's argmax at the rejected position")
        elif opts.rule == "exact":
            lines.append("drawn from the residual normalize(max(0, p − q))")
        elif opts.rule == "strict":
            lines.append("the target's own draw at the rejected position (strict: exact)")
        elif opts.rule == "q_mismatch":
            lines.append("drawn from the residual of the wrong q (the draft's, before warping: the shipped bug)")
        elif opts.rule == "typical":
            lines.append("drawn from p itself (Medusa's typical acceptance: lossy)")
        else:
            lines.append(f"drawn from p itself (rule '{opts.rule}' skips the residual: biased on purpose)")
        label_top = "residual top" if opts.rule in ("exact", "q_mismatch") and not opts.greedy else "top candidates"
    else:
        if not ev.drafted:
            lines.append("no draft this round: the target's own next token")
        else:
            lines.append(f"all {len(ev.drafted)} draft tokens accepted: a free token from the target's last "
                         "distribution")
        label_top = "top candidates"
    if pos < len(ev.target_top):
        p = dict(ev.target_top[pos]).get(token)
        if p is not None:
            lines.append(f"p(x) target = {fmt_prob(p)}")
    if ev.next_top and not opts.greedy:
        lines.append(f"{label_top}: " + candidates_text(ev.next_top, label))
    elif pos < len(ev.target_top) and ev.target_top[pos]:
        lines.append("target top here: " + candidates_text(ev.target_top[pos], label, 3))
    return "\n".join(lines)


def draft_kinds(ev) -> list[str]:
    """The kind of each drafted token of one round."""
    kinds = []
    ended_early = ev.correction is None and ev.bonus is None   # EOS inside the accepted drafts
    for i in range(len(ev.drafted)):
        if i < ev.accepted:
            kinds.append("accepted")
        elif i == ev.accepted and not ended_early:
            kinds.append("rejected")
        else:
            kinds.append("discarded")
    return kinds


def round_html(ev, label: Labeler, opts: RenderOptions = RenderOptions()) -> str:
    """One round: its drafted tokens (accepted / rejected / discarded) then its correction or bonus. A tree round:
    its kept path, the siblings refused where it stopped, then the correction or bonus (ui/views/tree.py)."""
    if ev.tree_parents is not None:
        from ui.views import tree          # tree.py builds on this module's helpers
        return tree.round_html(ev, label, opts)
    spans = []
    for i, (token, kind) in enumerate(zip(ev.drafted, draft_kinds(ev))):
        piece = label(token)
        data = {"round": ev.index, "pos": i, "id": token,
                "p": _num(ev.target_probs, i), "q": _num(ev.draft_probs, i),
                "a": _num(ev.accept_probs, i), "u": _num(ev.uniforms, i)}
        spans.append(token_span(kind, piece, draft_tip(ev, i, kind, piece, label, opts), opts, data))
    for kind, token in (("correction", ev.correction), ("bonus", ev.bonus)):
        if token is not None:
            piece = label(token)
            spans.append(token_span(kind, piece, next_tip(ev, kind, piece, token, label, opts), opts,
                                    {"round": ev.index, "pos": ev.accepted, "id": token}))
    note = f'<span class="note" title="{esc(ev.note)}">※</span>' if ev.note else ""
    title = (f"round {ev.index + 1}: drafted {len(ev.drafted)}, accepted {ev.accepted}, "
             f"emitted {len(ev.emitted)}" + (f"; {ev.note}" if ev.note else ""))
    # <wbr>: a line may break between any two tokens, even when spaces are drawn as '·'.
    return (f'<span class="round" data-round="{ev.index}" data-n="{ev.index + 1}" title="{esc(title)}">'
            f'{"<wbr>".join(spans)}{note}</span><wbr>')


def _num(values: list[float], i: int) -> str | None:
    return f"{values[i]:.6g}" if i < len(values) else None


def legend_html() -> str:
    chips = [f'<span class="lg {kind}" title="{esc(text)}">{esc(kind)}</span>' for kind, text in KINDS.items()]
    chips.append('<span class="lg accepted special" title="a control token of the tokenizer">special</span>')
    chips.append('<span class="round" data-n="n" title="a round starts here">round boundary</span>')
    chips.append('<span class="ws">↵ newline</span>')
    chips.append('<span style="color:#6b7280">hover a token for p, q, min(1, p/q), the draw and the decision</span>')
    return f'<div class="legend">{"".join(chips)}</div>'


def prompt_html(prompt_text: str, n_tokens: int, chat: bool) -> str:
    how = "chat template applied" if chat else "raw text"
    return (f'<details class="prompt"><summary>prompt: {n_tokens} tokens ({how})</summary>'
            f'<div class="ptext">{piece_html(prompt_text)}</div></details>')


def view_html(round_fragments: list[str], prompt: str = "", status: str = "", legend: bool = True) -> str:
    """The token view: legend, prompt, the rounds so far (pre-rendered fragments), and a status line."""
    body = "".join(round_fragments) or '<span class="empty-msg">No tokens yet.</span>'
    status_line = f'<div class="status-line">{esc(status)}</div>' if status else ""
    return (f'<div class="spec-view">{legend_html() if legend else ""}{prompt}'
            f'<div class="tokens">{body}</div>{status_line}</div>')


def empty_view(message: str = "Press Run to decode: tokens appear here round by round.", legend: bool = True) -> str:
    return (f'<div class="spec-view">{legend_html() if legend else ""}<div class="tokens">'
            f'<span class="empty-msg">{esc(message)}</span></div></div>')


def legend_view() -> str:
    return f'<div class="spec-view legend-only">{legend_html()}</div>'


COST_TITLES = {
    "judged acceptance a": "accepted / judged drafts (the accepted ones and the rejected one; later drafts are "
                           "discarded unjudged): the per-token a of the formula",
    "draft cost c": "mean draft seconds per round / one plain decoding step (the mean of the plain run's steps)",
    "verify cost v": "mean verify seconds per round (one target forward over the drafts + 1) / one plain step",
    "overhead o": "mean seconds per round outside draft and verify (sampling, the rule, trimming, bookkeeping) / one "
                  "plain step: the time strip's third part",
    "predicted speedup": "E[tokens per round] / (v + c + o): (1 − a^(n+1)) / (1 − a) at the judged acceptance a and "
                         "each round's draft count n, over the round's whole measured cost, overhead included (the "
                         "time strip's steps per round). With n = k, v = 1, o = 0 and c = k × (one draft step) it is "
                         "Leviathan et al.'s (1 − a^(k+1)) / ((1 − a)(k c + 1)). Prefill is left out, and the rounds' "
                         "acceptance is the formula's expectation, so the measured speedup differs a little.",
}


def title_attr(key: str) -> str:
    return f' title="{esc(COST_TITLES[key])}"' if key in COST_TITLES else ""


def cost_chips(s: dict) -> list[tuple[str, str, str]]:
    """Draft, verify and overhead cost per round in plain steps, and the speedup they predict
    (ui.views.metrics.cost_fields); none when the summary lacks them."""
    if s.get("predicted_speedup") is None:
        return []
    predicted = s["predicted_speedup"]
    return [("judged acceptance a", f'{s.get("judged_acceptance", 0.0):.0%}', ""),
            ("draft cost c", f'{s["draft_cost"]:.2f} steps', ""),
            ("verify cost v", f'{s["verify_cost"]:.2f} steps', ""),
            ("overhead o", f'{s.get("overhead_cost") or 0.0:.2f} steps', ""),
            ("predicted speedup", f"×{predicted:.2f}", "good" if predicted >= 1 else "bad")]


REDUCED_PRECISION_NOTE = ("This model runs in {dtype}: checking several draft tokens in one forward rounds "
                          "differently from decoding one token at a time, so where two tokens are nearly tied greedy "
                          "decoding may pick another one than plain decoding. The rule is still exact; in float32 "
                          "(the server's --dtype float32) the texts match token for token.")


def reduced_precision(dtype: str | None) -> bool:
    """The run's dtype rounds coarser than float32 (bf16, fp16): a greedy run may then part from plain decoding."""
    return bool(dtype) and dtype not in ("float32", "float64")


def stats_html(summary: dict | None, message: str = "") -> str:
    """The headline numbers of a run (a summary dict from `state.summarize`)."""
    if not summary:
        return f'<div class="spec-stats"><div class="msg">{esc(message or "No run yet.")}</div></div>'
    s = summary
    chips = [
        ("rounds", str(s["rounds"]), ""),
        ("new tokens", str(s["new_tokens"]), ""),
        ("acceptance", f'{s["acceptance_rate"]:.0%}', ""),
        ("tokens / target forward", f'{s["tokens_per_forward"]:.2f}', ""),
        ("theory (1−aᵏ⁺¹)/(1−a)", f'{s["expected_tokens_per_forward"]:.2f}', ""),
        ("speculative tok/s", f'{s["tokens_per_second"]:.1f}', ""),
    ]
    if s.get("speedup") is not None:
        chips.append(("plain decoding tok/s", f'{s["baseline_tokens_per_second"]:.1f}', ""))
        speedup = s["speedup"]
        chips.append(("speedup (measured)", f"×{speedup:.2f}", "good" if speedup >= 1 else "bad"))
        chips += cost_chips(s)
    else:
        chips.append(("speedup", "baseline pending", "pending"))
    note = ""
    if s.get("matches_baseline") is not None:
        same = s["matches_baseline"]
        low_precision = reduced_precision(s.get("dtype"))
        # In fp32 a difference is a bug; in bf16 / fp16 it is rounding (see REDUCED_PRECISION_NOTE), not red.
        chips.append(("same text as plain", "yes" if same else f'no (token {s.get("first_difference")})',
                      "good" if same else "pending" if low_precision else "bad"))
        if low_precision:
            note = (f'<div class="msg note" data-note="dtype">'
                    f'{esc(REDUCED_PRECISION_NOTE.format(dtype=s["dtype"]))}</div>')
    if s.get("tree_nodes_per_round") is not None and s.get("speedup") is not None and s["speedup"] < 1:
        note += f'<div class="msg note" data-note="tree-slower">{esc(tree_slower_note(s))}</div>'
    html_chips = "".join(f'<div class="chip {cls}" data-stat="{esc(key)}"{title_attr(key)}><span class="k">{esc(key)}'
                         f'</span><span class="v">{esc(value)}</span></div>' for key, value, cls in chips)
    msg = f'<div class="msg">{esc(message)}</div>' if message else ""
    return f'<div class="spec-stats">{html_chips}{note}{msg}</div>'


def tree_slower_note(s: dict) -> str:
    """Why a draft tree measured slower than plain decoding here, with its own numbers."""
    costs = ""
    if s.get("verify_cost") is not None and s.get("draft_cost") is not None:
        costs = (f" Each round's verify forward over its {s['tree_nodes_per_round']:.0f} nodes + 1 costs "
                 f"v = {s['verify_cost']:.2f} plain steps and drafting c = {s['draft_cost']:.2f}, so "
                 f"{s['tokens_per_forward']:.2f} tokens per forward cannot pay for them: "
                 f"{s['tokens_per_forward']:.2f} / ({s['verify_cost']:.2f} + {s['draft_cost']:.2f}) < 1.")
    return (f"This draft tree measured slower than plain decoding here (×{s['speedup']:.2f}).{costs} On this CPU "
            "a forward's cost grows with its rows; on a GPU a few dozen rows cost about one step, which is where "
            "trees pay (the \"What if: a GPU\" tab projects it). For speed here, use a chain: eagle+lookup.")


def tokenization_html(text: str, rows: list[tuple[str, list[tuple[int, Piece]]]]) -> str:
    """The same text cut by several tokenizers: one row of (id, piece) boxes per tokenizer."""
    out = [f'<div class="spec-tokcmp"><div class="row"><span class="lbl">text</span>{esc(show_text(text))}</div>']
    for name, pieces in rows:
        boxes = "".join(f'<span class="tok{" alt" if j % 2 else ""}" title="id {tid}">{piece_html(p.text, True)}'
                        f'<sub>{tid}</sub></span>' for j, (tid, p) in enumerate(pieces))
        out.append(f'<div class="row"><span class="lbl">{esc(name)} ({len(pieces)} tokens)</span>{boxes}</div>')
    out.append("</div>")
    return "".join(out)


def explanation_md(rounds, k: int, greedy: bool, rule: str, heading: bool = True) -> str:
    """The "What happened" paragraph of a run's rounds (the sentences come from spec_engine.classroom.explain)."""
    from spec_engine.classroom.explain import explain
    sentences = explain(list(rounds), k, greedy, rule)
    if not sentences:
        return ""
    return ("**What happened.** " if heading else "") + " ".join(sentences)
