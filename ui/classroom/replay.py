"""Trace export and replay for the playground (the document itself is `spec_engine.classroom.trace`).

Export takes a finished run of this session (its RunRecord, the labeler and render options it was drawn with,
and its measured baseline) and writes every token piece the view needs into the trace. Replay builds a
`TraceLabeler` from that piece table and renders through the same `handlers.run_view` as the live run, so the
replayed HTML is byte-identical to the live run's, with no model and no tokenizer.

    python -m ui.classroom.replay --out presets/traces/example.json

writes the shipped example: a real greedy run of the offline default, prompt lookup on the edit-typos prompt, 24
tokens.
"""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import html
import re
import shutil
import tempfile
import threading
from pathlib import Path

from spec_engine.classroom import trace as tr

from ui.playground import registry as reg
from ui.views.render import RenderOptions, round_html
from ui.playground.state import RunRecord, RunSettings, SessionState, Timing
from ui.views.tokens import Piece

ROOT = Path(__file__).resolve().parents[2]   # the repository
EXAMPLE_PATH = ROOT / "presets" / "traces" / "example.json"
EXAMPLE_PROMPT_ID = "edit-typos"      # presets/scenarios.yaml: the answer copies the prompt, so drafts land
EXAMPLE_SETTINGS = dict(prompt="", target="smollm2-135m-instruct", draft="prompt-lookup", k=4, temperature=0, top_p=1.0,
                        top_k=0, max_new_tokens=24, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0,
                        auto_baseline=True, show_spaces=False)


class TraceLabeler:
    """`id -> Piece` from a trace's piece table; `text` returns the trace's whole-sequence decodes of the prompt
    and of the generated tokens (other sequences: the pieces joined)."""

    def __init__(self, pieces: tr.Pieces, texts: dict[tuple[int, ...], str] | None = None):
        self.pieces = pieces
        self.texts = dict(texts or {})

    def __call__(self, token_id: int) -> Piece:
        entry = self.pieces.get(int(token_id))
        if entry is None:
            return Piece(f"<id {int(token_id)}>", special=True)
        text, special, partial = entry
        return Piece(text, special, partial)

    def text(self, token_ids) -> str:
        ids = tuple(int(t) for t in token_ids)
        if ids in self.texts:
            return self.texts[ids]
        return "".join(self(t).text for t in ids)

    @classmethod
    def of(cls, trace: tr.Trace) -> "TraceLabeler":
        return cls(trace.pieces, {tuple(trace.prompt_ids): trace.prompt_text, tuple(trace.tokens): trace.text})


def piece_table(labeler, token_ids) -> tr.Pieces:
    table = {}
    for token in sorted(token_ids):
        piece = labeler(token)
        table[int(token)] = (piece.text, piece.special, piece.partial)
    return table


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~$:.@-])")      # with : . @ no text is autolinked


def plain_markdown(text, limit: int = 2000) -> str:
    """`text` shown literally by a gr.Markdown: one line, Markdown's punctuation backslash-escaped and HTML's
    '<', '>' and '&' as entities. A trace file is anyone's: its models, dates and status lines must not become
    links (autolinked URLs included), images or tags (Gradio's sanitizer strips <script> and onerror, not
    <img src=...> or ![](url))."""
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return html.escape(_MARKDOWN_SPECIAL.sub(r"\\\1", text), quote=False)


def render_options(trace: tr.Trace) -> RenderOptions:
    """What runner.prepare derives from the settings, plus the viewer's show-spaces choice."""
    return RenderOptions(show_spaces=bool(trace.display.get("show_spaces", False)),
                         greedy=trace.settings["temperature"] == 0, rule=trace.settings["rule"])


def make(settings: RunSettings, draft_label: str, prompt_ids, rounds, labeler, options: RenderOptions,
         stop_reason: str | None = None, baseline=None, display: dict | None = None, source: str = "run") -> tr.Trace:
    prompt_ids = [int(t) for t in prompt_ids]
    tokens = [t for r in rounds for t in r.emitted]
    return tr.make_trace(
        settings=dataclasses.asdict(settings),
        models={"target": reg.display_name(settings.target), "draft": draft_label},
        prompt_ids=prompt_ids, prompt_text=labeler.text(prompt_ids), text=labeler.text(tokens), rounds=rounds,
        pieces=piece_table(labeler, tr.token_ids(rounds, prompt_ids)), stop_reason=stop_reason, baseline=baseline,
        display={"show_spaces": options.show_spaces, **(display or {})}, source=source)


def latest_finished(state: SessionState):
    """(record, labeler, options) of the finished run the main view shows (the mismatch demo and the sweeps add
    runs to the history without showing them there), else the newest; ValueError if there is none."""
    prep = getattr(state, "active", None)
    if prep is not None and prep.record.recorded:       # the run the main view shows, not the newest in the history
        return prep.record, prep.labeler, prep.options
    if not state.history:
        raise ValueError("No finished run in this session yet: press Run first, then export.")
    record = state.history[-1]
    loaded = reg.REGISTRY.loaded(record.settings.target)
    if loaded is None:
        raise ValueError(f"{reg.display_name(record.settings.target)} is no longer loaded; run again to export.")
    return record, reg.REGISTRY.labeler(loaded), RenderOptions(greedy=record.settings.greedy, rule=record.settings.rule)


