"""The batched engine (core/batch.py, core/packed.py) and the drafter-invariant rule, on tiny models.

What must hold: a sequence in a batch gets the tokens it gets alone (greedy), whatever else shares the batch and
however the batch sizes its drafts; a row never sees another sequence's cache (a planted leak is caught); sampled
sequences in a batch follow the target's distribution (chi-square, false-failure odds ALPHA per test); under rule
"invariant" a seed fixes the text: alone, in any batch, and as plain decoding of that seed.
"""
import pytest
import torch

import spec_engine as se
from spec_engine.core import packed
from spec_engine.core.batch import BatchCosts, BatchDecoder, Request, draft_caps
from spec_engine.core.rule import invariant_step, position_noise, race
from spec_engine.drafters.eagle import random_eagle_drafter
from test_statistical import ALPHA, exact_joint, chi_square_pvalue
from tiny import tiny_llama

VOCAB = 40
GREEDY = se.SamplingParams(0.0)
PROMPTS = [[1], [1, 2], [3, 4, 5], [1, 2, 3, 1, 2], [7, 8, 9, 7, 8, 9, 7, 8], [4, 4, 4, 4], [2, 5, 2, 5, 2, 5],
           [9, 1, 9, 1, 9, 1, 9]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=VOCAB, layers=2, seed=1)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(vocab=VOCAB, layers=1, seed=2)


def mixed_drafter(i: int, draft_model):
    """Chains and trees, deterministic and sampled drafts, side by side in one batch."""
    kinds = [lambda: se.PromptLookupDrafter(), lambda: se.ModelDrafter(draft_model), lambda: se.TreeLookupDrafter(),
             lambda: se.ModelTreeDrafter(draft_model)]
    return kinds[i % len(kinds)]()


def ids(prompt):
    return torch.tensor([prompt])


def alone(target, draft_model, sampling=GREEDY, rule="exact", tokens=20, seed=0):
    return [se.SpeculativeDecoder(target, mixed_drafter(i, draft_model), rule).generate(
        ids(p), k=3, max_new_tokens=tokens, sampling=sampling, seed=seed + i).tokens for i, p in enumerate(PROMPTS)]


def batched(target, draft_model, mode, sampling=GREEDY, rule="exact", tokens=20, seed=0, order=None, costs=None):
    order = order or list(range(len(PROMPTS)))
    batch = BatchDecoder(target, draft_length=mode, costs=costs)
    results = batch.run([Request(i, ids(PROMPTS[i]), mixed_drafter(i, draft_model), k=3, max_new_tokens=tokens,
                                 sampling=sampling, seed=seed + i, rule=rule) for i in order])
    return [results[i].tokens for i in range(len(PROMPTS))]


FLAT = BatchCosts([1, 2048], [1.0, 1.0])                 # rows are free: every draft pays
LINEAR = BatchCosts([1, 2048], [1.0, 2048.0])             # a row costs a step: no draft pays


@pytest.mark.parametrize("mode,costs", [("fixed", None), ("off", None), ("adaptive", FLAT), ("adaptive", LINEAR)])
def test_greedy_in_a_batch_gives_the_tokens_alone_gives(target, draft_model, mode, costs):
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=20, sampling=GREEDY).tokens for p in PROMPTS]
    assert alone(target, draft_model) == plain
    assert batched(target, draft_model, mode, costs=costs) == plain


def test_requests_join_a_running_batch_and_leave_when_done(target, draft_model):
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=12 + i, sampling=GREEDY).tokens
             for i, p in enumerate(PROMPTS)]
    batch, sizes = BatchDecoder(target, draft_length="fixed"), []
    for i in range(4):
        batch.add(Request(i, ids(PROMPTS[i]), mixed_drafter(i, draft_model), k=3, max_new_tokens=12 + i,
                              sampling=GREEDY))
    pending = list(range(4, len(PROMPTS)))
    while batch.active:
        events = batch.step()
        sizes.append(batch.active)
        if pending and len(sizes) % 2 == 0:                                     # joins every other round
            i = pending.pop(0)
            batch.add(Request(i, ids(PROMPTS[i]), mixed_drafter(i, draft_model), k=3, max_new_tokens=12 + i,
                              sampling=GREEDY))
        assert all(e.event.target_cache_len == e.event.committed_len - 1 for e in events)
    assert not pending and [batch.finished[i].tokens for i in range(len(PROMPTS))] == plain


def test_a_row_that_sees_another_sequences_cache_is_caught(target, draft_model, monkeypatch):
    """The planted bug: every sequence's queries also see the first sequence's cached keys."""
    honest = packed.attend

    def leaky(attn, products, x, cos, sin, segments, bounds, masks):
        first = segments[0].cache

        class Leak:
            def __init__(self, own):
                self.own = own

            def update(self, key, value, layer):
                keys, values = self.own.update(key, value, layer)
                if self.own is first:
                    return keys, values
                other = first.layers[layer]
                return torch.cat([other.keys, keys], dim=2), torch.cat([other.values, values], dim=2)
        def held(cache):                                                  # this layer's length before its update
            return cache.layers[attn.layer_idx].get_seq_length() if attn.layer_idx < len(cache.layers) else 0
        leaked = [packed.Segment(s.tokens, Leak(s.cache), s.keep, s.parents, s.depths) for s in segments]
        extra = held(first) + len(segments[0].tokens)
        wide = [m if s.cache is first else torch.cat(
                    [torch.ones(len(s.tokens), extra, dtype=torch.bool),
                     torch.ones(len(s.tokens), held(s.cache) + len(s.tokens), dtype=torch.bool).tril(held(s.cache))
                     if m is None else m], 1)
                for s, m in zip(segments, masks)]
        return honest(attn, products, x, cos, sin, leaked, bounds, wide)
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=20, sampling=GREEDY).tokens for p in PROMPTS]
    monkeypatch.setattr(packed, "attend", leaky)
    assert batched(target, draft_model, "off") != plain


