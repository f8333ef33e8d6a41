"""Step-through: advance one speculative round at a time, go back, and see every number of the round.

`Stepper` is the pure state machine: the rounds recorded so far and a position (how many are shown).
Forward moves the position and computes a new round (through `advance`) only when the position is at the end;
Back and Reset never touch the engine. `StepSession` adds what rendering needs (labeler, render options, one HTML
fragment per round). New rounds come from the GPU function `step_job` (one call per handler call, inside
`engine`), which keeps the engine state of a live session between calls where its process lives on, and otherwise
decodes the recorded rounds again (same seed, same rounds: checked). The renderers below turn the current round
into a decision table, a residual bar chart and the KV cache before and after trimming; like the rest of `ui/`,
they only read events.
"""
from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import spec_engine as se

from ui.playground import compute, engine_thread, runner
from ui.playground import registry as reg
from ui.views import plots, render, tree
from ui.views.render import RenderOptions, esc, fmt_prob, show_text
from ui.playground.state import RunSettings, SessionState, remove_exports

CAPTION = ("**Step through one round at a time.** The draft proposes up to k tokens with probabilities q; the target "
           "scores them all in one forward pass (p). Draft token i is kept while a uniform draw u < min(1, p/q); "
           "at the first rejection the later drafts are discarded and a correction is drawn from the residual "
           "max(0, p − q), which is exactly what keeps the text distributed as the target alone would write it.")

STEP_CSS = """
.spec-step { font-family: var(--font, system-ui, sans-serif); font-size: 13.5px; }
.spec-step table { border-collapse: collapse; margin: 4px 0 8px 0; }
.spec-step th, .spec-step td { border: 1px solid rgba(127,127,127,.3); padding: 3px 8px; text-align: right; }
.spec-step th { font-size: 12px; color: #6b7280; font-weight: 600; }
.spec-step td.tokcell { text-align: left; font-family: ui-monospace, Menlo, Consolas, monospace; white-space: pre; }
.spec-step tr.accepted td.decision { color: #15803d; font-weight: 600; }
.spec-step tr.rejected td.decision { color: #b91c1c; font-weight: 600; }
.spec-step tr.discarded td { color: #9ca3af; }
.spec-step tr.correction td.decision { color: #b45309; font-weight: 600; }
.spec-step tr.bonus td.decision { color: #1d4ed8; font-weight: 600; }
.spec-step .facts { margin: 2px 0 6px 0; line-height: 1.6; }
.spec-step .kvbar { display: inline-block; height: 10px; vertical-align: middle; border-radius: 2px; }
.spec-step .bars { white-space: nowrap; margin: 2px 0; }
.spec-step .bars .muted { display: inline-block; width: 3.5em; }
.spec-step table.kv th, .spec-step table.kv td { padding: 3px 5px; }
.spec-step .kvbar.kept { background: #1f77b4; }
.spec-step .kvbar.trimmed { background: #fbd5d5; border: 1px dashed #e58c8c; }
.spec-step .kvbar.fed { background: #86c5f0; }
.spec-step .muted { color: #6b7280; }
.spec-step .scroll { max-width: 100%; overflow-x: auto; }
.spec-step .scroll-hint { font-size: 12px; color: #b45309; margin: 2px 0; }
.spec-step .scroll-hint[hidden] { display: none; }
"""

# A table wider than its box scrolls sideways inside it (`.scroll`), and nothing on a phone showed that it does: each
# table is preceded by a hint that this script shows only while its box is narrower than the table, on every
# redraw (MutationObserver) and every resize of the page or the box (ResizeObserver). Setting `hidden` changes an
# attribute, which the observer does not watch, so marking never triggers itself.
SCROLL_HINT = '<div class="scroll-hint" hidden>⇆ This table scrolls sideways: swipe it to see every column.</div>'
SCROLL_HINT_JS = r"""
const mark = () => element.querySelectorAll('.spec-step .scroll').forEach((box) => {
  const hint = box.previousElementSibling;
  if (hint && hint.classList.contains('scroll-hint')) hint.hidden = box.scrollWidth <= box.clientWidth + 1;
});
new MutationObserver(mark).observe(element, {childList: true, subtree: true});
new ResizeObserver(mark).observe(element);
mark();
"""


