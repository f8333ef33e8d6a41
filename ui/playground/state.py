"""Per-session state: kept in a `gr.State`, one object per browser session (never a module global).

It holds the finished runs (the comparison history), the measured plain-decoding baselines (cached per
target, prompt, sampling, seed and max_new_tokens, with when and by which run each was measured), the run in
progress, and the Stop flag that the engine polls between rounds.

Speed is reported like with like: a run's tokens per second and speedup come from its `Timing` (the engine
timed with nothing drawn, as plain decoding is), never from the live, drawn run, whose rate is kept apart as
`live_tokens_per_second`.
"""
from __future__ import annotations

import copy
import functools
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ui.views import metrics
import spec_engine as se
from spec_engine import acceptance_rate, judged_acceptance

MAX_HISTORY = 100        # finished runs kept per session (the oldest go first): a session's memory is bounded
MAX_BASELINES = 64       # measured baselines kept per session

HISTORY_COLUMNS = ["#", "scenario", "target", "draft", "k", "T", "top-p", "top-k", "rule", "seed", "max", "tokens",
                   "rounds", "accept", "tok/fwd", "theory", "tok/s", "plain tok/s", "speedup", "stop"]


@dataclass(frozen=True)
class RunSettings:
    target: str
    draft: str                       # a draft choice value (see ui.playground.drafts.draft_kinds)
    k: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int
    rule: str
    chat: bool
    prompt: str
    skip_layers: str = ""            # layer-skip draft: "" = default set, else "3,5-9"
    exit_after: int = 0              # early-exit draft: 0 = half of the layers

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sampling(self):
        import spec_engine as se
        return se.SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def baseline_key(self, prompt_ids: tuple[int, ...]) -> tuple:
        """What plain decoding depends on. Greedy ignores the seed, and top-k/top-p, so those are left out."""
        if self.greedy:
            return (self.target, prompt_ids, 0.0, 0, 1.0, 0, self.max_new_tokens)
        return (self.target, prompt_ids, self.temperature, self.top_k, self.top_p, self.seed, self.max_new_tokens)


@dataclass(frozen=True)
class Timing:
    """How fast the engine made a run, measured the way plain decoding is measured: nothing drawn meanwhile."""

    seconds: float          # engine time: prefill + every round
    tokens: int
    rounds: tuple           # the run's RoundEvents with the timed run's clocks (runner.keep_timing)
    at: float               # time.time() when measured
    how: str                # "decoded again without drawing" | "run without drawing"

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class RunRecord:
    run_id: int
    settings: RunSettings
    draft_label: str
    prompt_ids: tuple[int, ...]
    rounds: list = field(default_factory=list)          # RoundEvents so far
    fragments: list[str] = field(default_factory=list)  # rendered HTML of each round (rendered once)
    stop_reason: str | None = None
    recorded: bool = False
    timing: Timing | None = None                        # the speed measurement behind tokens/s and the speedup
    plain: tuple | None = None                          # (BaselineResult, time.time()) measured for this run
    dtype: str = ""                                     # the target's dtype ("float32", "bfloat16"; "" unknown)
    time_limit: float | None = None                     # the decoding budget it ran under (seconds)
    scenario: str = ""                                  # "S5 · 5. Layer skip ..." when a scenario's settings ran
    plain_note: str | None = None                       # where `plain` came from when not measured right after it
    labels: list[str] = field(default_factory=list)     # shared with another student, under load (coalesce.py)
    sizing: tuple | None = None                         # the verify-cost curve its drafts were sized by (or None)

    @property
    def baseline_key(self) -> tuple:
        return self.settings.baseline_key(self.prompt_ids)

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.rounds for t in r.emitted]

    @property
    def engine_seconds(self) -> float:
        times = metrics.elapsed_seconds(self.rounds)
        return times[-1] if times else 0.0


def scenario_label(settings: RunSettings) -> str:
    """'S5 · 5. Layer skip ...' when the run has every setting of a classroom scenario (presets/scenarios.yaml), else
    ''. Read once per run; a presets file that cannot be read names no scenario."""
    from ui.playground import presets
    try:
        found = presets.scenario_of(settings, default_presets(), default_target())
    except (OSError, ValueError):
        return ""
    return "" if found is None else f"{presets.scenario_tag(found)} · {found.label}"