def test_sampled_sequences_in_a_batch_follow_the_target():
    model = tiny_llama(vocab=5, layers=1, seed=3)
    draft = tiny_llama(vocab=5, layers=1, seed=4)
    params = se.SamplingParams(temperature=1.0)
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    joint = exact_joint(model, prompt, params)
    samples = []
    for start in range(0, 1500, 50):
        batch = BatchDecoder(model, draft_length="fixed")
        requests = [Request(s, prompt, se.ModelDrafter(draft) if s % 2 else se.PromptLookupDrafter(), k=2,
                            max_new_tokens=3, sampling=params, seed=s) for s in range(start, start + 50)]
        samples += [tuple(r.tokens) for r in batch.run(requests).values()]
    assert chi_square_pvalue(samples, joint) > ALPHA


def test_the_race_draws_from_p_and_a_wrong_race_is_rejected():
    from scipy.stats import chisquare
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 4000
    counts = torch.zeros(5)
    wrong = torch.zeros(5)
    for seed in range(n):
        noise = position_noise(seed, [7], 5)[0]
        counts[race(p, noise)] += 1
        wrong[race(p ** 2, noise)] += 1
    assert counts[4] == 0
    assert chisquare(counts[:4].tolist(), (p[:4] * n).tolist()).pvalue > ALPHA
    assert chisquare(wrong[:4].tolist(), (p[:4] * n).tolist()).pvalue < ALPHA