KV_BAR_PX = 60        # the longest cache's bar
NONE, NEXT, ALL_ACCEPTED = "none", "next", "all-accepted"      # what a step_job computes (`wanted_by`)
LIVE_SESSIONS = 8         # step-through engine states kept per process (least recently used dropped)


class Stepper:
    """Recorded rounds plus a position: `position` rounds are shown, `current` is the last shown one."""

    def __init__(self, advance: Callable[[], se.RoundEvent] | None = None, events=()):
        self.events: list[se.RoundEvent] = list(events)
        self.position = 0
        self._advance = advance

    @property
    def finished(self) -> bool:
        """The run ended (its last recorded round says so)."""
        return bool(self.events) and self.events[-1].finished

    @property
    def live(self) -> bool:
        """New rounds can still be computed."""
        return self._advance is not None and not self.finished

    @property
    def can_forward(self) -> bool:
        return self.position < len(self.events) or self.live

    @property
    def can_back(self) -> bool:
        return self.position > 0

    @property
    def current(self) -> se.RoundEvent | None:
        return self.events[self.position - 1] if self.position else None

    @property
    def previous(self) -> se.RoundEvent | None:
        """The round before the current one (None at the first)."""
        return self.events[self.position - 2] if self.position > 1 else None

    @property
    def shown(self) -> list[se.RoundEvent]:
        return self.events[:self.position]

    def forward(self) -> se.RoundEvent | None:
        """Show the next round, computing it only at the end of the recording; None when there is none."""
        if self.position < len(self.events):
            self.position += 1
            return self.current
        if not self.live:
            return None
        event = self._advance()
        assert event.index == len(self.events), (event.index, len(self.events))
        self.events.append(event)
        self.position += 1
        return event

    def find(self, wanted: Callable[[se.RoundEvent], bool]) -> se.RoundEvent | None:
        """Go forward to the next round after the current one for which `wanted` holds, computing rounds as
        Forward does (the same engine, so never past the run's end). None when the run ends without one: the
        position then stays where it was, and the rounds computed on the way stay recorded."""
        start = self.position
        while (event := self.forward()) is not None:
            if wanted(event):
                return event
        self.position = start
        return None

    def back(self) -> se.RoundEvent | None:
        if self.position:
            self.position -= 1
        return self.current

    def reset(self, advance: Callable[[], se.RoundEvent] | None = None, events=()) -> None:
        self.events, self.position, self._advance = list(events), 0, advance


def rejects_at(position: int) -> Callable[[se.RoundEvent], bool]:
    """Rounds whose first rejection is draft `position` (1-based): the drafts before it accepted, a correction."""
    return lambda ev: ev.correction is not None and ev.accepted == position - 1


def all_accepted(ev: se.RoundEvent) -> bool:
    """Rounds that drafted at least one token and accepted every draft."""
    return bool(ev.drafted) and ev.accepted == len(ev.drafted)


@dataclass
class StepSession:
    """One visitor's step-through: the stepper, how to render its rounds, and (live) the engine behind it."""

    stepper: Stepper
    settings: RunSettings
    draft_label: str
    prompt_ids: list[int]
    prompt_text: str
    labeler: object
    options: RenderOptions
    origin: str = "live"                      # "live" (models) or "trace" (a loaded trace, no models)
    baseline: object = None
    key: str = ""                             # a live session's engine state is kept under this id (step_job)
    exports: list = field(default_factory=list)   # folders of its trace exports (deleted on expiry)
    fragments: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sync(self) -> None:
        """Render each recorded round once (fragments stay aligned with the stepper's events)."""
        for ev in self.stepper.events[len(self.fragments):]:
            self.fragments.append(render.round_html(ev, self.labeler, self.options))

    @property
    def stop_reason(self) -> str | None:
        return self.stepper.events[-1].stop_reason if self.stepper.finished else None


