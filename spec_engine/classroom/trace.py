"""Trace export and replay: a run as one versioned JSON document that can be rendered again without models.

A trace holds the settings, the model names, the prompt token ids, every RoundEvent (`to_dict`), optional
plain-decoding baseline, and a *piece table*: the display text of every token id that appears anywhere in the
prompt or the events (drafted, emitted, correction, bonus, next_top, target_top), so a viewer without the
tokenizer shows exactly the same pieces. `prompt_text` and `text` are the whole-sequence decodes (a byte-level
tokenizer joins split characters only when decoding a sequence). `display` is free-form data for a viewer
(e.g. its status line), limited to scalars.

    {"format": "spec-decoding-trace", "version": 1, "created": "...Z", "source": "run" | "step-through",
     "settings": {"prompt", "chat", "target", "draft", "k", "temperature", "top_p", "top_k",
                  "max_new_tokens", "seed", "rule", ...},
     "models": {"target": ..., "draft": ...}, "prompt_ids": [...], "prompt_text": "...", "text": "...",
     "stop_reason": "eos" | "max_new_tokens" | "cancelled" | null, "rounds": [RoundEvent.to_dict(), ...],
     "stats": RunStats (informative: recomputed on load; its acceptance_by_position too),
     "provenance": [{"token", "kind": "draft" | "correction" | "bonus", "drafter"}, ...] (informative, likewise),
     "baseline": BaselineResult | null,
     "pieces": {"<id>": "text", ...}, "special_ids": [...], "partial_ids": [...], "display": {...}}

`loads`/`load` never trust the file: a malformed or foreign document raises `TraceError` (a ValueError) that
names the field, and oversize input (MAX_BYTES, MAX_ROUNDS) is refused before it is parsed further.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from spec_engine.core.decoder import MAX_K
from spec_engine.core.events import BaselineResult, RoundEvent, RunStats, run_stats
from spec_engine.core.verify import RULES

FORMAT = "spec-decoding-trace"
VERSION = 1
MAX_BYTES = 20 * 1024 * 1024
MAX_ROUNDS = 4096
MAX_PIECE_CHARS = 4096          # one token's display text
MAX_TOP = 64                    # candidates per next_top / target_top row
MAX_TOKEN_ID = 2**31 - 1
SOURCES = ("run", "step-through")

SETTINGS_TYPES = {"prompt": str, "chat": bool, "target": str, "draft": str, "k": int, "temperature": float,
                  "top_p": float, "top_k": int, "max_new_tokens": int, "seed": int, "rule": str}
BASELINE_TYPES = {"tokens": "ids", "prompt_len": int, "prefill_seconds": float, "total_seconds": float,
                  "step_seconds": "floats", "stop_reason": str}
ROUND_TYPES = {
    "index": int, "drafted": "ids", "accepted": int, "emitted": "ids", "correction": "id?", "bonus": "id?",
    "target_probs": "floats", "draft_probs": "floats", "accept_probs": "floats", "uniforms": "floats",
    "next_top": "pairs", "target_top": "rows", "k": int, "target_cache_len_before": int, "target_cache_len": int,
    "draft_cache_len_before": "int?", "draft_cache_len": "int?", "committed_len": int, "draft_seconds": float,
    "verify_seconds": float, "round_seconds": float, "prefill_seconds": float, "finished": bool,
    "stop_reason": "str?", "note": "str?",
    "tree_parents": "nodes?", "tree_path": "nodes?", "tree_tried": "nodes?",     # tree rounds only (core/tree_rule.py)
    "drafter": "str?",
}
ROUND_OPTIONAL = {f.name for f in dataclasses.fields(RoundEvent)
                  if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
assert set(ROUND_TYPES) == {f.name for f in dataclasses.fields(RoundEvent)}, "ROUND_TYPES must follow RoundEvent"

Pieces = dict[int, tuple[str, bool, bool]]       # id -> (text, special, partial)


class TraceError(ValueError):
    """The document is not a trace this version can replay; the message names the field."""


@dataclass(frozen=True)
class Trace:
    settings: dict                    # SETTINGS_TYPES keys, plus any extra scalars (skip_layers, ...)
    models: dict[str, str]            # "target", "draft" (labels as the live run showed them)
    prompt_ids: list[int]
    prompt_text: str
    text: str                         # the generated tokens decoded as one sequence
    rounds: list[RoundEvent]
    pieces: Pieces
    stop_reason: str | None = None
    baseline: BaselineResult | None = None
    display: dict = field(default_factory=dict)
    source: str = "run"
    created: str = ""

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.rounds for t in r.emitted]

    @property
    def stats(self) -> RunStats:
        total = (self.rounds[0].prefill_seconds if self.rounds else 0.0) + sum(r.round_seconds for r in self.rounds)
        return run_stats(self.rounds, total)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "created": self.created, "source": self.source,
            "settings": dict(self.settings), "models": dict(self.models), "prompt_ids": list(self.prompt_ids),
            "prompt_text": self.prompt_text, "text": self.text, "stop_reason": self.stop_reason,
            "rounds": [r.to_dict() for r in self.rounds], "stats": dataclasses.asdict(self.stats),
            "provenance": [entry for r in self.rounds for entry in r.provenance],
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "pieces": {str(i): text for i, (text, _, _) in sorted(self.pieces.items())},
            "special_ids": sorted(i for i, (_, special, _) in self.pieces.items() if special),
            "partial_ids": sorted(i for i, (_, _, partial) in self.pieces.items() if partial),
            "display": dict(self.display),
        }


def token_ids(rounds: list[RoundEvent], prompt_ids: list[int] = ()) -> set[int]:
    """Every token id a viewer may need to label: the prompt, drafts, emitted tokens and all candidates."""
    ids = set(int(t) for t in prompt_ids)
    for r in rounds:
        ids.update(r.drafted)
        ids.update(r.emitted)
        ids.update(t for t in (r.correction, r.bonus) if t is not None)
        ids.update(t for t, _ in r.next_top)
        ids.update(t for row in r.target_top for t, _ in row)
    return ids


def make_trace(settings: dict, models: dict[str, str], prompt_ids, prompt_text: str, text: str,
               rounds: list[RoundEvent], pieces: Pieces, stop_reason: str | None = None,
               baseline: BaselineResult | None = None, display: dict | None = None, source: str = "run",
               created: str | None = None) -> Trace:
    """Build a trace and check it as `validate` would check a loaded one (so what is saved can be loaded)."""
    trace = Trace(dict(settings), dict(models), [int(t) for t in prompt_ids], prompt_text, text, list(rounds),
                  {int(i): (str(t), bool(s), bool(p)) for i, (t, s, p) in pieces.items()}, stop_reason, baseline,
                  dict(display or {}), source,
                  created or datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"))
    return validate(json.loads(dumps(trace)))


def dumps(trace: Trace) -> str:
    return json.dumps(trace.to_dict(), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def save(trace: Trace, path: str | os.PathLike) -> Path:
    path = Path(path)
    text = dumps(trace)
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise TraceError(f"the trace is {len(text.encode('utf-8')) / 2**20:.1f} MiB, over the "
                         f"{MAX_BYTES // 2**20} MiB limit: export a shorter run")
    path.write_text(text, encoding="utf-8")
    return path


def load(path: str | os.PathLike) -> Trace:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"cannot read the trace file: {exc}") from None
    if size > MAX_BYTES:
        raise TraceError(f"the file is {size / 2**20:.1f} MiB, over the {MAX_BYTES // 2**20} MiB trace limit")
    with open(path, "rb") as handle:
        return loads(handle.read(MAX_BYTES + 1))


def loads(data: str | bytes) -> Trace:
    if len(data) > MAX_BYTES:
        raise TraceError(f"the trace is over the {MAX_BYTES // 2**20} MiB limit")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"not a trace: the file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not a trace: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise TraceError("not a trace: the JSON is nested too deeply") from None
    return validate(doc)


def _no_constant(name: str):
    raise TraceError(f"not a trace: JSON constant {name} is not allowed (numbers must be finite)")


# ------------------------------------------------------------------------------------------------ checks

def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _fail(where: str, what: str, value) -> TraceError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TraceError(f"trace field {where} must be {what}, got {_type_name(value)} {shown}")


def _int(where: str, value, lo: int = 0, hi: int = MAX_TOKEN_ID) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, "an integer", value)
    if not lo <= value <= hi:
        raise TraceError(f"trace field {where} must lie in [{lo}, {hi}], got {value}")
    return value


def _float(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, "a number", value)
    if not math.isfinite(value):
        raise _fail(where, "a finite number", value)
    return float(value)


def _str(where: str, value, limit: int | None = None) -> str:
    if not isinstance(value, str):
        raise _fail(where, "a string", value)
    if limit is not None and len(value) > limit:
        raise TraceError(f"trace field {where} is longer than {limit} characters")
    return value


def _list(where: str, value, limit: int) -> list:
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    if len(value) > limit:
        raise TraceError(f"trace field {where} has {len(value)} entries, over the limit of {limit}")
    return value


def _dict(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def _pair(where: str, value) -> tuple[int, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _fail(where, "a [token id, probability] pair", value)
    return _int(f"{where}[0]", value[0]), _float(f"{where}[1]", value[1])


def _typed(where: str, kind, value, limit: int):
    if kind is int:
        return _int(where, value, -2**63, 2**63 - 1)
    if kind is float:
        return _float(where, value)
    if kind is bool:
        if not isinstance(value, bool):
            raise _fail(where, "true or false", value)
        return value
    if kind is str:
        return _str(where, value)
    if kind == "nodes?":                 # tree node indices; -1 is the root
        return None if value is None else [_int(f"{where}[{i}]", x, -1, MAX_K - 1)
                                           for i, x in enumerate(_list(where, value, limit))]
    if isinstance(kind, str) and kind.endswith("?"):
        return None if value is None else _typed(where, {"id?": "id", "int?": int, "str?": str}[kind], value, limit)
    if kind == "id":
        return _int(where, value)
    if kind == "ids":
        return [_int(f"{where}[{i}]", x) for i, x in enumerate(_list(where, value, limit))]
    if kind == "floats":
        return [_float(f"{where}[{i}]", x) for i, x in enumerate(_list(where, value, limit))]
    if kind == "pairs":
        return [_pair(f"{where}[{i}]", x) for i, x in enumerate(_list(where, value, MAX_TOP))]
    if kind == "rows":
        return [[_pair(f"{where}[{i}][{j}]", x) for j, x in enumerate(_list(f"{where}[{i}]", row, MAX_TOP))]
                for i, row in enumerate(_list(where, value, MAX_K + 1))]
    raise AssertionError(kind)


def _record(where: str, value, types: dict, optional: set[str], limit: int) -> dict:
    value = _dict(where, value)
    unknown = sorted(set(value) - set(types))
    if unknown:
        raise TraceError(f"trace field {where} has unknown key(s) {unknown}")
    missing = sorted(set(types) - set(value) - optional)
    if missing:
        raise TraceError(f"trace field {where} lacks {', '.join(missing)}")
    return {name: _typed(f"{where}.{name}", types[name], value[name], limit) for name in types if name in value}


def _round(i: int, value) -> RoundEvent:
    where = f"rounds[{i}]"
    data = _record(where, value, ROUND_TYPES, ROUND_OPTIONAL, MAX_K + 1)
    n = len(data["drafted"])
    checks = [
        (data["index"] == i, f"index must be {i} (rounds in order from 0)"),
        (1 <= data["k"] <= MAX_K and n <= data["k"], f"k must lie in [1, {MAX_K}] with at most k draft tokens"),
        (0 <= data["accepted"] <= n, "accepted must lie in [0, len(drafted)]"),
        (len(data["emitted"]) <= n + 1, "emitted has more than len(drafted) + 1 tokens"),
        (len(data["target_probs"]) == n and len(data["draft_probs"]) == n,
         "target_probs and draft_probs need one entry per draft token"),
        (len(data["accept_probs"]) <= n and len(data["uniforms"]) <= n, "more decisions than draft tokens"),
        (len(data["target_top"]) <= n + 1, "target_top has more rows than len(drafted) + 1"),
        (data["correction"] is None or data["bonus"] is None, "a round has a correction or a bonus, not both"),
    ]
    checks += tree_checks(data, n)
    for ok, message in checks:
        if not ok:
            raise TraceError(f"trace field {where}: {message}")
    return RoundEvent.from_dict(data)


def tree_checks(data: dict, n: int) -> list[tuple[bool, str]]:
    """A tree round's fields must describe a tree over its drafted nodes, with the kept path a path of it (the
    views index them: a trace is anyone's file)."""
    parents, path, tried = data.get("tree_parents"), data.get("tree_path"), data.get("tree_tried")
    if parents is None:
        return [(path is None and tried is None, "tree_path and tree_tried need tree_parents")]
    path, tried = path or [], tried or []
    return [
        (len(parents) == n and all(-1 <= p < i for i, p in enumerate(parents)),
         "tree_parents needs one parent per node, each -1 (the root) or an earlier node"),
        (len(path) == data["accepted"] and all(0 <= node < n for node in path)
         and all(parents[node] == (path[j - 1] if j else -1) for j, node in enumerate(path)),
         "tree_path must be a path from the root of accepted nodes"),
        (all(0 <= node < n for node in tried) and len(set(tried)) == len(tried), "tree_tried must list nodes once"),
    ]