def test_invariant_step_keeps_drafts_equal_to_the_race():
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]], dtype=torch.float64)
    noise = torch.tensor([[1.0, 5.0], [1.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    own = [race(p[i], noise[i]) for i in range(3)]                      # [0, 1, 1]
    assert own == [0, 1, 1]
    assert invariant_step(p, [0, 1], noise) == (2, 1)
    assert invariant_step(p, [0, 0], noise) == (1, 1)
    assert invariant_step(p, [1, 1], noise) == (0, 0)


def test_a_seed_fixes_the_text_under_the_invariant_rule(target, draft_model):
    """8 seeded sampled requests: alone (each drafter, k = 3), in batches of other orders and draft sizings, and
    plain decoding of that seed all give the same text."""
    params = se.SamplingParams(temperature=0.9, top_p=0.95)
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=20, sampling=params, seed=100 + i,
                                        invariant=True).tokens for i, p in enumerate(PROMPTS)]
    assert alone(target, draft_model, params, "invariant", seed=100) == plain
    for mode, order, costs in [("fixed", None, None), ("adaptive", [7, 3, 5, 1, 0, 2, 6, 4], FLAT),
                               ("adaptive", None, LINEAR)]:
        assert batched(target, draft_model, mode, params, "invariant", seed=100, order=order, costs=costs) == plain
    assert len({tuple(t) for t in plain}) > 1


def test_under_the_exact_rule_the_batch_can_change_a_sampled_text(target, draft_model):
    """Why the invariant rule exists: the exact rule's draws follow the draft lengths, which a batch sizes."""
    params = se.SamplingParams(temperature=1.0)
    fixed = batched(target, draft_model, "fixed", params, seed=100)
    assert batched(target, draft_model, "off", params, seed=100) != fixed


@pytest.mark.parametrize("costs", [FLAT, LINEAR])
def test_under_the_exact_rule_a_sampled_request_keeps_its_lone_text_in_an_adaptive_batch(target, draft_model, costs):
    """The batch leaves a sampled exact-rule sequence's draft lengths to its drafter (BatchDecoder.pinned): a seed
    fixes its text in any batch, whether the costs make the batch want every draft (FLAT) or none (LINEAR). Unpinned,
    LINEAR's caps of 0 give other texts (the test above), so this one can fail."""
    params = se.SamplingParams(temperature=1.0)
    lone = alone(target, draft_model, params, seed=100)
    assert batched(target, draft_model, "adaptive", params, seed=100, costs=costs) == lone
    shuffled = [5, 2, 7, 0, 1, 6, 3, 4]
    assert batched(target, draft_model, "adaptive", params, seed=100, costs=costs, order=shuffled) == lone


def test_draft_caps_follow_the_cost_of_rows():
    limits = [4, 4, 4]
    flat = draft_caps([0.8, 0.8, 0.8], [0.0] * 3, limits, lambda rows: 1.0)
    assert flat == limits
    linear = draft_caps([0.8, 0.8, 0.8], [0.0] * 3, limits, lambda rows: float(rows))
    assert linear == [0, 0, 0]
    # a step that costs 1 plus 0.1 per row beyond the batch: the likelier sequence gets more drafts
    mixed = draft_caps([0.9, 0.2, 0.6], [0.0] * 3, limits, lambda rows: 1.0 + 0.1 * (rows - 3))
    assert mixed[0] >= mixed[2] >= mixed[1] and mixed[0] > 0 and mixed[1] == 0


def test_a_sequences_fixed_cost_of_drafting_at_all_is_paid_before_its_first_draft():
    """Drafting at all costs a sequence its drafter's catch-up and a heavier verification each round (fixed): with
    rows nearly free, a fixed cost no draft's gain covers leaves that sequence plain, and a small one changes nothing.
    The rate each plan is judged by counts the fixed cost once per drafting sequence, not per draft."""
    limits = [4, 4, 4]
    step = lambda rows: 1.0 + 0.01 * (rows - 3)                                                     # noqa: E731
    assert draft_caps([0.8] * 3, [0.0] * 3, limits, step, [0.0] * 3) == limits
    assert draft_caps([0.8] * 3, [0.0] * 3, limits, step, [0.001] * 3) == limits
    costly = draft_caps([0.8, 0.8, 0.8], [0.0] * 3, limits, step, [0.0, 5.0, 0.0])
    assert costly[1] == 0 and costly[0] == costly[2] == 4
    assert draft_caps([0.8] * 3, [0.0] * 3, limits, step, [5.0] * 3) == [0, 0, 0]


def test_a_member_learns_the_extra_host_seconds_of_a_drafting_round():
    from types import SimpleNamespace
    from spec_engine.core.batch import Member
    member = Member(None, None, None)
    member.learn(SimpleNamespace(drafted=[], accepted=0, correction=None, draft_seconds=0.0), 0.002)
    assert member.plain_host == pytest.approx(0.002) and member.drafting_extra == 0.0
    member.learn(SimpleNamespace(drafted=[1, 2], accepted=1, correction=3, draft_seconds=0.004), 0.009)
    assert member.drafting_extra == pytest.approx(0.003)                  # 9 ms - 4 ms of drafts - 2 ms plain
    assert member.draft_seconds == pytest.approx(0.002)
    member.learn(SimpleNamespace(drafted=[1], accepted=1, correction=None, draft_seconds=0.001), 0.003)
    assert member.drafting_extra == pytest.approx(0.9 * 0.003)            # 0 ms extra this round, decayed in


def test_a_sequence_given_no_drafts_for_its_low_estimate_is_tried_again_later(target):
    """A round without drafts brings no evidence of acceptance, so the estimate ages toward the prior instead of
    holding: a sequence whose early drafts were refused (estimate 0.2, too low for any plan to pay here) is given
    drafts again after some plain rounds. Held as it was, the sizing never gave it a draft again, however
    predictable its text became. Rows up to 2 cost 1, each more 0.15: drafts pay from an acceptance of ~0.45."""
    from types import SimpleNamespace
    from spec_engine.core.batch import ACCEPT_PRIOR
    costs = BatchCosts([1, 2, 64], [1.0, 1.0, 1.0 + 0.15 * 62])
    batch = BatchDecoder(target, draft_length="adaptive", costs=costs)
    for i, p in enumerate(PROMPTS[3:5]):
        batch.add(Request(i, ids(p), se.PromptLookupDrafter(), k=3, max_new_tokens=64, sampling=GREEDY))
    while any(m.prefilling for m in batch.members.values()):
        batch.step()
    members = [batch.members[0], batch.members[1]]
    assert batch.caps(members) != [0, 0]                             # at the prior's 0.75 both draft
    for member in members:
        member.kept, member.refused = 1.0, 4.0
    assert batch.caps(members) == [0, 0]
    plain_round = SimpleNamespace(drafted=[], accepted=0, correction=None, draft_seconds=0.0)
    assert batch.prior == ACCEPT_PRIOR                               # no draft in this batch yet
    estimates, plain_rounds = [members[0].acceptance], 0
    while batch.caps(members) == [0, 0] and plain_rounds < 40:
        for member in members:
            member.learn(plain_round, 0.001, batch.prior)
        estimates.append(members[0].acceptance)
        plain_rounds += 1
    assert 5 <= plain_rounds <= 20, plain_rounds                      # 10 here
    assert estimates == sorted(estimates) and estimates[-1] < ACCEPT_PRIOR[0] / sum(ACCEPT_PRIOR)
    members[0].learn(SimpleNamespace(drafted=[5, 6, 7], accepted=0, correction=8, draft_seconds=0.0), 0.001)
    assert members[0].acceptance < estimates[-1]                      # a drafted round's evidence still counts
    # Where the batch's own drafts kept little (3 kept, 9 refused: 0.32 with the prior's weight), a sequence's
    # estimate ages toward that, not toward 0.75, and no plan pays again.
    batch.kept, batch.refused = 3.0, 9.0
    assert sum(batch.prior) == pytest.approx(sum(ACCEPT_PRIOR)) and batch.prior[0] / sum(batch.prior) < 0.33
    for member in members:
        member.kept, member.refused = 1.0, 4.0
    for _ in range(40):
        for member in members:
            member.learn(plain_round, 0.001, batch.prior)
    assert batch.caps(members) == [0, 0] and 0.3 < members[0].acceptance < 0.33


def test_a_batch_counts_every_sequences_drafts_kept_and_refused(target, draft_model):
    """BatchDecoder.prior comes from every drafted round of the batch: its kept drafts and its corrections."""
    batch = BatchDecoder(target, draft_length="fixed")
    seen = {"kept": 0.0, "refused": 0.0}
    for i, p in enumerate(PROMPTS[:4]):
        batch.add(Request(i, ids(p), mixed_drafter(i, draft_model), k=3, max_new_tokens=16, sampling=GREEDY))
    while batch.active:
        for e in batch.step():
            if e.event.drafted:
                seen["kept"] += e.event.accepted
                seen["refused"] += e.event.correction is not None
    assert seen["kept"] > 0 and seen["refused"] > 0
    assert (batch.kept, batch.refused) == (seen["kept"], seen["refused"])


def test_batch_costs_are_one_sequences_rows_plus_the_sequences_overhead():
    """predict(S, R) = P(R) + O(S): P interpolated between its row points, O(S) what S sequences of one row each
    cost beyond P(S), interpolated between its sequence points (never below 0)."""
    costs = BatchCosts([1, 8, 9, 16], [1.0, 1.0, 2.0, 2.5], [1, 4, 8], [1.0, 1.5, 3.0])
    assert costs.overhead == [0.0, 0.5, 2.0]
    assert costs.predict(1, 1) == 1.0 and costs.predict(1, 12) == pytest.approx(2.0 + 0.5 * 3 / 7)
    assert costs.predict(4, 8) == 1.5 and costs.predict(4, 9) == 2.5            # the step at 9 rows, any batch
    assert costs.predict(8, 9) == 4.0 and costs.predict(6, 6) == pytest.approx(1.0 + 1.25)
    assert BatchCosts([1, 4], [2.0, 2.0], [1, 4], [2.0, 1.0]).overhead == [0.0, 0.0]


def test_the_caps_see_past_a_forwards_step_where_its_row_tiles_end():
    """A forward's time has steps where the kernels' row tiles end (8 and 16 rows on the 2-core EPYC): the draft
    that crosses one costs the step, the next ones little. At 4 sequences of acceptance 0.8 with the forward 1.0 up
    to 8 rows, 1.3 up to 16 and 3.0 beyond, 3 drafts each (16 rows) give 9.1 tokens a unit of time, 1 each 7.2: the
    caps must not stop at the step (adding drafts only while each raises the rate stopped at 1 each)."""
    costs = BatchCosts([1, 8, 9, 16, 17, 64], [1.0, 1.0, 1.3, 1.3, 3.0, 3.0])
    assert draft_caps([0.8] * 4, [0.0] * 4, [4] * 4, lambda rows: costs.predict(4, rows)) == [3, 3, 3, 3]
    # a sequence that is a poor bet fills a slot below the step only when nothing better does
    caps = draft_caps([0.8, 0.8, 0.8, 0.1], [0.0] * 4, [4] * 4, lambda rows: costs.predict(4, rows))
    assert sum(caps) <= 12 and caps[3] <= 1 and min(caps[:3]) >= 3
    # and where even the rows below the step do not pay, nothing drafts
    assert draft_caps([0.05] * 4, [0.0] * 4, [4] * 4, lambda rows: 1.0 + rows) == [0, 0, 0, 0]


def test_a_plan_with_drafts_must_promise_the_margin_over_plain_decoding():
    """The sizing's estimates err toward drafting (it gives drafts to the sequences whose acceptance estimate is high
    that round, so what it picks is over-estimated: at 8 sequences on the EPYC its plans promised 1-3% over plain and
    delivered x0.80), so a plan with drafts is taken only when it promises DRAFT_MARGIN more tokens per second. Two
    sequences of acceptance 0.5, a draft row costing c: one draft each promises 3 / (1 + 2c) tokens a second against
    plain's 2, +5% at c = 0.214 and +20% at c = 0.125."""
    from spec_engine.core.batch import DRAFT_MARGIN
    assert DRAFT_MARGIN > 1.05
    near = lambda rows: 1.0 + 0.214 * (rows - 2)                                                    # noqa: E731
    assert draft_caps([0.5] * 2, [0.0] * 2, [1, 1], near) == [0, 0]
    assert draft_caps([0.5] * 2, [0.0] * 2, [1, 1], near, margin=1.0) == [1, 1]
    assert draft_caps([0.5] * 2, [0.0] * 2, [1, 1], lambda rows: 1.0 + 0.125 * (rows - 2)) == [1, 1]


def test_the_tokens_of_sequences_the_sizing_does_not_size_count_in_the_rate():
    """`other_tokens`: the forward also scores sequences whose caps are not sized here (pinned ones, joiners). Their
    rows are in forward_seconds, so their tokens must be in the rate too; left out, every draft looks better than it
    is. One sequence beside three others of one token each, the forward 1.0 up to 4 rows and 1.5 beyond: three
    drafts buy 1.73 tokens for 0.5, worth it to the one sequence alone (1.82 tokens a unit against 1) and not to the
    forward's four (3.82 against 4)."""
    forward = lambda rows: 1.0 if rows + 3 <= 4 else 1.5                                            # noqa: E731
    assert draft_caps([0.75], [0.0], [3], forward, other_tokens=3.0) == [0]
    assert draft_caps([0.75], [0.0], [3], forward) == [3]           # the others' tokens left out: it drafts


def test_sequences_still_prefilling_are_priced_into_the_batchs_drafts(target):
    """Sequences whose prompts are still going in decode from the next round: the drafts sized now begin drafters
    for the batch as it will run, so their rows and tokens are priced in (a batch of 16 whose first 6 had their
    prompts in drafted, and began 6 drafters, into a forward that was nearly free only until the rest joined). Rows
    up to 4 cost 1, more cost 3: two sequences alone draft; the same two with two more about to join do not."""
    costs = BatchCosts([1, 4, 5, 64], [1.0, 1.0, 3.0, 3.0])

    def decoding_caps(count):
        batch = BatchDecoder(target, draft_length="adaptive", costs=costs)
        for i, p in enumerate(PROMPTS[3:3 + count]):
            batch.add(Request(i, ids(p), se.PromptLookupDrafter(), k=3, max_new_tokens=16, sampling=GREEDY))
        while any(m.prefilling for m in batch.members.values()):
            batch.step()
        return batch.caps([batch.members[0], batch.members[1]])     # members 2, 3 counted as joining, if any
    assert sum(decoding_caps(2)) > 0
    assert decoding_caps(4) == [0, 0]


def test_a_drafters_begin_is_priced_by_its_kinds_begins_spread_over_the_rounds_left(target):
    """A sequence whose drafter has not begun is priced by what its drafter kind's begins took here a prompt row
    (BatchCosts.begin_row, learnt from the batches' catch-ups that began a drafter), spread over the rounds it has
    left: a fresh sequence begins its drafter and one about to finish does not (at 16 sequences the tail's late
    begins cost ~5 ms each for one or two rounds of drafts). A kind never timed begins for free, as before."""
    from spec_engine.core.batch import Deferred
    costs = BatchCosts([1, 64], [0.01, 0.01])                       # rows are free: only the begin can stop a draft
    name = se.PromptLookupDrafter().name
    assert costs.begin_row(name) == 0.0
    costs.learn_begin(name, 0.001)
    costs.learn_begin(name, float("nan"))
    assert costs.begin_row(name) == 0.001 and costs.begin_row("other") == 0.0
    batch = BatchDecoder(target, draft_length="adaptive", costs=costs)
    for i in range(2):
        batch.add(Request(i, ids([1]), se.PromptLookupDrafter(), k=3, max_new_tokens=64, sampling=GREEDY))
    members = [batch.members[0], batch.members[1]]
    for member in members:
        assert isinstance(member.decoder.drafter, Deferred)
        member.decoder.drafter.starting = (list(range(100)), None)   # a 100-token prompt waits for its begin
    assert members[0].resume_seconds(0.001) == pytest.approx(0.001 * 100 / (64 / 1.75), rel=0.01)  # over ~37 rounds
    assert batch.caps(members)[0] > 0
    for member in members:
        member.state.max_new_tokens = 2                               # two tokens left: about one round
    assert members[0].resume_seconds(0.001) == pytest.approx(0.001 * 100 / (2 / 1.75), rel=0.01)
    assert batch.caps(members) == [0, 0]
    costs.begins.clear()                                             # a kind never timed: its begin is free
    assert batch.caps(members) != [0, 0]


def test_a_batch_learns_its_drafters_begins_a_prompt_row(target):
    """The catch-up that begins a drafter is timed into BatchCosts.begin_row of its kind: rows then cost what the
    begins took (here a begin that sleeps 50 ms over a 5-token prompt: ~10 ms a row)."""
    import time

    class SlowBegin(se.PromptLookupDrafter):
        def begin(self, prompt_ids, target_features=None):
            time.sleep(0.05)
            super().begin(prompt_ids, target_features)

    costs = BatchCosts([1, 2048], [1.0, 1.0])
    batch = BatchDecoder(target, draft_length="adaptive", costs=costs)
    for i in range(2):
        batch.add(Request(i, ids(PROMPTS[3]), SlowBegin(), k=3, max_new_tokens=8, sampling=GREEDY))
    batch.run([])
    assert 0.05 / 10 <= costs.begin_row(SlowBegin().name) <= 0.05 / 4 * 1.5   # 5 prompt rows and a few more each


def test_measured_batch_costs_follow_the_forwards_the_batch_times():
    """A measured batch size's level moves toward what its forwards took (the host drifts, and the batch's caches are
    not the measured ones), the nearest sequence count only, and P's steps stay: after a batch of 8 has run 8-row
    forwards slower than predicted, a ninth row still costs its step. Costs given by hand (the tests' FLAT and
    LINEAR) stay as given."""
    costs = BatchCosts([1, 8, 9, 16], [1.0, 1.0, 1.5, 2.0], [1, 8, 32], [1.0, 1.2, 3.0], corrected=True)
    measured = BatchCosts([1, 8, 9, 16], [1.0, 1.0, 1.5, 2.0], [1, 8, 32], [1.0, 1.2, 3.0])
    for _ in range(100):
        costs.observe(8, 8, 2.0)                                # 8 sequences of one row each: predicted 1.2, took 2.0
    assert costs.predict(8, 8) == pytest.approx(2.0, rel=0.01)
    assert costs.predict(8, 9) - costs.predict(8, 8) == pytest.approx(0.5)      # the step is where it was
    assert costs.predict(1, 1) == 1.0 and costs.predict(32, 40) == measured.predict(32, 40)   # other counts as were
    costs.observe(8, 8, 0.0)
    costs.observe(8, 8, float("nan"))
    assert costs.predict(8, 8) == pytest.approx(2.0, rel=0.01)
    for _ in range(100):
        costs.observe(7, 10, 0.5)                               # nearest sequence count: 8; faster than measured
    assert 0 < costs.predict(8, 8) < 1.0
    given = BatchCosts([1, 8, 9, 16], [1.0, 1.0, 1.5, 2.0], [1, 8], [1.0, 1.2])
    given.observe(8, 8, 2.0)
    assert given.predict(8, 8) == pytest.approx(1.2)


def test_measured_batch_costs_time_every_row_count_and_sequence_count(target):
    """`measure` times one sequence at every row count asked and each sequence count at one row each; its
    prediction at a timed sequence count's own rows is what that forward took (O(S) + P(S) = the forward)."""
    costs = BatchCosts.measure(target, sequences=(1, 2, 4), rows=(1, 2, 3, 4, 6, 8), context=8, repeats=1)
    assert costs.rows == [1, 2, 3, 4, 6, 8] and all(t > 0 for t in costs.row_seconds)
    assert costs.sequences == [1, 2, 4] and all(o >= 0 for o in costs.overhead)
    assert costs.corrected
    # one sequence's prediction at a timed row count is that forward's time (O(1) is 0: S = 1 is P's own point)
    assert [costs.predict(1, r) for r in costs.rows] == costs.row_seconds


def test_an_adaptive_batch_times_its_packed_forwards_into_its_costs(target):
    """Every packed forward of an adaptive batch corrects its costs; a fixed batch's do not."""
    seen = []

    class Seen(BatchCosts):
        def observe(self, sequences, total_rows, seconds):
            seen.append((sequences, total_rows, seconds))
            super().observe(sequences, total_rows, seconds)

    costs = Seen([1, 2048], [1.0, 1.0], corrected=True)
    batch = BatchDecoder(target, draft_length="adaptive", costs=costs)
    for i, p in enumerate(PROMPTS[3:5]):
        batch.add(Request(i, ids(p), se.PromptLookupDrafter(), k=3, max_new_tokens=8, sampling=GREEDY))
    rounds = []
    while batch.active:
        events = batch.step()
        if events:
            rounds.append((events[0].batch_size, events[0].rows))
    assert [(s, r) for s, r, _ in seen] == rounds and all(seconds > 0 for *_, seconds in seen)
    assert costs.shift != [0.0]                                 # real forwards take milliseconds, not the 1.0 given
    # a fixed batch sharing the costs leaves them alone: its forwards are not what the sizing prices
    seen.clear()
    BatchDecoder(target, draft_length="fixed", costs=costs).run(
        [Request(i, ids(p), se.PromptLookupDrafter(), k=3, max_new_tokens=8, sampling=GREEDY)
         for i, p in enumerate(PROMPTS[3:5])])
    assert seen == []


def test_a_bad_request_names_itself(target):
    batch = BatchDecoder(target)
    with pytest.raises(ValueError, match="request 'x': k"):
        batch.add(Request("x", ids([1, 2]), se.PromptLookupDrafter(), k=0))
    batch.add(Request("y", ids([1, 2]), se.PromptLookupDrafter()))
    with pytest.raises(ValueError, match="already decoding"):
        batch.add(Request("y", ids([1, 2]), se.PromptLookupDrafter()))
    with pytest.raises(ValueError, match="draft_length"):
        BatchDecoder(target, draft_length="sometimes")
    batch.cancel("y")
    assert batch.finished["y"].stop_reason == "cancelled" and not batch.active


def test_on_the_speed_layer_a_packed_row_gets_its_lone_numbers_bit_for_bit():
    """The compiled layers (accel/native_layers.py run_packed) compute each row as a lone forward does, whatever the
    other sequences' rows: chains of 1-4 rows and a tree, after caches of different lengths. Where that path does not
    run (SPEC_ENGINE_ACCEL=0, no compiler), the generic packed loop's products are padded differently and only
    close: then this asserts closeness (the greedy identity tests above hold the tokens)."""
    import copy
    from spec_engine.accel import lean_llama, native_layers
    from spec_engine.core.cache import forward_logits, forward_tree_logits, new_cache, prefill
    model = tiny_llama(vocab=VOCAB, layers=2, seed=5, hidden=64)    # head_dim 16: the compiled layers take it
    caches = []
    for length in (3, 9, 17, 30, 5):
        cache = new_cache(model)
        prefill(model, list(range(1, length + 1)), cache)
        caches.append(cache)
    segments = [packed.Segment([4], caches[0], 1), packed.Segment([4, 5], caches[1], 2),
                packed.Segment([6, 7, 8, 9], caches[2], 4), packed.Segment([1], caches[3], 1),
                packed.Segment([2, 3, 4, 5], caches[4], 4, parents=[-1, -1, 0], depths=[1, 1, 2])]
    lone = []
    for segment in segments:
        cache = copy.deepcopy(segment.cache)
        if segment.parents is None:
            lone.append(forward_logits(model, segment.tokens, cache, segment.keep))
        else:
            lone.append(forward_tree_logits(model, segment.tokens[0], segment.tokens[1:], segment.parents,
                                            segment.depths, cache))
    together = packed.forward_packed(model, segments)
    bitwise = se.speed_layer() != "off" and native_layers.library() is not None
    assert not bitwise or native_layers.Stack.qualifies(model.model, lean_llama.lean_layers(model),
                                                        native_layers.library())
    for alone, batched_row in zip(lone, together):
        if bitwise:
            assert torch.equal(alone, batched_row)
        else:
            torch.testing.assert_close(alone, batched_row, rtol=1e-5, atol=1e-5)
    assert [packed.cache_len(s.cache) for s in segments] == [4, 11, 21, 31, 9]


def test_a_batch_of_many_rows_keeps_lone_numbers_whatever_kernel_the_plan_picks_for_blocks(monkeypatch):
    """A batch of 20 sequences feeds 20 rows, past the per-row-count plans (cpu_gemm.MAX_ROWS); a machine's plan may
    pick F.linear for such blocks (measured so on an AVX-512 EPYC), whose rows differ from a one-row product in the
    last bits. The packed forward must still give every row its lone numbers: planted here, that plan for every
    weight, and each sequence's logits compared with its lone one-token forward's."""
    import copy
    from spec_engine.accel import cpu_gemm, native_layers
    from spec_engine.core.cache import forward_logits, new_cache, prefill
    model = tiny_llama(vocab=VOCAB, layers=2, seed=6, hidden=64)
    if se.speed_layer() == "off" or native_layers.library() is None:
        pytest.skip("the speed layer's compiled kernels are not in use")
    for linear in model.modules():
        if isinstance(linear, cpu_gemm.PackedLinear):
            monkeypatch.setitem(cpu_gemm._PLANS, cpu_gemm.plan_key(linear),
                                ("linear",) + ("blocked",) * cpu_gemm.MAX_ROWS + ("linear",))
    caches = []
    for length in range(2, 22):
        cache = new_cache(model)
        prefill(model, [(7 * length + i) % VOCAB for i in range(length)], cache)
        caches.append(cache)
    segments = [packed.Segment([i % VOCAB], cache, 1) for i, cache in enumerate(caches)]
    lone = [forward_logits(model, s.tokens, copy.deepcopy(s.cache), 1) for s in segments]
    together = packed.forward_packed(model, segments)
    assert all(torch.equal(a, b) for a, b in zip(lone, together))


def test_a_seed_fixes_the_text_in_concurrent_lone_runs(target, draft_model):
    """The same 8 seeded sampled requests run concurrently as lone runs (the app's way: one decoder each): their
    streams interleaved round by round in one thread, and each in its own thread; under the invariant rule every
    text is plain decoding's of that seed, as alone and in a batch (test above)."""
    import threading
    params = se.SamplingParams(temperature=0.9, top_p=0.95)
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=20, sampling=params, seed=100 + i,
                                        invariant=True).tokens for i, p in enumerate(PROMPTS)]

    def stream(i):
        decoder = se.SpeculativeDecoder(target, mixed_drafter(i, draft_model), "invariant")
        return decoder.stream(ids(PROMPTS[i]), k=1 + i % 4, max_new_tokens=20, sampling=params, seed=100 + i)
    texts = [[] for _ in PROMPTS]
    running = {i: stream(i) for i in range(len(PROMPTS))}
    while running:                                                  # one round of each run in turn
        for i, events in list(running.items()):
            event = next(events, None)
            if event is None:
                del running[i]
            else:
                texts[i] += event.emitted
    assert texts == plain
    threaded = [None] * len(PROMPTS)

    def run(i):
        threaded[i] = [t for event in stream(i) for t in event.emitted]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert threaded == plain


