"""What may be shared between sessions (ui/playground/coalesce.py, state.py, handlers.decode): the key identical
requests share one computation by, the key a plain-decoding baseline is kept by, and when another session's
baseline is reused. Every field that changes a result must separate two keys; nothing else may. No model is loaded:
decode() is stopped at the moment it asks the coalescer for its computation."""
import dataclasses
from types import SimpleNamespace

import pytest

from ui.playground import coalesce, handlers
from ui.playground.coalesce import BaselineCache, Gate
from ui.playground.state import RunSettings, SessionState

BASE = RunSettings(target="smollm2-135m-instruct", draft="prompt-lookup", k=4, temperature=0.7, top_p=0.9, top_k=20,
                   max_new_tokens=32, seed=3, rule="exact", chat=True, prompt="Hello", skip_layers="",
                   exit_after=0)
# A changed value for every field of RunSettings.
CHANGED = dict(target="gemma-3-270m", draft="layer-skip", k=5, temperature=0.8, top_p=0.95, top_k=21,
               max_new_tokens=33, seed=4, rule="typical", chat=False, prompt="Hello!", skip_layers="3",
               exit_after=2)
PROMPT_IDS = (1, 2, 3)


class Joined(Exception):
    """decode() reached the coalescer: the test has the key it asked with."""


def sharing_key(monkeypatch, settings: RunSettings, auto_baseline: bool, prompt_ids=PROMPT_IDS):
    """The key handlers.decode joins the coalescer with, for a run of `settings` whose prompt encodes to
    `prompt_ids`."""
    keys = []

    class Spy:
        def join(self, key, session):
            keys.append(key)
            raise Joined

    def prepare(settings, state, registry, show_spaces=False, hold=False):
        return SimpleNamespace(prompt_ids=tuple(prompt_ids), work=None, held=[], record=None)
        yield                                                  # a generator, as runner.prepare is

    monkeypatch.setattr(coalesce, "COALESCER", Spy())
    monkeypatch.setattr(handlers.runner, "prepare", prepare)
    monkeypatch.setattr(handlers.runner, "release", lambda prep, registry: None)
    with pytest.raises(Joined):
        for _ in handlers.decode(settings, SessionState(), False, auto_baseline, settle=0.0):
            pass
    return keys[0]


def test_identical_requests_share_a_key(monkeypatch):
    again = dataclasses.replace(BASE)
    assert again is not BASE
    assert sharing_key(monkeypatch, BASE, True) == sharing_key(monkeypatch, again, True)


def test_the_speed_measurement_switch_separates_shared_computations(monkeypatch):
    """A run without the speed measurement yields no timed run and no baseline: a request that measures must not
    follow it (nor replay it)."""
    assert sharing_key(monkeypatch, BASE, True) != sharing_key(monkeypatch, BASE, False)


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_every_setting_separates_shared_computations(monkeypatch, field):
    assert set(CHANGED) == {f.name for f in dataclasses.fields(RunSettings)}
    changed = dataclasses.replace(BASE, **{field: CHANGED[field]})
    assert sharing_key(monkeypatch, BASE, True) != sharing_key(monkeypatch, changed, True)


def test_the_encoded_prompt_separates_shared_computations(monkeypatch):
    assert sharing_key(monkeypatch, BASE, True) != sharing_key(monkeypatch, BASE, True, prompt_ids=(1, 2, 4))


# ------------------------------------------------------------------------------------------ the baseline key

SAMPLED_SEPARATE = ("target", "temperature", "top_p", "top_k", "max_new_tokens", "seed")
NEVER_SEPARATE = ("draft", "k", "rule", "chat", "prompt", "skip_layers", "exit_after")   # the prompt: by its ids


@pytest.mark.parametrize("field", SAMPLED_SEPARATE)
def test_every_sampling_field_separates_sampled_baselines(field):
    changed = dataclasses.replace(BASE, **{field: CHANGED[field]})
    assert changed.baseline_key(PROMPT_IDS) != BASE.baseline_key(PROMPT_IDS)


@pytest.mark.parametrize("field", NEVER_SEPARATE)
def test_what_plain_decoding_ignores_shares_a_baseline(field):
    for settings in (BASE, dataclasses.replace(BASE, temperature=0.0)):
        changed = dataclasses.replace(settings, **{field: CHANGED[field]})
        assert changed.baseline_key(PROMPT_IDS) == settings.baseline_key(PROMPT_IDS)