def start_live(settings: RunSettings, registry, show_spaces: bool = False) -> Iterator[str]:
    """Load (yielding progress), check, build and prefill (a `step_job` asked for no round); returns a live
    StepSession whose Forward computes rounds inside `engine`."""
    prep = yield from runner.prepare(settings, SessionState(), registry, show_spaces)   # scratch: not the history
    key = uuid.uuid4().hex
    built = [item for item in step_job(StepJob(settings, prep.prompt_ids, key, (), 0, NONE, step_seconds(settings)),
                                       compute.Stop()) if isinstance(item, compute.Built)]
    return StepSession(Stepper(outside_engine), settings, built[0].label, list(prep.prompt_ids), prep.prompt_text,
                       prep.labeler, prep.options, key=key)


def outside_engine() -> se.RoundEvent:
    raise RuntimeError("a live step-through computes rounds only inside stepper.engine(...)")


@contextmanager
def engine(session: StepSession | None, until: str = NEXT):
    """For one handler call: the session's new rounds (if it needs any) come from one `step_job`, asked for rounds
    until `until` holds (NEXT: one round; "reject:i"; ALL_ACCEPTED), which is what Forward or a finder consumes."""
    if session is None or not session.key:       # a trace, or a session whose rounds come from elsewhere
        yield
        return
    events = session.stepper.events
    job = StepJob(session.settings, tuple(session.prompt_ids), session.key,
                  tuple(t for ev in events for t in ev.emitted), len(events), until, step_seconds(session.settings))
    work = step_job(job, compute.Stop())          # started (a GPU call) only if a round is asked for

    def advance() -> se.RoundEvent:
        for item in work:
            if isinstance(item, se.RoundEvent):
                return item
        raise RuntimeError("the step-through's engine ended before the run did")

    session.stepper._advance = advance
    try:
        yield
    finally:
        work.close()
        session.stepper._advance = outside_engine


# ------------------------------------------------------------------------------------------- the GPU function



def step_seconds(settings: RunSettings) -> float:
    return compute.call_seconds(runner.Budget(threading.Event()), settings.max_new_tokens)


def wanted_by(until: str) -> Callable[[se.RoundEvent], bool]:
    if until == NEXT:
        return lambda ev: True
    if until == ALL_ACCEPTED:
        return all_accepted
    if until.startswith("reject:"):
        return rejects_at(int(until.partition(":")[2]))
    raise ValueError(f"unknown step target {until!r}")


@dataclass(frozen=True)
class StepJob:
    """Rounds for one step-through: after the `rounds` it has recorded (which emitted `done`), until `until`."""

    settings: RunSettings
    prompt_ids: tuple[int, ...]
    key: str                        # the session's id: its engine state is kept under it
    done: tuple[int, ...]
    rounds: int
    until: str
    seconds: float


@dataclass
class LiveEngine:
    job: StepJob
    decoder: se.SpeculativeDecoder
    state: object                   # the decoder's DecodeState
    rounds: int
    built: compute.Built


_live: OrderedDict[str, LiveEngine] = OrderedDict()
_live_lock = threading.Lock()