def test_a_sequence_the_batch_gives_no_drafts_runs_no_head_step_and_catches_up_when_it_drafts(target, monkeypatch):
    """In rounds whose cap is 0 an EAGLE head's catch-up waits (batch.Deferred): no head forward runs for the
    sequence, so speculation sized off costs what plain batched decoding costs. When it drafts again, the waiting
    features go in first: the head's cache holds exactly committed[:-1] before it drafts (EagleDrafter asserts it),
    and the tokens stay plain decoding's."""
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=24, sampling=GREEDY).tokens for p in PROMPTS[:4]]
    heads, steps, rounds = [], [], [0]
    original = BatchDecoder.caps

    def caps(self, decoding):                       # drafts in rounds 0-1 and 6-7 of every 8, none otherwise
        rounds[0] += 1
        full = original(self, decoding)
        return full if rounds[0] % 8 in (1, 2, 7, 0) else [0] * len(full)
    monkeypatch.setattr(BatchDecoder, "caps", caps)
    requests = []
    for i, p in enumerate(PROMPTS[:4]):
        drafter = random_eagle_drafter(target, seed=i)
        heads.append(drafter.head)
        requests.append(Request(i, ids(p), drafter, k=3, max_new_tokens=24, sampling=GREEDY))
    batch = BatchDecoder(target, draft_length="fixed")
    for request in requests:
        batch.add(request)
    counted = {id(h): 0 for h in heads}
    hooks = [h.register_forward_hook(lambda module, args, out: counted.__setitem__(id(module), counted[id(module)] + 1))
             for h in heads]
    try:
        while batch.active:
            before = dict(counted)
            events = batch.step()
            steps.append(([e.draft_cap for e in events], {k: counted[k] - before[k] for k in counted}))
    finally:
        for hook in hooks:
            hook.remove()
    results = [batch.finished.pop(i).tokens for i in range(4)]
    assert results == plain
    idle = [ran for capped, ran in steps if capped and not any(capped)]
    assert idle and all(not any(ran.values()) for ran in idle), steps       # no head forward in a round of cap 0
    assert any(any(ran.values()) for capped, ran in steps if any(capped))


