"""ui/playground/coalesce.py piece by piece, on clocks the tests move and without threads: the gate's line and
estimates, a shared computation's followers, the gated work's labels and turn. The handlers' use of them
(a class at once, with a model) is tests/test_class_at_once.py."""
import time

import pytest

from ui.playground import coalesce, limits
from ui.playground.coalesce import Coalescer, Computation, Gate, Label, Waiting


def turn(gate):
    entering = gate.enter(poll=0)
    with pytest.raises(StopIteration) as done:
        next(entering)
    return done.value.value


def test_the_estimate_counts_the_places_ahead_and_the_runs_decoding_per_slot():
    gate = Gate(capacity=lambda: 2)
    assert gate.estimate(1) == 0.0                                   # next in line, a free slot: now
    gate.durations.extend([2.0, 4.0])
    gate.running.update({"a": 0.0, "b": 0.0})
    assert gate.estimate(1) == pytest.approx(3.0 * 2 / 2)            # the mean duration, two runs over two slots
    assert gate.estimate(3) == pytest.approx(3.0 * 4 / 2)
    assert Gate(capacity=lambda: 0).estimate(2) == pytest.approx(coalesce.DEFAULT_SECONDS)   # no slot: as one


def test_the_default_capacity_is_the_limits_concurrency():
    assert Gate().capacity() == limits.current().concurrency


def test_two_slots_let_two_runs_decode_and_the_third_waits():
    gate = Gate(capacity=lambda: 2)
    first, second = turn(gate), turn(gate)
    third = gate.enter(poll=0)
    assert next(third) == Waiting(1, 1, coalesce.DEFAULT_SECONDS)
    gate.leave(first, seconds=6.0)
    with pytest.raises(StopIteration):
        next(third)
    assert gate.busy == 2 and list(gate.durations) == [6.0]
    gate.leave(second)                                               # no duration: not counted in the estimate
    assert gate.busy == 1 and list(gate.durations) == [6.0]


def test_a_waiter_is_told_again_when_its_place_changes_or_after_the_refresh():
    now = [0.0]
    gate = Gate(capacity=lambda: 1, clock=lambda: now[0])
    ticket = turn(gate)
    ahead, waiter = gate.enter(poll=0, refresh=5.0), gate.enter(poll=0, refresh=5.0)
    assert next(ahead).position == 1 and next(waiter) == Waiting(2, 2, 2 * coalesce.DEFAULT_SECONDS)
    ahead.close()                                                    # it left the line: the place changed
    assert next(waiter) == Waiting(1, 1, coalesce.DEFAULT_SECONDS)
    now[0] = 5.0                                                     # nothing changed, but the refresh is due
    assert next(waiter) == Waiting(1, 1, coalesce.DEFAULT_SECONDS)
    gate.leave(ticket)
    with pytest.raises(StopIteration):
        next(waiter)


def test_a_stopped_waiter_leaves_the_line_with_no_ticket():
    gate = Gate(capacity=lambda: 1)
    ticket = turn(gate)
    stopping = gate.enter(should_stop=lambda: True, poll=0)
    assert next(stopping).position == 1
    with pytest.raises(StopIteration) as done:
        next(stopping)
    assert done.value.value is None and gate.wait_line() == 0
    gate.leave(ticket)


def test_a_turn_held_far_beyond_a_runs_deadline_is_taken_back():
    now = [0.0]
    gate = Gate(capacity=lambda: 1, clock=lambda: now[0])
    turn(gate)
    longest = 2 * limits.current().max_run_seconds + coalesce.STALE_SECONDS
    now[0] = longest
    waiter = gate.enter(poll=0)
    assert next(waiter).position == 1                                # exactly the limit: still held
    now[0] = longest + 1
    with pytest.raises(StopIteration):
        next(waiter)


# ------------------------------------------------------------------------------------- sharing a computation

def test_followers_join_a_computation_in_flight_and_a_finished_one_is_never_replayed():
    now = [0.0]
    coalescer = Coalescer(clock=lambda: now[0])
    leader, leads = coalescer.join("key", session=1)
    assert leads and leader.viewers == 1
    follower, leads = coalescer.join("key", session=2)
    assert follower is leader and not leads and leader.viewers == 2
    same, leads = coalescer.join("key", session=1)                   # in flight: its own session follows too
    assert same is leader and not leads
    assert coalescer.join("other", session=2)[1]
    leader.finish(complete=True)
    # finished a moment ago, complete: every session, its own or another, computes (and measures) anew
    for session in (1, 2, 3):
        again, leads = coalescer.join("key", session=session)
        assert again is not leader and leads
        again.finish(complete=True)


def test_a_stopped_computation_is_never_followed_after_its_end():
    coalescer = Coalescer(clock=lambda: 1000.0)
    done, _ = coalescer.join("key", session=1)
    assert done.key == "key" and not done.done and not done.complete and done.finished_at is None
    done.finish(complete=False)
    fresh, leads = coalescer.join("key", session=2)
    assert leads and fresh is not done


