"""A class in one batch (issue #59): runs that arrive while another decodes join one running batch.

Batching shares a weight read across students. One forward of SmolLM2-135M over 32 sequences costs about 4.4
single-sequence forwards on two cores (bench/batch_ceiling.py), so thirty students served one after another waited
151.5 s for the last result, and served together they finish in a few seconds more than one run alone.

A `Lane` per target model runs the engine's `BatchDecoder` (spec_engine/core/batch.py) for every run that joins it:
each run brings its own prompt, drafter, k, rule, sampling and seed, joins the batch at the next round (its prompt is
prefilled inside the next rounds), streams its own rounds back to its page, and leaves when it ends or is stopped.
The lane is one computation at the engine's gate (coalesce.GATE): it waits for its turn like a run, decodes while it
has runs, and gives the turn back when the last one leaves. Each round goes through the engine's thread
(engine_thread.call), like a lone run's.

Which way a run goes (`choose`): with nothing decoding and nobody waiting, a run decodes alone, and its speed is
measured alone (its live pass, then the timed pass and plain decoding back to back); the figure a teacher shows is
that one. Otherwise it joins the batch: its page shows its own acceptance and tokens per forward, the batch sizes it
ran in, and says that its tokens/s were shared with the other students, so no lone speedup is shown for it.

Seeds: a sampled run keeps in the batch the draft lengths its drafter gives it alone (BatchDecoder.pinned), and a
greedy run's text does not depend on them: a seed gives the same text alone and in any batch.

Not on ZeroGPU: there each run is its own GPU call in a worker process, which a batch across calls cannot share.
"""
from __future__ import annotations

import itertools
import logging
import queue
import statistics
import threading
import weakref
from dataclasses import dataclass
from time import monotonic
from typing import Callable, Iterator

import spec_engine as se

from ui.playground import coalesce, compute, engine_thread

log = logging.getLogger("ui.playground.batching")

CLAIM_SECONDS = 2.0             # a run that chose to decode alone takes its gate turn within this
MAX_BATCH = 32                  # sequences in one batch (the batched benchmark's largest size); more wait a round
# The grid a packed forward is timed on, once per model (`batch_costs`): the default target's at start-up (its
# warm-up, registry.py: about 3 s on two cores for SmolLM2-135M; the engine's default grid took 11.5 s), another
# target's when a batch of it first has two runs, before they join it (so that no page of theirs draws meanwhile).
# Measured in a class instead, beside thirty pages, it took 3.8 s quiet and 20 s on a busy host, and came out wrong
# (16 x 2 rows dearer than 16 x 4), and the class took 110 s against 73 s. A packed forward's time here is nearly a
# function of its rows in all (32 rows: 70-80 ms whether 2 x 16 or 32 x 1), so the sequence counts are coarse; the
# rows are timed one by one up to 18 and around 32, where the kernels' row tiles put steps (BatchCosts: 8 -> 9 and
# 16 -> 17 rows on the 2-core EPYC).
COST_SEQUENCES = (1, 4, 16, 32)
COST_ROWS = tuple(range(1, 19)) + (24, 32, 33, 48, 64)           # beyond 64: the line through 48 and 64
COST_CONTEXT = 16
_END = object()
_IDS = itertools.count()


@dataclass(frozen=True)
class InBatch:
    """A round of this run was scored in one forward with `batch_size` sequences (`rows` rows in all), and the
    batch allowed it `draft_cap` drafts."""
    batch_size: int
    rows: int
    draft_cap: int


@dataclass(frozen=True)
class Quiet:
    """Nothing came for this run in coalesce.WAIT_POLL seconds while it decodes (a long engine call: a batch's first
    cost measurement, a long prompt's prefill). Its handler answers its client, so that a cancelled job or a closed
    tab can end it (Gradio closes a handler's generator only when it yields)."""


@dataclass
class Joined:
    """A run in the lane: its request, where its results go, when to stop it, and its deadline once it decodes."""
    request: se.Request
    out: queue.Queue
    should_stop: Callable[[], bool]
    seconds: float
    deadline: float | None = None
    left: bool = False                  # its consumer went away (a closed tab): cancel at the next round