def test_a_drafters_catch_up_is_not_taken_for_the_price_of_its_drafts(target):
    """A sequence that starts drafting in a batch first catches its drafter up (the first time: the drafter's begin
    over the whole prompt). That one-off must stay out of the per-draft seconds the sizing learns: counted in, an
    EAGLE chain at batch 4 read 6-8 ms a draft against 1-2, and since the price is learnt only from rounds that draft,
    its sequences never drafted again. Here the begin takes 50 ms and a draft almost nothing."""
    import time

    class SlowBegin(se.PromptLookupDrafter):
        def begin(self, prompt_ids, target_features=None):
            time.sleep(0.05)
            super().begin(prompt_ids, target_features)

    batch = BatchDecoder(target, draft_length="adaptive", costs=FLAT)
    for i, p in enumerate(PROMPTS[3:5]):                        # repeating prompts: the lookup finds drafts
        batch.add(Request(i, ids(p), SlowBegin(), k=3, max_new_tokens=8, sampling=GREEDY))
    drafted = {}
    while batch.active and len(drafted) < 2:
        for event in batch.step():
            if event.event.drafted and event.request_id not in drafted:
                member = batch.members.get(event.request_id)
                drafted[event.request_id] = (event.event.draft_seconds, member.draft_seconds if member else None)
    assert len(drafted) == 2, drafted
    for seconds, learnt in drafted.values():
        assert seconds < 0.02 and (learnt is None or learnt < 0.02), drafted      # 0.05 s each with the begin in