def test_a_follower_gets_every_result_and_the_leaders_place_while_it_waits():
    computation = Computation("key", session=1, clock=lambda: 50.0)
    computation.wait_at(Waiting(2, 3, 9.0))
    follower = computation.follow(poll=0)
    assert next(follower) == Waiting(2, 3, 9.0)
    computation.wait_at(None)
    computation.publish("built")
    computation.publish("round")
    assert [next(follower), next(follower)] == ["built", "round"]
    computation.publish("result")
    computation.finish(complete=True)
    assert list(follower) == ["result"]
    assert computation.done and computation.complete and computation.finished_at == 50.0
    assert list(computation.follow(poll=0)) == ["built", "round", "result"]     # a late follower: all at once


def test_a_follower_never_waits_for_results_already_there():
    computation = Computation("key", session=1)
    computation.publish("built")
    began = time.monotonic()
    assert next(computation.follow(poll=30.0)) == "built"            # in flight: what is there comes at once
    computation.finish(complete=True)
    assert list(computation.follow(poll=30.0)) == ["built"]          # finished: all at once, no wait
    assert time.monotonic() - began < 10.0


def test_a_follower_of_a_leader_that_is_not_waiting_yields_nothing_until_results_come():
    computation = Computation("key", session=1)
    asked = []
    follower = computation.follow(should_stop=lambda: asked.append(1) or len(asked) > 3, poll=0)
    assert list(follower) == [] and len(asked) == 4


def test_a_stopped_follower_ends_without_the_rest():
    computation = Computation("key", session=1)
    computation.publish("built")
    follower = computation.follow(should_stop=lambda: True, poll=0)
    assert list(follower) == ["built"]


# ------------------------------------------------------------------------------------------ the gated work

class Result:
    pass


GenerationResult = type("GenerationResult", (Result,), {})
BaselineResult = type("BaselineResult", (Result,), {})


def test_gated_work_is_labelled_when_another_run_decoded_during_a_measurement():
    gate = Gate(capacity=lambda: 2)
    other = turn(gate)
    timed, plain = GenerationResult(), BaselineResult()
    items = list(coalesce.gated(lambda: (x for x in ["round", timed, plain]), lambda: False, gate))
    assert items[0] == "round" and items[2] is timed and items[4] is plain
    assert items[1] == items[3] == Label("measured under load: 2 computations decoded at once")
    assert gate.busy == 1 and len(gate.durations) == 1
    gate.leave(other)
    alone = list(coalesce.gated(lambda: (x for x in ["round", timed]), lambda: False, gate))
    assert alone == ["round", timed]                                 # alone at the gate: no label


def test_gated_work_waits_for_its_turn_and_a_stopped_request_never_starts():
    gate = Gate(capacity=lambda: 1)
    ticket = turn(gate)
    seen, started = [], []
    stopped = coalesce.gated(lambda: started.append(1) or iter(()), lambda: True, gate, on_wait=seen.append)
    assert list(stopped) == [Waiting(1, 1, coalesce.DEFAULT_SECONDS)]
    assert seen == [Waiting(1, 1, coalesce.DEFAULT_SECONDS), None] and not started and gate.wait_line() == 0
    gate.leave(ticket)


def test_closing_gated_work_closes_the_work_and_ends_the_turn():
    gate = Gate(capacity=lambda: 1)
    closed = []

    def work():
        try:
            yield "round"
            yield "never"
        finally:
            closed.append(True)

    made = []                                  # held here too: only gated's own close() can close it
    gated = coalesce.gated(lambda: made.append(work()) or made[0], lambda: False, gate)
    assert next(gated) == "round" and gate.busy == 1
    gated.close()
    assert closed == [True] and gate.busy == 0
    assert 0.0 <= gate.durations[-1] < 60.0                          # the turn's own duration


def test_ages_and_waiting_texts():
    assert coalesce.age_text(-3) == "0 s" and coalesce.age_text(119.4) == "119 s"
    assert coalesce.age_text(120) == "2 min" and coalesce.age_text(600) == "10 min"
    assert Waiting(2, 5, 12.4).text() == "Waiting for the model: position 2 of 5 in line, about 12 s before it starts"
    assert Waiting(1, 1, 0.0).text("Waiting").startswith("Waiting: position 1 of 1")


def test_a_waiter_is_forgotten_once_it_leaves_and_one_dropped_as_stale_comes_back_in_line_or_closes():
    now = [1000.0]
    gate = Gate(capacity=lambda: 1, clock=lambda: now[0])
    ticket = turn(gate)
    stale, other = gate.enter(poll=0), gate.enter(poll=0)
    assert next(stale).position == 1 and next(other).position == 2
    now[0] += coalesce.STALE_SECONDS                                  # exactly the limit: not yet stale
    third = gate.enter(poll=0)
    assert next(third).position == 3
    now[0] += 1
    assert next(other).position == 1                                  # its poll dropped the stale one
    assert len(gate.polled) == 2 and gate.wait_line() == 2
    assert next(stale) == Waiting(3, 3, 3 * coalesce.DEFAULT_SECONDS)   # pulled again: back in line, last
    for waiter in (stale, other, third):
        waiter.close()
    assert gate.polled == {} and gate.wait_line() == 0
    dropped = gate.enter(poll=0)
    next(dropped)
    now[0] += coalesce.STALE_SECONDS + 1
    gate.enter(poll=0).__next__()                                     # another's poll drops it
    dropped.close()                                                   # closing it then is no error
    gate.leave(ticket)
    gate.leave(ticket)                                                # a turn taken back, then left: no error


def test_long_ages_in_minutes():
    assert coalesce.age_text(7200) == "120 min"