def test_a_greedy_baseline_ignores_the_sampling_knobs_but_not_the_target_prompt_or_length():
    greedy = dataclasses.replace(BASE, temperature=0.0)
    for field in ("top_p", "top_k", "seed"):
        assert dataclasses.replace(greedy, **{field: CHANGED[field]}).baseline_key(PROMPT_IDS) == \
            greedy.baseline_key(PROMPT_IDS)
    for field in ("target", "max_new_tokens"):
        assert dataclasses.replace(greedy, **{field: CHANGED[field]}).baseline_key(PROMPT_IDS) != \
            greedy.baseline_key(PROMPT_IDS)
    assert greedy.baseline_key((1, 2)) != greedy.baseline_key(PROMPT_IDS)
    assert BASE.baseline_key((1, 2)) != BASE.baseline_key(PROMPT_IDS)
    assert greedy.baseline_key(PROMPT_IDS) != BASE.baseline_key(PROMPT_IDS)
    assert greedy.baseline_key(PROMPT_IDS) == ("smollm2-135m-instruct", PROMPT_IDS, 0.0, 0, 1.0, 0, 32)


# ------------------------------------------------------------------------------ reusing another session's baseline

KEY = BASE.baseline_key(PROMPT_IDS)


@pytest.fixture
def clocked(monkeypatch):
    """A fresh gate and baseline cache on a clock the test moves; a baseline measured by session 1 at t = 1000."""
    now = [1000.0]
    gate = Gate(capacity=lambda: 1, clock=lambda: now[0])
    cache = BaselineCache(clock=lambda: now[0], fresh_seconds=300.0)
    monkeypatch.setattr(coalesce, "GATE", gate)
    monkeypatch.setattr(coalesce, "BASELINES", cache)
    cache.put(KEY, "plain decoding", session=1, under_load="measured under load: 2")
    return SimpleNamespace(now=now, gate=gate, cache=cache)


def take_turn(gate):
    entering = gate.enter(poll=0)
    with pytest.raises(StopIteration) as turn:
        next(entering)
    return turn.value.value


def test_a_baseline_is_reused_only_while_others_wait_at_the_gate(clocked):
    assert coalesce.reusable_baseline(KEY, 2) is None                 # nobody decodes, nobody waits
    ticket = take_turn(clocked.gate)
    assert clocked.gate.busy == 1 and clocked.gate.wait_line() == 0
    assert coalesce.reusable_baseline(KEY, 2) is None                 # busy, but nobody waits
    waiter = clocked.gate.enter(poll=0)
    next(waiter)
    assert clocked.gate.wait_line() == 1
    assert coalesce.reusable_baseline(KEY, 2) == ("plain decoding", 1000.0, "measured under load: 2")
    assert coalesce.reusable_baseline(KEY, 1) is None                 # a session's own: measured again
    assert coalesce.reusable_baseline(dataclasses.replace(BASE, seed=9).baseline_key(PROMPT_IDS), 2) is None
    waiter.close()
    assert coalesce.reusable_baseline(KEY, 2) is None                 # the line emptied
    clocked.gate.leave(ticket)


def test_a_baseline_is_reused_only_while_fresh(clocked):
    take_turn(clocked.gate)
    waiter = clocked.gate.enter(poll=0)
    next(waiter)
    clocked.now[0] = 1300.0
    assert coalesce.reusable_baseline(KEY, 2) is not None            # exactly fresh_seconds old: still fresh
    clocked.now[0] = 1300.5
    assert coalesce.reusable_baseline(KEY, 2) is None
    waiter.close()


def test_the_cache_keeps_the_newest_measurement_and_a_bounded_number(clocked):
    clocked.cache.put(KEY, "again", session=3, at=1100.0)
    assert clocked.cache.fresh(KEY, 2) == ("again", 1100.0, None)
    assert clocked.cache.fresh(KEY, 3) is None
    for n in range(coalesce.MAX_BASELINES + 1):
        clocked.cache.put(("other", n), n, session=4)
    assert len(clocked.cache.entries) == coalesce.MAX_BASELINES and KEY not in clocked.cache.entries
    assert ("other", 0) not in clocked.cache.entries and clocked.cache.fresh(("other", 1), 2)[0] == 1


def test_a_baseline_measured_again_is_the_newest_and_outlives_older_ones(clocked):
    clocked.cache.put(("a",), "a", session=4)
    clocked.cache.put(KEY, "again", session=3)
    for n in range(coalesce.MAX_BASELINES - 1):
        clocked.cache.put(("other", n), n, session=4)
    assert ("a",) not in clocked.cache.entries and clocked.cache.fresh(KEY, 2)[0] == "again"