def live_engine(job: StepJob) -> LiveEngine:
    """The engine state after the job's recorded rounds: the one this process kept for the session if it is at the
    same round, else built anew and the recorded rounds decoded again, checked to give the same tokens."""
    with _live_lock:
        entry = _live.pop(job.key, None)
    same = entry is not None and (entry.job.settings, entry.job.prompt_ids) == (job.settings, job.prompt_ids)
    if same and entry.rounds == job.rounds:
        return entry
    s = job.settings
    decoder, input_ids, target, built = compute.build(s, job.prompt_ids)
    state = decoder.start(input_ids, k=s.k, max_new_tokens=s.max_new_tokens, sampling=s.sampling(), seed=s.seed,
                          eos_token_id=reg.eos_ids(target))
    tokens: list[int] = []
    for _ in range(job.rounds):
        tokens += decoder.step(state).emitted
    if tokens != list(job.done):
        raise ValueError("This step-through cannot be resumed the same way on this server: press Reset.")
    return LiveEngine(job, decoder, state, job.rounds, built)


@compute.gpu(compute.job_seconds)
def step_job(job: StepJob, stop: compute.Stop) -> Iterator:
    """Yields Built, then the rounds after the recorded ones until one satisfies `job.until` or the run ends."""
    cpu = engine_thread.for_device(compute.loaded(job.settings.target).device)    # CPU work: the engine's thread
    entry = engine_thread.call(lambda: live_engine(job), cpu)
    yield entry.built
    wanted = None if job.until == NONE else wanted_by(job.until)
    try:
        while wanted is not None and entry.state.stop_reason is None:
            event = engine_thread.call(lambda: entry.decoder.step(entry.state), cpu)
            entry.rounds += 1
            yield event
            if wanted(event):
                break
    finally:
        if entry.state.stop_reason is None:          # a finished run needs no engine state
            with _live_lock:
                _live[job.key] = entry
                while len(_live) > LIVE_SESSIONS:
                    _live.popitem(last=False)


def expire(session: StepSession | None) -> None:
    """The step-through's gr.State delete_callback: its session expired, so the engine state this process keeps
    for it (the KV caches, in `_live` under its key) and its trace exports go now, not when newer sessions push
    them out."""
    if session is None:
        return
    with _live_lock:
        _live.pop(session.key, None)
    remove_exports(session.exports)


def from_trace(trace) -> StepSession:
    """A loaded trace, stepped without models (Forward only reveals recorded rounds)."""
    from ui.classroom.replay import TraceLabeler, render_options, settings_of
    return StepSession(Stepper(None, trace.rounds), settings_of(trace), trace.models.get("draft", ""),
                       list(trace.prompt_ids), trace.prompt_text, TraceLabeler.of(trace), render_options(trace),
                       origin="trace", baseline=trace.baseline)


# ------------------------------------------------------------------------------------------------ renderers

def token_cell(token: int, labeler) -> str:
    return f'<td class="tokcell">{esc(show_text(labeler(token)))} <span class="muted">#{token}</span></td>'


def decision_text(ev: se.RoundEvent, i: int, kind: str, labeler, opts: RenderOptions) -> str:
    if kind == "discarded":
        return ("discarded (never judged)" if ev.correction is not None or ev.bonus is not None
                else "dropped (text ended)")
    greedy_like = opts.greedy or i >= len(ev.uniforms)
    if not greedy_like:
        sign = "<" if kind == "accepted" else "≥"
        return f"u {sign} min(1, p/q): {kind}"
    if opts.rule == "topp_membership":
        return f"top-p membership (wrong rule): {kind}"
    if kind == "accepted":
        return "= target argmax: accepted"
    top = ev.target_top[i][0][0] if i < len(ev.target_top) and ev.target_top[i] else None
    return f"argmax is {show_text(labeler(top)) if top is not None else '?'}: rejected"