def shared_head_drafters(target, count: int, tree: bool = False, head=None):
    """`count` EAGLE drafters on one random head, or on `head`'s (as make_drafter("eagle", target) shares the
    shipped head)."""
    from spec_engine.drafters.eagle import EagleDrafter
    from spec_engine.drafters.eagle_tree import EagleTreeDrafter
    first = head or random_eagle_drafter(target, seed=3)
    kind = EagleTreeDrafter if tree else EagleDrafter
    return [kind(first.head, target, first.vocab_index) for _ in range(count)]


@pytest.mark.parametrize("generic", [False, True])
def test_heads_caught_up_together_get_their_lone_catch_ups(target, generic):
    """drafters/eagle.py FeedTogether: the catch-ups of several sequences' EAGLE heads in one packed head forward
    (their begins over the prompts, then a round's rows; then a begin and a round's rows at once) give each head
    cache and prediction what its lone catch-ups give; a row that saw another sequence's head cache would not. One
    forward of the head for all of them."""
    import contextlib

    from conftest import speed_layer_off
    from spec_engine.drafters.eagle import FeedTogether, feeding_together
    hidden = target.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16], [3]]
    rounds = [[5, 6, 7], [1], [2, 2], [9]]                  # committed after a round: prompt + these
    starts = [torch.randn(len(p) - 1, hidden, generator=generator) for p in prompts]
    later = [torch.randn(len(r), hidden, generator=generator) for r in rounds]
    packed_calls = []
    original = FeedTogether._packed

    def spy(self, drafters):
        packed_calls.append(len(drafters))
        return original(self, drafters)

    def compare(lone, together):
        for a, b in zip(lone, together):
            assert a.cache_ids == b.cache_ids
            torch.testing.assert_close(b._predicted, a._predicted, rtol=1e-4, atol=1e-5)
            for la, lb in zip(a.cache.layers, b.cache.layers):
                torch.testing.assert_close(lb.keys, la.keys, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(lb.values, la.values, rtol=1e-4, atol=1e-5)

    FeedTogether._packed = spy
    try:
        with speed_layer_off() if generic else contextlib.nullcontext():
            lone = shared_head_drafters(target, 4)
            together = shared_head_drafters(target, 4, head=lone[0])
            for drafter, prompt, start in zip(lone, prompts, starts):
                drafter.begin(prompt, start)
            with feeding_together():
                for drafter, prompt, start in zip(together, prompts, starts):
                    drafter.begin(prompt, start)
                    assert drafter._predicted is None or len(prompt) == 1      # waiting for the others
            compare(lone, together)
            for drafters in (lone, together):
                with feeding_together() if drafters is together else contextlib.nullcontext():
                    for drafter, prompt, extra, feats in zip(drafters, prompts, rounds, later):
                        drafter.rollback(prompt + extra, feats)                 # 3, 1, 2 and 1 rows
            compare(lone, together)
            again_lone, again_together = shared_head_drafters(target, 2, head=lone[0]), \
                shared_head_drafters(target, 2, head=lone[0])
            for drafters in (again_lone, again_together):                     # a begin and a round at once
                with feeding_together() if drafters is again_together else contextlib.nullcontext():
                    for drafter, prompt, extra, start, feats in zip(drafters, prompts, rounds, starts, later):
                        drafter.begin(prompt, start)
                        drafter.rollback(prompt + extra, feats)
            compare(again_lone, again_together)
    finally:
        FeedTogether._packed = original
    assert packed_calls == [3, 4, 2]            # the one-token prompt's begin feeds nothing


@pytest.mark.parametrize("tree", [False, True])
def test_a_batch_catches_its_eagle_heads_up_in_one_forward_a_round(target, tree, monkeypatch):
    """BatchDecoder.catch_up: the drafting sequences' heads catch up together, one packed head forward a round
    (not one per sequence), and greedy tokens stay plain decoding's."""
    from spec_engine.drafters.eagle import FeedTogether
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=16, sampling=GREEDY).tokens for p in PROMPTS[:5]]
    calls = []
    original = FeedTogether._packed

    def spy(self, drafters):
        calls[-1].append(len(drafters))
        return original(self, drafters)
    monkeypatch.setattr(FeedTogether, "_packed", spy)
    batch = BatchDecoder(target, draft_length="fixed")
    for i, (p, drafter) in enumerate(zip(PROMPTS[:5], shared_head_drafters(target, 5, tree))):
        batch.add(Request(i, ids(p), drafter, k=3, max_new_tokens=16, sampling=GREEDY))
    while batch.active:
        calls.append([])
        batch.step()
    assert [batch.finished[i].tokens for i in range(5)] == plain
    assert all(len(round_calls) <= 1 for round_calls in calls), calls
    assert sum(sum(c) for c in calls) >= 2 * len(calls) - 4, calls   # most rounds: every drafting sequence in one