def _pieces(doc: dict) -> Pieces:
    table = _dict("pieces", doc.get("pieces"))
    special = set(_typed("special_ids", "ids", doc.get("special_ids", []), len(table)))
    partial = set(_typed("partial_ids", "ids", doc.get("partial_ids", []), len(table)))
    pieces: Pieces = {}
    for key, text in table.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 10):
            raise TraceError(f"trace field pieces: key {key[:20]!r} is not a token id")
        token = _int(f"pieces[{key}] id", int(key))
        pieces[token] = (_str(f"pieces[{key}]", text, MAX_PIECE_CHARS), token in special, token in partial)
    return pieces


def validate(doc) -> Trace:
    """A parsed JSON document -> Trace, or TraceError naming the first problem."""
    if not isinstance(doc, dict):
        raise TraceError(f"not a trace: expected a JSON object, got {_type_name(doc)}")
    if doc.get("format") != FORMAT:
        raise TraceError(f"not a trace: the 'format' field is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        raise TraceError(f"trace version {version!r} is not supported: this build reads version {VERSION}")
    for name in ("settings", "models", "prompt_ids", "prompt_text", "text", "rounds", "pieces"):
        if name not in doc:
            raise TraceError(f"trace field {name} is missing")
    settings = _dict("settings", doc["settings"])
    for name, kind in SETTINGS_TYPES.items():
        if name not in settings:
            raise TraceError(f"trace field settings.{name} is missing")
        settings = {**settings, name: _typed(f"settings.{name}", kind, settings[name], 0)}
    for name, value in settings.items():
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise _fail(f"settings.{name}", "a string, number, boolean or null", value)
    if not 1 <= settings["k"] <= MAX_K:
        raise TraceError(f"trace field settings.k must lie in [1, {MAX_K}], got {settings['k']}")
    if settings["rule"] not in RULES:
        raise TraceError(f"trace field settings.rule must be one of {RULES}, got {settings['rule']!r}")
    models = {name: _str(f"models.{name}", value, 1000) for name, value in _dict("models", doc["models"]).items()}
    raw_rounds = _list("rounds", doc["rounds"], MAX_ROUNDS)
    if not raw_rounds:
        raise TraceError("the trace has no rounds: nothing to replay")
    rounds = [_round(i, r) for i, r in enumerate(raw_rounds)]
    if any(r.finished for r in rounds[:-1]):
        raise TraceError("trace field rounds: only the last round may be marked finished")
    prompt_ids = _typed("prompt_ids", "ids", doc["prompt_ids"], MAX_BYTES)
    if not prompt_ids:
        raise TraceError("trace field prompt_ids is empty")
    pieces = _pieces(doc)
    missing = sorted(token_ids(rounds, prompt_ids) - set(pieces))
    if missing:
        raise TraceError(f"trace field pieces lacks the text of {len(missing)} token id(s) used in the trace, "
                         f"e.g. {missing[:5]}")
    stop_reason = doc.get("stop_reason")
    if stop_reason is not None:
        _str("stop_reason", stop_reason, 100)
    baseline = doc.get("baseline")
    if baseline is not None:
        baseline = BaselineResult(**_record("baseline", baseline, BASELINE_TYPES, set(), MAX_BYTES))
    display = _dict("display", doc.get("display", {}))
    for name, value in display.items():
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise _fail(f"display.{name}", "a string, number, boolean or null", value)
    source = doc.get("source", "run")
    if source not in SOURCES:
        raise TraceError(f"trace field source must be one of {SOURCES}, got {source!r}")
    if "stats" in doc:
        _dict("stats", doc["stats"])
    return Trace(settings=settings, models=models, prompt_ids=prompt_ids,
                 prompt_text=_str("prompt_text", doc["prompt_text"]), text=_str("text", doc["text"]),
                 rounds=rounds, pieces=pieces, stop_reason=stop_reason, baseline=baseline, display=display,
                 source=source, created=_str("created", doc.get("created", ""), 100))