class Lane:
    """Continuous batching for one target model (module docstring). `join` hands a request over and yields its
    BatchEvents, then its GenerationResult; coalesce.Waiting items come while the lane waits for its gate turn."""

    def __init__(self, target_model, gate: coalesce.Gate | None = None, max_batch: int = MAX_BATCH,
                 draft_length: str = "adaptive", on_engine: bool = True):
        self.target = target_model
        self.own_gate = gate
        self.max_batch = max_batch
        self.draft_length = draft_length
        self.on_engine = on_engine
        self.lock = threading.Lock()
        self.pending: list[Joined] = []
        self.members: dict[object, Joined] = {}
        self.driver: threading.Thread | None = None
        self.decoder: se.BatchDecoder | None = None
        self.ticket = None                  # the lane's turn at the gate while it decodes

    @property
    def gate(self) -> coalesce.Gate:
        return self.own_gate or coalesce.GATE

    @property
    def busy(self) -> bool:
        with self.lock:
            return self.driver is not None

    def decoding(self) -> int:
        """Runs decoding in the batch now (not those waiting for the lane's turn)."""
        with self.lock:
            return len(self.members)

    def join(self, request: se.Request, should_stop: Callable[[], bool], seconds: float) -> Iterator:
        joined = Joined(request, queue.Queue(), should_stop, seconds)
        with self.lock:
            self.pending.append(joined)
            if self.driver is None:
                self.driver = threading.Thread(target=self.drive, name="batch-lane", daemon=True)
                self.driver.start()
        try:
            while True:
                try:
                    item = joined.out.get(timeout=coalesce.WAIT_POLL)
                except queue.Empty:
                    if should_stop():
                        joined.left = True      # the driver cancels it at the next round and ends its stream
                    if joined.deadline is not None:
                        yield Quiet()           # decoding, but a long engine call: let the caller answer its client
                    continue
                if item is _END:
                    return
                if isinstance(item, compute.Failure):
                    item.throw()
                yield item
        finally:
            joined.left = True

    # ------------------------------------------------------------------------------------- the driver's thread

    def drive(self) -> None:
        """Wait for the gate's turn, then decode rounds while anyone is in the batch; then give the turn back."""
        ticket = None
        try:
            ticket = coalesce.turn(self.gate, self.abandoned, self.announce)
            if ticket is not None:
                self.ticket = ticket
                if self.draft_length == "adaptive" and kept_costs(self.target) is None and len(self.pending) > 1:
                    engine_thread.call(lambda: batch_costs(self.target), self.on_engine)
                self.decoder = se.BatchDecoder(self.target, draft_length=self.draft_length,
                                               costs=kept_costs(self.target), max_batch=self.max_batch)
                began, rounds, caps = monotonic(), 0, []
                while self.admit():
                    caps += self.round()
                    rounds += 1
                log.info("batch lane: %d rounds in %.1f s, %d drafts allowed in all", rounds, monotonic() - began,
                         sum(caps))
        except BaseException as exc:          # noqa: BLE001 - every run in the lane gets the error as its own
            failure = compute.Failure.of(exc)
            with self.lock:
                everyone, self.members, self.pending = list(self.members.values()) + self.pending, {}, []
            for joined in everyone:
                joined.out.put(failure)
                joined.out.put(_END)
        finally:
            with self.lock:
                self.driver, self.decoder, self.ticket = None, None, None
                left, self.pending = self.pending, []
            if ticket is not None:
                self.gate.leave(ticket)           # no duration: a batch's says nothing of a lone run's
            for joined in left:                   # joined as the lane ended: a new driver takes them
                if joined.left or joined.should_stop():
                    joined.out.put(_END)
                else:
                    self.rejoin(joined)

    def rejoin(self, joined: Joined) -> None:
        with self.lock:
            self.pending.append(joined)
            if self.driver is None:
                self.driver = threading.Thread(target=self.drive, name="batch-lane", daemon=True)
                self.driver.start()

    def announce(self, waiting: coalesce.Waiting) -> None:
        """The lane's place in the gate's line, to every run waiting in it."""
        for joined in self.snapshot():
            joined.out.put(waiting)

    def snapshot(self) -> list[Joined]:
        with self.lock:
            return list(self.members.values()) + list(self.pending)

    def abandoned(self) -> bool:
        """While waiting for the turn: every run that joined has gone."""
        with self.lock:
            return all(j.left or j.should_stop() for j in self.pending) and not self.members

    def admit(self) -> bool:
        """Between rounds: runs that were stopped, went away or ran out of time leave; those waiting join, as room
        allows. False when nobody is left (the driver then ends; a run joining after that starts a new one)."""
        now = monotonic()
        gone = [j for j in self.snapshot()
                if j.left or j.should_stop() or (j.deadline is not None and now > j.deadline)]
        for joined in gone:
            with self.lock:
                self.members.pop(joined.request.id, None)
                if joined in self.pending:
                    self.pending.remove(joined)
            self.decoder.cancel(joined.request.id)
            result = self.decoder.finished.pop(joined.request.id, None)
            if result is not None:
                joined.out.put(result)
            joined.out.put(_END)
        with self.lock:
            room = self.max_batch - len(self.members)
            joining, self.pending = self.pending[:room], self.pending[room:]
            if not joining and not self.members:
                return False
        for joined in joining:
            try:
                self.decoder.add(joined.request)
            except ValueError as error:
                joined.out.put(compute.Failure.of(error))
                joined.out.put(_END)
                continue
            joined.deadline = monotonic() + joined.seconds
            with self.lock:
                self.members[joined.request.id] = joined
        with self.lock:
            return bool(self.members)

    def round(self) -> list[int]:
        """One round of the batch; each run's draft cap."""
        decoder = self.decoder
        if decoder.costs is None and decoder.draft_length == "adaptive" and len(self.members) > 1:
            decoder.costs = engine_thread.call(lambda: batch_costs(self.target), self.on_engine)
        events = engine_thread.call(decoder.step, self.on_engine)
        for item in events:
            joined = self.members.get(item.request_id)
            if joined is None:
                continue
            joined.out.put(InBatch(item.batch_size, item.rows, item.draft_cap))
            joined.out.put(item.event)
            if item.request_id in self.decoder.finished:
                with self.lock:
                    self.members.pop(item.request_id, None)
                joined.out.put(self.decoder.finished.pop(item.request_id))
                joined.out.put(_END)
        return [item.draft_cap for item in events]