@functools.lru_cache(maxsize=1)
def default_presets():
    from ui.playground.presets import load_presets
    return load_presets()


def default_target() -> str:
    return se.default_model_name()


def clock(at: float | None) -> str:
    return "" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


def summarize(record: RunRecord, baseline=None, baseline_info: dict | None = None) -> dict:
    """Headline numbers of a run. Tokens per second come from the run's Timing once it has one (else from the
    live run, marked `timed: False`); the speedup only from a Timing and a measured baseline with the same key."""
    rounds = record.rounds
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    tokens = record.tokens
    live_seconds = record.engine_seconds
    timing = record.timing
    seconds = timing.seconds if timing is not None else live_seconds
    acceptance = acceptance_rate(rounds)          # a tree round's drafts counted by its depth
    out = {
        "run_id": record.run_id,
        "scenario": record.scenario,
        "target": record.settings.target,
        "draft": record.settings.draft,
        "draft_label": record.draft_label,
        "k": record.settings.k,
        "rounds": len(rounds),
        "new_tokens": len(tokens),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": acceptance,
        "tokens_per_forward": len(tokens) / len(rounds) if rounds else 0.0,
        "judged_acceptance": judged_acceptance(rounds),
        "expected_tokens_per_forward": metrics.expected_tokens_per_round(judged_acceptance(rounds), record.settings.k),
        "seconds": seconds,
        "tokens_per_second": len(tokens) / seconds if seconds > 0 else 0.0,
        "live_tokens_per_second": len(tokens) / live_seconds if live_seconds > 0 else 0.0,
        "timed": timing is not None,
        "timing": None if timing is None else f"{timing.how} at {clock(timing.at)}",
        "baseline_timing": None,
        "stop_reason": record.stop_reason,
        "tokens": tokens,
        "baseline_tokens_per_second": None,
        "baseline_seconds": None,
        "speedup": None,
        "matches_baseline": None,
        "first_difference": None,
        "dtype": record.dtype or None,
        "tree_nodes_per_round": ((drafted / len(rounds))
                                 if any(getattr(r, "tree_parents", None) is not None for r in rounds) else None),
        "labels": list(record.labels),
    }
    if baseline is not None and baseline.tokens_per_second > 0 and out["tokens_per_second"] > 0:
        out["baseline_tokens_per_second"] = baseline.tokens_per_second
        out["baseline_seconds"] = baseline.total_seconds
        info = baseline_info or {}
        if info:
            by = "this run" if info.get("run_id") == record.run_id else f"run {info.get('run_id')}"
            out["baseline_timing"] = f"decoded without drawing at {clock(info.get('at'))} ({info.get('note') or by})"
        if timing is not None:      # the live rounds' clocks ran while the view was drawn: only timed ones count
            out["speedup"] = out["tokens_per_second"] / baseline.tokens_per_second
            out.update(metrics.cost_fields(list(timing.rounds), baseline))   # draft / verify cost, predicted speedup
        if record.settings.greedy and record.settings.rule == "exact":
            n = min(len(tokens), len(baseline.tokens))
            diff = next((i for i in range(n) if tokens[i] != baseline.tokens[i]), None)
            out["matches_baseline"] = diff is None
            out["first_difference"] = diff
    return out


def history_row(summary: dict, settings: RunSettings) -> list:
    def r(x, nd=2):
        return None if x is None else round(x, nd)
    return [summary["run_id"], summary.get("scenario") or "", settings.target, summary["draft_label"], settings.k,
            settings.temperature, settings.top_p, settings.top_k, settings.rule, settings.seed, settings.max_new_tokens,
            summary["new_tokens"], summary["rounds"], r(summary["acceptance_rate"], 3),
            r(summary["tokens_per_forward"]),
            r(summary["expected_tokens_per_forward"]), r(summary["tokens_per_second"], 1),
            r(summary["baseline_tokens_per_second"], 1), r(summary["speedup"]), summary["stop_reason"] or ""]