def export_record(record: RunRecord, labeler, options: RenderOptions, baseline=None,
                  baseline_info: dict | None = None) -> tr.Trace:
    """A finished run as a trace; the status the Stop button showed is kept so replay shows it too."""
    display = {"run_id": record.run_id}
    rounds = list(record.rounds)
    if record.timing is not None:
        # The timed rounds are the live ones with the clocks of the run measured without drawing: the replay shows
        # the same speedup, draft and verify costs as the live view did.
        rounds = list(record.timing.rounds)
        display.update(timed_seconds=record.timing.seconds, timed_at=record.timing.at, timed_how=record.timing.how)
    if baseline is not None and baseline_info:
        display.update(baseline_at=baseline_info.get("at"), baseline_run=baseline_info.get("run_id"))
    if record.stop_reason == "cancelled":
        display["status"] = f"Stopped after {len(record.rounds)} rounds"
    return make(record.settings, record.draft_label, record.prompt_ids, rounds, labeler, options,
                record.stop_reason, baseline, display)


def export_latest(state: SessionState) -> tr.Trace:
    record, labeler, options = latest_finished(state)
    return export_record(record, labeler, options, *state.baseline_of(record))


def settings_of(trace: tr.Trace) -> RunSettings:
    names = {f.name for f in dataclasses.fields(RunSettings)}
    return RunSettings(**{name: value for name, value in trace.settings.items() if name in names})


def replay_parts(trace: tr.Trace):
    """(Prepared without models, a scratch SessionState holding the baseline, TraceLabeler) for run_view."""
    from ui.playground import runner
    settings = settings_of(trace)
    labeler = TraceLabeler.of(trace)
    options = render_options(trace)
    run_id = trace.display.get("run_id")
    record = RunRecord(run_id if isinstance(run_id, int) else 1, settings, trace.models.get("draft", settings.draft),
                       tuple(trace.prompt_ids), rounds=list(trace.rounds),
                       fragments=[round_html(ev, labeler, options) for ev in trace.rounds],
                       stop_reason=trace.stop_reason, recorded=True)
    seconds, at, how = (trace.display.get(name) for name in ("timed_seconds", "timed_at", "timed_how"))
    if isinstance(seconds, (int, float)) and seconds > 0 and isinstance(how, str):
        record.timing = Timing(float(seconds), len(record.tokens), tuple(record.rounds),
                               float(at) if isinstance(at, (int, float)) else None, how)
    scratch = SessionState()
    if trace.baseline is not None:
        scratch.baselines[record.baseline_key] = trace.baseline
        at, by = trace.display.get("baseline_at"), trace.display.get("baseline_run")
        if isinstance(at, (int, float)):
            scratch.baseline_info[record.baseline_key] = {"at": float(at), "run_id": by}
    prep = runner.Prepared(settings, record.prompt_ids, labeler, options, record)
    return prep, scratch, labeler


def replay_view(trace: tr.Trace) -> dict:
    """The live run's final view, rebuilt from the trace: a dict keyed like handlers.RUN_OUTPUTS."""
    from ui.playground import handlers
    prep, scratch, _ = replay_parts(trace)
    status = trace.display.get("status")
    outputs = handlers.run_view(prep, scratch, status=status if isinstance(status, str) else None, final=True)
    return dict(zip(handlers.RUN_OUTPUTS, outputs))


def file_name(trace: tr.Trace) -> str:
    parts = ["trace", trace.source, trace.settings["target"], trace.settings["draft"], f"k{trace.settings['k']}"]
    run_id = trace.display.get("run_id")
    if isinstance(run_id, int):
        parts.insert(2, f"run{run_id}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(map(str, parts)))[:120] + ".json"


KEEP_EXPORTS = 32          # newest exports kept on disk; Gradio copies each into its own cache when it serves it
_exports_lock = threading.Lock()
_exports_root: Path | None = None


def exports_root() -> Path:
    """One temporary folder per process for trace exports, removed when the process exits."""
    global _exports_root
    if _exports_root is None:
        _exports_root = Path(tempfile.mkdtemp(prefix="spec-traces-"))
        atexit.register(shutil.rmtree, _exports_root, True)
    return _exports_root


def write_temp(trace: tr.Trace) -> Path:
    """Save under a descriptive name, in a fresh subfolder (two sessions may export the same name); only the
    newest KEEP_EXPORTS subfolders stay, so a long-running server does not fill its disk with old exports."""
    with _exports_lock:
        root = exports_root()
        folder = Path(tempfile.mkdtemp(dir=root))
        old = sorted(root.iterdir(), key=lambda p: p.stat().st_mtime_ns)[:-KEEP_EXPORTS]
        for stale in old:
            shutil.rmtree(stale, ignore_errors=True)
    return tr.save(trace, folder / file_name(trace))


def main(argv=None) -> None:
    """Record the example trace with the playground's own handler (a real run of the offline default)."""
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=EXAMPLE_PATH)
    parser.add_argument("--max-new-tokens", type=int, default=EXAMPLE_SETTINGS["max_new_tokens"])
    parser.add_argument("--prompt-id", default=EXAMPLE_PROMPT_ID, help="a prompt id of presets/scenarios.yaml")
    parser.add_argument("--draft", default=EXAMPLE_SETTINGS["draft"])
    parser.add_argument("--k", type=int, default=EXAMPLE_SETTINGS["k"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from ui.playground import handlers
    values = dict(EXAMPLE_SETTINGS, max_new_tokens=args.max_new_tokens, draft=args.draft, k=args.k)
    from ui.playground.presets import load_presets
    prompt = load_presets().prompt(args.prompt_id)
    values.update(prompt=prompt.text, chat=prompt.chat)
    state = SessionState()
    for _ in handlers.run(*[values[name] for name in handlers.RUN_INPUTS], state):
        pass
    trace = export_latest(state)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tr.save(trace, args.out)
    print(f"wrote {args.out}: {len(trace.rounds)} rounds, {len(trace.tokens)} tokens, {len(trace.pieces)} pieces")


if __name__ == "__main__":
    main()