class Lanes:
    """The app's lanes, one per target model, and the choice between a lone run and the batch."""

    def __init__(self, gate: coalesce.Gate | None = None):
        self.own_gate = gate
        self.lock = threading.Lock()
        self.lanes: dict[int, Lane] = {}
        self.claimed = float("-inf")    # when a run last chose to decode alone (it holds the gate soon after)

    @property
    def gate(self) -> coalesce.Gate:
        return self.own_gate or coalesce.GATE

    def lane(self, target_model, on_engine: bool = True) -> Lane:
        with self.lock:
            key = id(target_model)
            if key not in self.lanes or self.lanes[key].target is not target_model:
                self.lanes[key] = Lane(target_model, self.own_gate, on_engine=on_engine)
            return self.lanes[key]

    def choose(self) -> bool:
        """True: this run joins a batch (something decodes or waits). False: it decodes alone, measured alone. Its
        claim counts as decoding until it holds the gate (milliseconds later) or CLAIM_SECONDS pass, so runs that
        arrive together batch; a claim never outlives that, so a handler that vanished cannot leave every later
        run batched."""
        with self.lock:
            busy = (monotonic() - self.claimed < CLAIM_SECONDS or self.gate.busy or self.gate.wait_line()
                    or any(lane.busy for lane in self.lanes.values()))
            if not busy:
                self.claimed = monotonic()
            return bool(busy)

    def done_alone(self) -> None:
        """A run that chose to decode alone has ended: its claim goes (the next run may decode alone at once)."""
        with self.lock:
            self.claimed = float("-inf")

    def queued(self) -> int:
        """Runs waiting in a lane for its turn at the gate, less the lanes' own places in the gate's line."""
        with self.lock:
            lanes = list(self.lanes.values())
        total = 0
        for lane in lanes:
            with lane.lock:
                waiting = sum(1 for joined in lane.pending if not joined.left)
                in_line = lane.driver is not None and lane.ticket is None
            total += waiting - in_line
        return total

    def serving(self) -> int:
        """Runs decoding in a batch, less the lanes' own gate turns (which coalesce.GATE counts as one each)."""
        with self.lock:
            lanes = list(self.lanes.values())
        return sum(lane.decoding() - (lane.ticket is not None) for lane in lanes)


LANES = Lanes()

_COSTS: dict[int, tuple[weakref.ref, se.BatchCosts]] = {}
_COSTS_LOCK = threading.Lock()


def kept_costs(model) -> se.BatchCosts | None:
    """The packed forward's costs measured for `model`, if they have been."""
    kept = _COSTS.get(id(model))
    return kept[1] if kept is not None and kept[0]() is model else None


def batch_costs(model) -> se.BatchCosts:
    """What a packed forward of `model` costs by rows in all and by sequences (BatchCosts), measured once per model."""
    with _COSTS_LOCK:
        costs = kept_costs(model)
        if costs is None:
            began = monotonic()
            costs = se.BatchCosts.measure(model, COST_SEQUENCES, COST_ROWS, context=COST_CONTEXT, repeats=1)
            _COSTS[id(model)] = (weakref.ref(model), costs)
            log.info("packed forward costs measured in %.1f s: %s", monotonic() - began, costs.summary())
        return costs


def enabled() -> bool:
    """Batching across runs: on, except on ZeroGPU (module docstring) or when SPEC_BATCHING=0."""
    import os
    return not compute.ZEROGPU and os.environ.get("SPEC_BATCHING", "1") != "0"


def describe(sizes: list[int]) -> str:
    """The line a batched run shows with its speed: the batches it ran in, and what its tokens/s mean."""
    if max(sizes) == 1:
        return ("joined the batch of runs that arrived while another run decoded, and was alone in it: its speed was "
                "not measured alone; press 'Measure the speedup again' for this run's own")
    others = max(sizes) - 1
    span = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
    return (f"decoded in a batch with other students' runs ({span} sequences per forward, median "
            f"{statistics.median(sizes):g}; up to {others} other{'s' if others != 1 else ''}): one weight read served "
            "them all, so its tokens/s are its share of the batch's forwards and no lone speedup is shown; press "
            "'Measure the speedup again' when nobody else is decoding for this run's own")


def request_id() -> int:
    return next(_IDS)
