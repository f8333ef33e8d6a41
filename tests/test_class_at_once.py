"""A class at once (issue #36): identical requests share one computation, plain decoding is reused across sessions
while fresh and others wait, and a waiting request knows its place in line. The handlers are called directly (no
server); the computation is held at a known point by events, never by sleeping."""
import re
import threading

import pytest

from ui.playground import coalesce, compute, handlers
from ui.playground.coalesce import DEFAULT_SECONDS, Gate, Waiting
from ui.playground.state import SessionState

from test_ui_handlers import run_args


def test_the_gate_says_each_place_in_line_and_an_estimate_from_recent_durations():
    gate = Gate(capacity=lambda: 1)
    first = gate.enter(poll=0)
    with pytest.raises(StopIteration) as entered:
        next(first)
    second, third = gate.enter(poll=0), gate.enter(poll=0)
    assert next(second) == Waiting(1, 1, DEFAULT_SECONDS)         # one computation decodes ahead of it
    assert next(third) == Waiting(2, 2, 2 * DEFAULT_SECONDS)
    gate.leave(entered.value.value, seconds=4.0)
    with pytest.raises(StopIteration):
        next(second)                                              # its turn
    assert next(third) == Waiting(1, 1, 4.0)                      # the estimate follows the measured duration
    third.close()
    assert gate.wait_line() == 0 and gate.busy == 1


@pytest.fixture
def fresh_class(monkeypatch):
    """Empty process-wide coalescer and baseline cache; run_job counted and held after its first result (Built)
    until `go` is set."""
    monkeypatch.setattr(coalesce, "COALESCER", coalesce.Coalescer())
    monkeypatch.setattr(coalesce, "BASELINES", coalesce.BaselineCache())
    calls, started, go = [], threading.Event(), threading.Event()
    run_job = compute.run_job

    def held(job, stop):
        calls.append(job)
        work = run_job(job, stop)
        try:
            yield next(work)
            started.set()
            go.wait(60)
            yield from work
        finally:
            work.close()
    monkeypatch.setattr(compute, "run_job", held)
    return calls, started, go


@pytest.mark.slow          # five short runs of SmolLM2, two of them held open together (about 6 s)
def test_identical_requests_share_one_computation_and_each_gets_every_event(playground_registry, fresh_class):
    calls, started, go = fresh_class
    args = run_args(draft="prompt-lookup", max_new_tokens=6)
    leader, follower = SessionState(), SessionState()
    outputs = {}
    threads = [threading.Thread(target=lambda s=s: outputs.setdefault(id(s), list(handlers.run(*args, s))))
               for s in (leader, follower)]
    threads[0].start()
    assert started.wait(60)                         # the leader's run is built and held
    threads[1].start()
    (computation,) = coalesce.COALESCER.computations.values()
    with computation.cond:
        assert computation.cond.wait_for(lambda: computation.viewers == 2, 60)
    go.set()
    for thread in threads:
        thread.join(60)
    assert len(calls) == 1                          # one computation for both
    (a,), (b,) = leader.history, follower.history
    assert a.tokens == b.tokens and len(a.tokens) == 6
    assert [r.index for r in b.rounds] == [r.index for r in a.rounds]     # every round reached the follower
    assert a.rounds == b.rounds                     # the same events, folded into each session
    shared = handlers.shared_label(2)
    assert shared.startswith("shared with another student: one computation served 2 identical requests")
    assert a.labels == [shared] and b.labels == [shared]
    final = outputs[id(follower)][-1][handlers.RUN_OUTPUTS.index("stats")]
    assert "Shared with another student" in final

    late = SessionState()                           # after the end: computed anew, never a replay
    list(handlers.run(*args, late))
    assert len(calls) == 2 and late.history[0].tokens == a.tokens and late.history[0].labels == []
    list(handlers.run(*args, leader))               # the leader's session presses Run again: computed again
    assert len(calls) == 3 and leader.history[1].labels == []