def tree_table_html(ev: se.RoundEvent, labeler, opts: RenderOptions) -> str:
    """A tree round: one row per node in the order the rule judged them (then the nodes never reached), with its
    parent and depth, q, p, min(1, r/q) and u, then the correction or bonus."""
    kinds = tree.node_kinds(ev)
    depth = tree.depths(ev.tree_parents)
    tried = list(ev.tree_tried or [])
    order = tried + [i for i in range(len(ev.drafted)) if i not in tried]
    rows = []
    for i in order:
        j = tried.index(i) if i in tried else None
        a = ev.accept_probs[j] if j is not None and j < len(ev.accept_probs) else None
        u = ev.uniforms[j] if j is not None and j < len(ev.uniforms) else None
        judged = tree.judged_text(ev, i, kinds[i], labeler, opts)
        parent = ev.tree_parents[i]
        numbers = "".join(f"<td>{fmt_prob(x)}</td>" for x in (ev.draft_probs[i], ev.target_probs[i], a, u))
        kind = {"unreached": "discarded"}.get(kinds[i], kinds[i])
        rows.append(f'<tr class="{kind}"><td>{i + 1}</td><td>{"root" if parent < 0 else parent + 1}</td>'
                    f'<td>{depth[i]}</td>{token_cell(ev.drafted[i], labeler)}{numbers}'
                    f'<td class="decision">{esc(judged[-1] if judged else kinds[i])}</td></tr>')
    emitted = tree.next_kind(ev)
    if emitted is not None:
        kind, token = emitted
        last = ev.tree_path[-1] if ev.tree_path else -1
        rows.append(f'<tr class="{kind}"><td>–</td><td>{"root" if last < 0 else last + 1}</td>'
                    f'<td>{len(ev.tree_path or []) + 1}</td>{token_cell(token, labeler)}<td>–</td><td>–</td><td>–</td>'
                    f'<td>–</td><td class="decision">{kind}</td></tr>')
    p_head = "p(x) target (T=1)" if opts.greedy else "p(x) target"
    head = (f"<tr><th>node</th><th>parent</th><th>depth</th><th>token</th><th>q(x) draft</th><th>{p_head}</th>"
            f"<th>min(1, r/q)</th><th>u (draw)</th><th>decision</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def decision_table_html(ev: se.RoundEvent, labeler, opts: RenderOptions) -> str:
    """One row per draft token (q, p, min(1, p/q), u, decision), then the correction or bonus."""
    if ev.is_tree:
        return tree_table_html(ev, labeler, opts)
    rows = []
    for i, (token, kind) in enumerate(zip(ev.drafted, render.draft_kinds(ev))):
        a = ev.accept_probs[i] if i < len(ev.accept_probs) and kind != "discarded" and not opts.greedy else None
        u = ev.uniforms[i] if i < len(ev.uniforms) else None
        numbers = "".join(f"<td>{fmt_prob(x)}</td>" for x in (ev.draft_probs[i], ev.target_probs[i], a, u))
        rows.append(f'<tr class="{kind}"><td>{i + 1}</td>{token_cell(token, labeler)}{numbers}'
                    f'<td class="decision">{esc(decision_text(ev, i, kind, labeler, opts))}</td></tr>')
    for kind, token in (("correction", ev.correction), ("bonus", ev.bonus)):
        if token is not None:
            pos = ev.accepted
            p = dict(ev.target_top[pos]).get(token) if pos < len(ev.target_top) else None
            rows.append(f'<tr class="{kind}"><td>{pos + 1}</td>{token_cell(token, labeler)}<td>–</td>'
                        f'<td>{fmt_prob(p)}</td><td>–</td><td>–</td><td class="decision">{kind}</td></tr>')
    p_head = "p(x) target (T=1)" if opts.greedy else "p(x) target"
    head = (f"<tr><th>pos</th><th>token</th><th>q(x) draft</th><th>{p_head}</th><th>min(1, p/q)</th>"
            f"<th>u (draw)</th><th>decision</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def round_facts(ev: se.RoundEvent, labeler, opts: RenderOptions) -> list[str]:
    """Sentences about one round: the first rejection, what was discarded, where the next token came from."""
    def tok(t):
        return esc(show_text(labeler(t)))
    if ev.is_tree:
        return tree_facts(ev, labeler, opts)
    facts = [f"Round {ev.index + 1}: {len(ev.drafted)} draft token(s), {ev.accepted} accepted, "
             f"{len(ev.emitted)} token(s) added to the text."]
    if ev.correction is not None:
        facts.append(f"First rejection at position {ev.accepted + 1}: {tok(ev.drafted[ev.accepted])}.")
        if ev.discarded:
            facts.append("Discarded after it (never judged): " + ", ".join(tok(t) for t in ev.discarded) + ".")
        if opts.greedy:
            source = "the target's argmax at that position"
        elif opts.rule == "exact":
            source = "the residual max(0, p − q), renormalised"
        else:
            source = f"p itself (the '{esc(opts.rule)}' rule skips the residual)"
        facts.append(f"Correction {tok(ev.correction)} drawn from {source}.")
    elif ev.bonus is not None:
        facts.append(("No draft this round: " if not ev.drafted else "All draft tokens accepted: ")
                     + f"bonus {tok(ev.bonus)} from the target's distribution at position {len(ev.drafted) + 1}.")
    else:
        facts.append("The text ended (end of sequence) inside the accepted drafts.")
    if ev.note:
        facts.append(f"Drafter note: {esc(ev.note)}.")
    return facts


def tree_facts(ev: se.RoundEvent, labeler, opts: RenderOptions) -> list[str]:
    """Sentences about one tree round: its shape, the path kept, where it stopped, where the next token came from."""
    def tok(t):
        return esc(show_text(labeler(t)))
    kinds = tree.node_kinds(ev)
    facts = [f"Round {ev.index + 1}: a draft tree of {len(ev.drafted)} node(s), {ev.draft_length} deep, scored in "
             f"one target forward; {ev.accepted} accepted on its path, {len(ev.emitted)} token(s) added to the text."]
    if ev.tree_path:
        facts.append("Kept path: " + " → ".join(tok(ev.drafted[i]) for i in ev.tree_path) + ".")
    refused = [i for i, kind in enumerate(kinds) if kind == "rejected"]
    if refused:
        facts.append("Refused: " + ", ".join(tok(ev.drafted[i]) for i in refused) + ". Siblings are tried in order; "
                     + ("each is compared with the target's argmax." if opts.greedy else
                        "after a refusal the next sibling is judged against the residual the refused one left, "
                        "r = normalize(max(0, r − q)), which keeps the tree exact."))
    unreached = kinds.count("unreached")
    if unreached:
        facts.append(f"{unreached} node(s) never reached: below a refused node.")
    if ev.correction is not None:
        facts.append(f"Every sibling at depth {ev.accepted + 1} was refused: correction {tok(ev.correction)} drawn "
                     + ("as the target's argmax." if opts.greedy else "from the residual they left."))
    elif ev.bonus is not None:
        facts.append(f"The path reached a leaf: bonus {tok(ev.bonus)} from the target's distribution after it.")
    else:
        facts.append("The text ended (end of sequence) on the path.")
    return facts


def kv_html(ev: se.RoundEvent, previous: se.RoundEvent | None = None) -> str:
    """Cache lengths after the verify forward and after trimming, the change at the trim step, how much each
    cache grew this round (against `previous`, the round before), and proportional bars."""
    target_grew, draft_grew = plots.cache_growth(ev, previous)
    rows = [("target", ev.target_cache_len_before, ev.target_cache_len, target_grew)]
    if ev.draft_cache_len is not None and ev.draft_cache_len_before is not None:
        rows.append(("draft", ev.draft_cache_len_before, ev.draft_cache_len, draft_grew))
    widest = max(max(before, after) for _, before, after, _ in rows) or 1

    def bar(kind: str, n: int) -> str:
        width = max(int(KV_BAR_PX * n / widest), 3)
        return f'<span class="kvbar {kind}" style="width:{width}px"></span>' if n > 0 else ""
    table = ['<table class="kv"><tr><th>cache</th><th>before trim</th><th>after trim</th><th>trim step</th>'
             '<th title="how much the cache grew this round">grew</th></tr>']
    bars = []
    for name, before, after, grew in rows:
        table.append(f'<tr><td>{name}</td><td>{before}</td><td>{after}</td><td>{change_text(before, after)}</td>'
                     f'<td>{"–" if grew is None else plots.signed(grew)}</td></tr>')
        bars.append(f'<div class="bars"><span class="muted">{name}</span> {bar("kept", min(before, after))}'
                    f'{bar("trimmed", before - after)}{bar("fed", after - before)}</div>')
    grew_note = (f"Grew: the change since the previous round, after trimming. The target cache grew by {target_grew}, "
                 f"one position per token added to the text" + (" (accepted + 1)." if target_grew == ev.accepted + 1
                                                                  else "."))
    if ev.is_tree:
        moves = plots.kv_moves(ev)
        moved = [f"{a} → {b}" for a, b in moves if a != b]
        grew_note += (f" Tree: the verify forward wrote all {len(ev.drafted)} nodes after the root; keep_path kept the "
                      f"{len(moves)} on the accepted path" + (f", moving {', '.join(moved)}" if moved else
                                                                ", already in place") +
                      f", and dropped {len(ev.drafted) - len(moves)}.")
    return (f'{SCROLL_HINT}<div class="scroll">{"".join(table)}</table></div>{"".join(bars)}'
            '<div class="muted">Committed text: '
            f"{ev.committed_len} tokens; the target cache keeps all but the newest, which the next round feeds in. "
            f"{grew_note}</div>")


def change_text(before: int, after: int) -> str:
    """The trim step in words, the sign carried by the word: a drafter that feeds the accepted tokens in after
    trimming (EAGLE: their target features) can end the step longer than it began."""
    if after < before:
        return f"trimmed {before - after}"
    if after > before:
        return f"added {after - before}"
    return "unchanged"


def round_html(session: StepSession) -> str:
    ev = session.stepper.current
    if ev is None:
        return ('<div class="spec-step"><div class="facts muted">No round shown yet: press Forward to draft and '
                'verify the first round.</div></div>')
    facts = "".join(f"<div>{line}</div>" for line in round_facts(ev, session.labeler, session.options))
    return (f'<div class="spec-step"><div class="facts">{facts}</div>'
            f'{SCROLL_HINT}<div class="scroll">{decision_table_html(ev, session.labeler, session.options)}</div></div>')


def kv_section(session: StepSession | None) -> str:
    ev = session.stepper.current if session is not None else None
    if ev is None:
        return '<div class="spec-step"><div class="facts muted">KV cache lengths appear here.</div></div>'
    return (f'<div class="spec-step"><div class="facts"><b>KV cache, round {ev.index + 1}</b>: after the verify '
            f"forward it holds the committed text plus every draft; trimming drops the rejected and discarded "
            f"positions.</div>{kv_html(ev, session.stepper.previous)}</div>")


def residual_title(ev: se.RoundEvent, opts: RenderOptions) -> str:
    position = ev.accepted + 1
    if ev.is_tree and ev.correction is not None and not opts.greedy and opts.rule == "exact":
        return f"Residual at depth {position} after every sibling was refused: the correction is drawn from it"
    if ev.correction is None and ev.bonus is None:
        return "No correction or bonus: the text ended"
    if opts.greedy:
        return f"Target (softmax, T=1) at position {position}: the argmax is taken"
    if ev.bonus is not None:
        return f"Target p at position {position}: the bonus is drawn from it"
    if opts.rule == "exact":
        return f"Residual max(0, p − q) at position {position}, renormalised: the correction is drawn from it"
    return f"Target p at position {position} (rule '{opts.rule}' skips the residual)"


def residual_figure(ev: se.RoundEvent | None, labeler, opts: RenderOptions):
    """Top candidates of the distribution the correction or bonus came from (greedy: the target's top)."""
    if ev is None:
        return plots.empty_figure("Where the round's last token came from", "Press Forward")
    candidates = list(ev.next_top)
    # target_top's row after the path
    row = (ev.tree_path[-1] + 1 if ev.tree_path else 0) if ev.is_tree else ev.accepted
    if opts.greedy and row < len(ev.target_top):
        candidates = list(ev.target_top[row])
    chosen = ev.correction if ev.correction is not None else ev.bonus
    labels = [f"{show_text(labeler(t))} #{t}" for t, _ in candidates]
    colour = plots.COLORS["correction"] if ev.correction is not None else plots.COLORS["bonus"]
    bars = {"type": "bar", "x": labels, "y": [p for _, p in candidates],
            "marker": {"color": [colour if t == chosen else "#cbd5e1" for t, _ in candidates]},
            "text": [fmt_prob(p) for _, p in candidates], "textposition": "outside", "name": "probability"}
    return plots.figure([bars], plots.layout(residual_title(ev, opts), "candidate token", "probability", height=280,
                                             yaxis={"range": [0, 1.12]}, showlegend=False))


def status_text(session: StepSession) -> str:
    s, stepper = session.settings, session.stepper
    mode = "greedy" if s.greedy else f"T={s.temperature}, top-p={s.top_p}, top-k={s.top_k}, seed {s.seed}"
    where = f"Round {stepper.position} of {len(stepper.events)} recorded"
    if stepper.finished:
        where += f" (the run ended: {stepper.events[-1].stop_reason})"
    elif session.origin == "trace":
        where += " (trace)"
    origin = "Trace replay" if session.origin == "trace" else "Stepping"
    return f"{origin}: {session.draft_label} drafting for {s.target}, k={s.k}, {mode}, rule {s.rule}. {where}."


def tokens_html(session: StepSession) -> str:
    """The text so far: the same token view as the main run, up to the shown round."""
    session.sync()
    prompt = render.prompt_html(session.prompt_text, len(session.prompt_ids), session.settings.chat)
    return render.view_html(session.fragments[:session.stepper.position], prompt, status_text(session), legend=False)


def view(session: StepSession | None) -> dict:
    """Everything the Step-through tab shows, keyed by output name."""
    if session is None:
        return {"status": "Press Forward (or Reset) to start stepping with the settings on the left.",
                "round": round_html_empty(), "residual": residual_figure(None, None, RenderOptions()),
                "kv": kv_section(None),
                "tokens": render.empty_view("The text appears here round by round.", legend=False), "explain": "",
                "tree": tree_figure(None)}
    ev = session.stepper.current
    return {
        "status": status_text(session),
        "round": round_html(session),
        "residual": residual_figure(ev, session.labeler, session.options),
        "kv": kv_section(session),
        "tokens": tokens_html(session),
        "explain": render.explanation_md(session.stepper.shown, session.settings.k, session.settings.greedy,
                                         session.settings.rule, heading=False),
        "tree": tree_figure(session),
    }


def tree_figure(session: StepSession | None):
    """The current round's draft tree (an empty figure for a chain round)."""
    ev = session.stepper.current if session is not None else None
    if ev is None or not ev.is_tree:
        return plots.empty_figure("Draft tree of this round", "A tree draft's round is drawn here")
    if not ev.drafted:
        return plots.empty_figure(f"Draft tree of round {ev.index + 1}",
                                  f"This round drafted nothing ({tree.NOTHING_DRAFTED}): the target took a plain step")
    return tree.tree_figure(session.stepper.shown, session.labeler, session.options, last=1,
                            title=f"Draft tree of round {ev.index + 1} (hover a node for p, q and the decision)")


def round_html_empty() -> str:
    return ('<div class="spec-step"><div class="facts muted">No round yet. Forward drafts and verifies one round '
            'with the settings on the left; Reset starts again.</div></div>')