class SessionState:
    """Everything one visitor has: Gradio deep-copies the initial value per session, so the lock and the
    Stop event are recreated by `__deepcopy__` instead of being copied."""

    def __init__(self):
        self.history: list[RunRecord] = []
        self.exports: list[Path] = []                 # folders of this session's trace exports (deleted on expiry)
        self.baselines: dict[tuple, object] = {}      # baseline key -> spec_engine.BaselineResult
        self.baseline_info: dict[tuple, dict] = {}    # baseline key -> {"at": time.time(), "run_id": measured by}
        self.current: RunRecord | None = None
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self._next_id = 1
        self.active = None                            # runner.Prepared of the latest run (for Stop and re-render)
        self.target: str | None = None                # last target that could load (a bad pick reverts to it)
        self.compare_axis = "k"
        self.compare_runs: list[int] = []             # run ids the comparison shows ([]: every run)

    def __deepcopy__(self, memo):
        fresh = SessionState()
        fresh.history = copy.deepcopy(self.history, memo)
        fresh.baselines = dict(self.baselines)
        fresh.baseline_info = dict(self.baseline_info)
        fresh.current = self.current
        fresh._next_id = self._next_id
        fresh.target, fresh.compare_axis = self.target, self.compare_axis
        fresh.compare_runs = list(self.compare_runs)
        return fresh

    def new_run(self, settings: RunSettings, draft_label: str, prompt_ids) -> RunRecord:
        scenario = scenario_label(settings)
        with self.lock:
            record = RunRecord(self._next_id, settings, draft_label, tuple(int(t) for t in prompt_ids),
                               scenario=scenario)
            self._next_id += 1
            self.current = record
            return record

    def finish(self, record: RunRecord, stop_reason: str | None = None) -> bool:
        """Add a run to the history once (the run handler and the Stop handler may both try)."""
        with self.lock:
            if record.recorded or not record.rounds:
                return False
            record.recorded = True
            if stop_reason and not record.stop_reason:
                record.stop_reason = stop_reason
            self.history.append(record)
            del self.history[:-MAX_HISTORY]
            return True

    def add_baseline(self, key: tuple, result, run_id: int | None = None, at: float | None = None,
                     note: str | None = None) -> None:
        with self.lock:
            self.baselines.pop(key, None)
            self.baselines[key] = result
            self.baseline_info[key] = {"at": time.time() if at is None else at, "run_id": run_id, "note": note}
            for old in list(self.baselines)[:-MAX_BASELINES]:
                del self.baselines[old]
                self.baseline_info.pop(old, None)

    def baseline_of(self, record: RunRecord) -> tuple[object, dict | None]:
        """(baseline, provenance) of a run: the plain decoding measured right after it when there is one (so an
        older run in the history keeps its own, back-to-back measurement), else this session's for its key."""
        if record.plain is not None:
            result, at = record.plain
            return result, {"at": at, "run_id": record.run_id, "note": record.plain_note}
        key = record.baseline_key
        return self.baselines.get(key), self.baseline_info.get(key)

    def summary(self, record: RunRecord) -> dict:
        """`summarize` with the run's baseline and its provenance (`baseline_of`)."""
        return summarize(record, *self.baseline_of(record))

    def baseline_for(self, record: RunRecord | None):
        return None if record is None else self.baseline_of(record)[0]

    def summaries(self) -> list[tuple[dict, RunSettings]]:
        return [(self.summary(r), r.settings) for r in self.history]

    def compared(self) -> list[tuple[dict, RunSettings]]:
        """The runs the comparison shows: those selected that are still in the history, else every run."""
        chosen = [r for r in self.history if r.run_id in set(self.compare_runs)]
        return [(self.summary(r), r.settings) for r in chosen or self.history]

    def history_rows(self) -> list[list]:
        return [history_row(s, settings) for s, settings in self.summaries()][::-1]   # newest first

    def clear_history(self) -> None:
        with self.lock:
            self.history.clear()
            self.compare_runs = []


def remove_exports(folders: list[Path]) -> None:
    """Delete a session's trace export folders (each export has its own: replay.write_temp)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    folders.clear()


def expire(state: "SessionState | None") -> None:
    """gr.State's delete_callback: the session's time to live has passed (or its tab closed an hour ago). Gradio
    drops its reference; this deletes what the session left outside it (its trace exports) and its runs, in case
    a run in flight still holds the state."""
    if state is None:
        return
    remove_exports(state.exports)
    with state.lock:
        state.history.clear()
        state.baselines.clear()
        state.baseline_info.clear()
        state.current = state.active = None