@pytest.mark.slow          # four short runs of SmolLM2 with their speed measured (about 12 s)
def test_plain_decoding_is_reused_by_other_sessions_only_while_others_wait(playground_registry, fresh_class,
                                                                            monkeypatch):
    calls, started, go = fresh_class
    go.set()
    first, second, third = SessionState(), SessionState(), SessionState()
    list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=6, auto_baseline=True), first))
    list(handlers.run(*run_args(draft="prompt-lookup", k=2, max_new_tokens=6, auto_baseline=True), second))
    assert [(job.settings.k, job.plain) for job in calls] == [(3, True), (2, True)]   # nobody waited: measured again
    assert second.summary(second.history[0])["baseline_timing"].endswith("(this run)")
    monkeypatch.setattr(coalesce.GATE, "wait_line", lambda: 1)       # a request waits behind this one's turn
    monkeypatch.setenv("SPEC_BATCHING", "0")     # else a run arriving while one waits joins a batch (test_class_batch)
    list(handlers.run(*run_args(draft="prompt-lookup", k=4, max_new_tokens=6, auto_baseline=True), third))
    assert (calls[-1].settings.k, calls[-1].plain) == (4, False)     # reused: the pass saved is the waiter's time
    c = third.history[0]
    assert c.plain[0] is second.history[0].plain[0] and c.timing is not None
    summary = third.summary(c)
    assert summary["speedup"] is not None
    assert re.search(r"\(reused: measured \d+ s before by an identical request\)$", summary["baseline_timing"])
    list(handlers.run(*run_args(draft="prompt-lookup", k=5, max_new_tokens=6, auto_baseline=True), second))
    assert calls[-1].plain                          # a session's own runs measure it again, back to back


def test_models_beyond_the_default_unload_once_idle_and_never_while_held():
    from ui.playground import limits
    from test_ui_limits import Loader, hold, make_registry
    now = [0.0]
    registry = make_registry(Loader(), max_extra=2, clock=lambda: now[0])
    registry._start_reaper = lambda: None          # no background thread: drop_idle is called here
    for name in ("default", "a", "b"):
        registry.get(name)
    hold(registry, "b")
    idle = limits.current().idle_unload_seconds
    now[0] = idle - 1
    assert registry.drop_idle() == []
    now[0] = idle
    assert registry.drop_idle() == ["a"]           # b is held, the default pinned
    assert registry.loaded_names() == ["default", "b"]
    registry.release("b")
    assert registry.drop_idle() == []              # just used: idle again from now
    now[0] += idle
    assert registry.drop_idle() == ["b"] and registry.loaded_names() == ["default"]


def test_a_waiter_abandoned_without_being_closed_gives_its_place_up():
    now = [0.0]
    gate = Gate(capacity=lambda: 1, clock=lambda: now[0])
    first = gate.enter(poll=0)
    with pytest.raises(StopIteration) as entered:
        next(first)
    abandoned, next_one = gate.enter(poll=0), gate.enter(poll=0)
    assert next(abandoned).position == 1 and next(next_one).position == 2
    gate.leave(entered.value.value)
    now[0] = coalesce.STALE_SECONDS + 1                # the abandoned one was never pulled again
    with pytest.raises(StopIteration):
        next(next_one)                                 # its turn: the stale place was given up
    assert gate.wait_line() == 0


def test_only_a_browser_on_this_machine_makes_the_timing_wait_for_its_drawing(monkeypatch):
    """The 1 s settle before the timed run lets a browser on the server's own cores finish drawing; a class of thirty
    through the API, or visitors whose browsers draw on their own machines, would wait 30 s for nothing."""
    from types import SimpleNamespace as NS
    local_page = NS(headers={"user-agent": "Mozilla/5.0"}, client=NS(host="127.0.0.1"))
    api = NS(headers={"x-gradio-user": "api"}, client=NS(host="127.0.0.1"))
    visitor = NS(headers={"user-agent": "Mozilla/5.0"}, client=NS(host="203.0.113.7"))
    assert handlers.settle_seconds(local_page) == handlers.SETTLE_SECONDS > 0
    assert handlers.settle_seconds(NS(headers={}, client=NS(host="::1"))) == handlers.SETTLE_SECONDS
    assert handlers.settle_seconds(NS(headers={}, client=NS(host="localhost"))) == handlers.SETTLE_SECONDS
    assert handlers.settle_seconds(None) == handlers.SETTLE_SECONDS          # called directly: as a local page
    assert handlers.settle_seconds(api) == 0.0 and handlers.settle_seconds(visitor) == 0.0
    monkeypatch.setattr(compute, "ZEROGPU", True)
    assert handlers.settle_seconds(local_page) == 0.0                        # no browser shares a ZeroGPU's GPU
