"""A whole class at once (issue #36): thirty people press Run with the same settings in the same minute.

Three process-wide pieces, all Gradio-free:

- `Gate`: at most `limits.concurrency` computations decode at once, the rest wait in order. A waiting request
  learns its position and an estimate (the mean duration of recent computations), which its page shows; a
  measurement made while another computation decoded is labelled "measured under load".
- `Coalescer`: identical requests (same model, prompt, settings, seed and rule) in flight together share one
  computation. The first (the leader) waits at the gate and runs it; every result it yields is kept in a
  `Computation`, and every other identical request that arrives before it ends (a follower) gets the same results
  as they come. Each follower folds them into its own session, so its history and views are its own; its page says
  plainly that its run was shared with another student. A finished computation is never handed out again: a
  request that arrives after the end computes anew, so a Run pressed again always measures.
- `BaselineCache`: plain decoding per (model, prompt, settings), measured once and reused by other sessions
  while fresh (BASELINE_FRESH_SECONDS) and only while other requests wait at the gate (`reusable_baseline`), labelled
  with its age. With nobody waiting, and for a session's own repeated runs, it is measured again, back to back
  with the timed run.

The computation itself is the one a lone Run makes (compute.run_job); only who waits for it changes.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from time import monotonic
from typing import Callable, Iterator

from ui.playground import limits

BASELINE_FRESH_SECONDS = 300.0  # a plain-decoding baseline is reused by other sessions this long
WAIT_POLL = 1.0                 # seconds between two looks at the line (and at the request's Stop)
WAIT_REFRESH = 5.0              # a waiting message when the place changes, else at most this often: thirty waiting
                                # pages refreshed every second slowed the class's decoding (bench/class_load.py)
STALE_SECONDS = 30.0            # a waiter not polled this long has been abandoned (see Gate._drop_stale)
DEFAULT_SECONDS = 8.0           # a computation's duration before any has been timed (the default Run alone: ~6 s)
MAX_BASELINES = 256


@dataclass(frozen=True)
class Waiting:
    """A request waits: its place in line (1 = next), how many wait, and the estimated seconds until it starts."""
    position: int
    waiting: int
    seconds: float

    def text(self, what: str = "Waiting for the model") -> str:
        return (f"{what}: position {self.position} of {self.waiting} in line, about {self.seconds:.0f} s "
                f"before it starts")


class Gate:
    """FIFO admission of computations, `capacity()` at once (limits.current().concurrency by default)."""

    def __init__(self, capacity: Callable[[], int] | None = None, clock: Callable[[], float] = monotonic):
        self.capacity = capacity or (lambda: limits.current().concurrency)
        self.clock = clock
        self.line: deque[object] = deque()
        self.running: dict[object, float] = {}      # a decoding ticket -> when its turn began
        self.durations: deque[float] = deque(maxlen=8)
        self.polled: dict[object, float] = {}      # a waiting ticket -> when its handler last asked for its turn
        self.cond = threading.Condition()

    def estimate(self, position: int) -> float:
        """Seconds before the request at `position` (1 = next) starts."""
        mean = sum(self.durations) / len(self.durations) if self.durations else DEFAULT_SECONDS
        return mean * (position - 1 + len(self.running)) / max(1, self.capacity())

    def enter(self, should_stop: Callable[[], bool] = lambda: False, poll: float = WAIT_POLL,
              refresh: float = WAIT_REFRESH) -> Iterator[Waiting]:
        """Wait for a turn, looking at the line every `poll` seconds and yielding a Waiting when the place in line
        changed, or `refresh` seconds after the last; returns the ticket for `leave` (None when `should_stop()`
        turned true first: the request left the line)."""
        ticket, shown, shown_at = object(), None, float("-inf")
        with self.cond:
            self.line.append(ticket)
            self.polled[ticket] = self.clock()
        try:
            while True:
                with self.cond:
                    self.polled[ticket] = self.clock()
                    self._drop_stale()
                    if ticket not in self.line:         # dropped as stale, then pulled again: back in line
                        self.line.append(ticket)
                    if self.line[0] is ticket and len(self.running) < self.capacity():
                        self.line.popleft()
                        self.running[ticket] = self.clock()
                        self.cond.notify_all()
                        return ticket
                    position = self.line.index(ticket) + 1
                    waiting = Waiting(position, len(self.line), self.estimate(position))
                if (position, waiting.waiting) != shown or self.clock() - shown_at >= refresh:
                    shown, shown_at = (position, waiting.waiting), self.clock()
                    yield waiting
                if should_stop():
                    return None
                with self.cond:
                    if not (self.line[0] is ticket and len(self.running) < self.capacity()):
                        self.cond.wait(poll)
        finally:
            with self.cond:
                self.polled.pop(ticket, None)
                if ticket in self.line:
                    self.line.remove(ticket)
                    self.cond.notify_all()

    def _drop_stale(self) -> None:
        """Under the lock: a waiter nobody has pulled for STALE_SECONDS (its handler abandoned without being
        closed, e.g. its server shut down) gives its place up, and a turn held far beyond a run's deadline is
        taken back, so that neither can hold the line for ever."""
        now = self.clock()
        for other in [t for t in self.line if now - self.polled.get(t, now) > STALE_SECONDS]:
            self.line.remove(other)
            self.polled.pop(other, None)
        longest = 2 * limits.current().max_run_seconds + STALE_SECONDS     # a run's own deadline, with room
        for other in [t for t, began in self.running.items() if now - began > longest]:
            del self.running[other]             # its handler was abandoned after its turn began

    def leave(self, ticket, seconds: float | None = None) -> None:
        with self.cond:
            self.running.pop(ticket, None)
            if seconds is not None:
                self.durations.append(seconds)
            self.cond.notify_all()

    @property
    def busy(self) -> int:
        """Computations decoding now."""
        with self.cond:
            return len(self.running)

    def wait_line(self) -> int:
        with self.cond:
            return len(self.line)


class Computation:
    """The results of one computation, kept for every request that shares it."""

    def __init__(self, key, session: int, clock: Callable[[], float] = time.time):
        self.key, self.session, self.clock = key, session, clock
        self.items: list = []
        self.done = False
        self.complete = False           # ran to its end (a follower of a stopped one is told so)
        self.finished_at: float | None = None
        self.viewers = 1                # requests served by it (the leader included)
        self.following = 0              # followers receiving its results now (served, for admission: `serving`)
        self.waiting: Waiting | None = None    # the leader's place in line while it waits
        self.cond = threading.Condition()

    def publish(self, item) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def wait_at(self, waiting: Waiting | None) -> None:
        with self.cond:
            self.waiting = waiting
            self.cond.notify_all()

    def finish(self, complete: bool) -> None:
        with self.cond:
            self.done, self.complete, self.finished_at = True, complete, self.clock()
            self.waiting = None
            self.cond.notify_all()

    def follow(self, should_stop: Callable[[], bool] = lambda: False, poll: float = WAIT_POLL) -> Iterator:
        """Every result, from the first: what is there at once, then each new one as the leader yields it; a
        Waiting every `poll` seconds while the leader waits for its turn."""
        seen, served = 0, False
        try:
            while True:
                with self.cond:
                    if seen == len(self.items) and not self.done:
                        self.cond.wait(poll)
                    new, done, waiting = self.items[seen:], self.done, self.waiting
                    if new and not served:      # the leader's turn has begun: this request is served too
                        self.following, served = self.following + 1, True
                for item in new:
                    yield item
                seen += len(new)
                if done and seen == len(self.items):
                    return
                if should_stop():
                    return
                if not new and waiting is not None:
                    yield waiting
        finally:
            if served:
                with self.cond:
                    self.following -= 1


class Coalescer:
    """Identical requests -> one Computation (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.computations: dict[object, Computation] = {}
        self.lock = threading.Lock()

    def join(self, key, session: int) -> tuple[Computation, bool]:
        """(the computation for `key`, True when this request leads it). A request follows one in flight; a
        finished one is forgotten, never replayed: a replay would show an old measurement as this request's."""
        with self.lock:
            for old in [k for k, c in self.computations.items() if c.done]:
                del self.computations[old]
            current = self.computations.get(key)
            if current is not None:
                with current.cond:
                    current.viewers += 1
                    current.cond.notify_all()
                return current, False
            computation = Computation(key, session, self.clock)
            self.computations[key] = computation
            return computation, True


    def following(self) -> int:
        """Followers receiving a computation's results now."""
        with self.lock:
            computations = list(self.computations.values())
        return sum(c.following for c in computations)


class BaselineCache:
    """Plain decoding by baseline key: (BaselineResult, when, session that measured it)."""

    def __init__(self, clock: Callable[[], float] = time.time, fresh_seconds: float = BASELINE_FRESH_SECONDS):
        self.clock, self.fresh_seconds = clock, fresh_seconds
        self.entries: dict[tuple, tuple] = {}
        self.lock = threading.Lock()

    def put(self, key: tuple, result, session: int, at: float | None = None, under_load: str | None = None) -> None:
        with self.lock:
            self.entries.pop(key, None)
            self.entries[key] = (result, self.clock() if at is None else at, session, under_load)
            for old in list(self.entries)[:-MAX_BASELINES]:
                del self.entries[old]

    def fresh(self, key: tuple, session: int):
        """(result, measured at, under-load note) measured by another session less than fresh_seconds ago, or None."""
        with self.lock:
            entry = self.entries.get(key)
        if entry is None:
            return None
        result, at, owner, under_load = entry
        if owner == session or self.clock() - at > self.fresh_seconds:
            return None
        return result, at, under_load


GATE = Gate()
COALESCER = Coalescer()
BASELINES = BaselineCache()


def serving() -> int:
    """Requests being served now: turns at the gate (a run, a sweep point, a lab computation) and the followers of a
    computation whose results are coming, and the runs decoding in a batch (batching.py). app.AdmissionQueue counts
    every other request it admitted as waiting."""
    from ui.playground import batching        # it builds on this module
    return GATE.busy + COALESCER.following() + batching.LANES.serving()


def queued() -> int:
    """Requests waiting for their turn: in the gate's line, or in a batch lane that waits for its turn (batching.py)."""
    from ui.playground import batching
    return GATE.wait_line() + batching.LANES.queued()


def reusable_baseline(key: tuple, session: int):
    """(result, measured at, under-load note) of plain decoding another session measured for `key` while fresh, to
    reuse instead of measuring it again, but only when other requests wait at the gate: then the pass saved is their
    time. With nobody waiting, None: the run measures its own, back to back with its timed run. A shared host's speed
    drifts by a quarter from one minute to the next, and a ratio against plain decoding measured minutes earlier
    measured the drift: the default run read x0.70-x1.10 against another session's plain decoding, x1.23-x1.47
    against its own (docs/benchmarks.md)."""
    return BASELINES.fresh(key, session) if GATE.wait_line() else None


def age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass(frozen=True)
class Label:
    """A line a run's page shows about how it was computed ("measured under load: ...")."""
    text: str


@dataclass(frozen=True)
class Reused:
    """The BaselineResult that follows was measured earlier, by another request, at `at` (time.time())."""
    at: float
    under_load: str | None = None


def turn(gate: Gate, should_stop: Callable[[], bool], on_wait: Callable[[Waiting], None]):
    """Wait for a turn at `gate` on this thread, handing each Waiting to `on_wait`; the ticket for `gate.leave`, or
    None when `should_stop()` turned true first (`gated` is the same wait for a generator, which yields them)."""
    entering = gate.enter(should_stop)
    while True:
        try:
            on_wait(next(entering))
        except StopIteration as done:
            return done.value


def gated(make_work: Callable[[], Iterator], should_stop: Callable[[], bool], gate: Gate | None = None,
          on_wait: Callable[[Waiting | None], None] = lambda waiting: None) -> Iterator:
    """Wait for a turn at `gate` (yielding Waiting), then yield the results of `make_work()`, with a Label when
    another computation decoded during a measurement; the turn ends when the work does or this is closed."""
    gate = gate or GATE
    entering = gate.enter(should_stop)
    while True:
        try:
            waiting = next(entering)
        except StopIteration as done:
            ticket = done.value
            break
        on_wait(waiting)
        yield waiting
    on_wait(None)
    if ticket is None:
        return
    began, work, loaded = monotonic(), None, 0
    try:
        work = make_work()
        for item in work:
            loaded = max(loaded, gate.busy)
            if loaded > 1 and type(item).__name__ in ("GenerationResult", "BaselineResult"):
                yield Label(f"measured under load: {loaded} computations decoded at once")
            yield item
    finally:
        if work is not None:
            work.close()
        gate.leave(ticket, monotonic() - began)