def test_a_batch_sizing_its_drafts_has_trees_draft_chains_and_no_one_else(target):
    """core/drafting.drafting_chains: the batch prices drafts by the chain's model, so in an adaptive batch of two or
    more an EAGLE tree drafts its spine as a chain; alone (a batch of one), in a fixed batch, and when its sequence
    is pinned (sampled, rule "exact": its drafts must be its lone run's), it drafts trees. Greedy tokens stay plain
    decoding's either way."""
    plain = [se.autoregressive_generate(target, ids(p), max_new_tokens=12, sampling=GREEDY).tokens for p in PROMPTS[:3]]

    def rounds(mode, count, sampling=GREEDY):
        batch = BatchDecoder(target, draft_length=mode, costs=FLAT)
        for i, (p, drafter) in enumerate(zip(PROMPTS[:count], shared_head_drafters(target, count, True))):
            batch.add(Request(i, ids(p), drafter, k=4, max_new_tokens=12, sampling=sampling, seed=i))
        events = [e for _ in range(200) if batch.active for e in batch.step()]
        return events, [batch.finished[i].tokens for i in range(count)]

    def shapes(events):                 # the drafted rounds' shapes, by whether the round's forward was shared
        return {(e.batch_size > 1, e.event.is_tree) for e in events if e.event.drafted}

    events, tokens = rounds("adaptive", 3)
    assert tokens == plain and (True, False) in shapes(events) and (True, True) not in shapes(events)
    for mode, count in (("adaptive", 1), ("fixed", 3)):
        events, tokens = rounds(mode, count)
        assert tokens == plain[:count] and {tree for _, tree in shapes(events)} == {True}, (mode, count)
    events, _ = rounds("adaptive", 3, se.SamplingParams(temperature=0.8))
    assert (True, True) in shapes(events) and (True, False) not in shapes(events)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_batch_benchmark_runs_its_arms_in_orders_where_each_follows_each_equally(n):
    """bench_batch's arm orders: every arm follows every other arm equally often (an arm timed right after a drafting
    arm runs slower, so a fixed neighbour biases the comparison), and each order holds every arm once."""
    from spec_engine.bench_batch import balanced_orders
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = [(a, b) for order in orders for a, b in zip(order, order[1:])]
    counts = {pair: follows.count(pair) for pair in follows}
    assert len(counts) == n * (n - 1) and len(set(counts.values())) == 1
