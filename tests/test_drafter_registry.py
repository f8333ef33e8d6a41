"""A new drafter is one module and one registration: registered here once, the CLI's parser, the engine's factory
and the playground's draft list all offer it, and the engine stays exact with it."""
import pytest
import torch

import spec_engine as se
from spec_engine.drafters import registry


class RepeatLastDrafter(se.Drafter):
    """A trivial drafter (what a newcomer might write first): propose the newest token k times."""

    name = "repeat-last"

    def propose(self, committed, k, params, generator):
        return se.Proposal([committed[-1]] * k, None)


@pytest.fixture
def registered():
    # --- the whole registration of a new drafter: ---
    @se.register_draft("repeat-last", "Repeat the newest token", "The simplest guess: the next token repeats the last.")
    def build_repeat_last(spec, target, draft, fixed_length):
        return RepeatLastDrafter()
    # ---
    yield
    registry.MODES_BY_NAME.pop("repeat-last")


class Loaded:
    def __init__(self, model):
        self.model, self.tokenizer = model, None


def test_one_registration_reaches_the_parser_the_factory_and_the_playground(registered, target):
    spec = se.parse_draft("repeat-last")
    assert spec == se.DraftSpec("repeat-last") and "repeat-last" in se.draft_modes()
    assert isinstance(se.make_drafter("repeat-last", Loaded(target)), RepeatLastDrafter)
    with pytest.raises(ValueError, match="whole number"):
        se.parse_draft("repeat-last:x")
    from ui.playground import drafts
    kind = drafts.kind_by_key("repeat-last")
    assert kind is not None and kind.lesson.startswith("The simplest guess")
    assert ("Repeat the newest token", "repeat-last") in drafts.draft_choices("smollm2-135m-instruct")
    assert drafts.check_draft_value("repeat-last") is None


def test_the_registered_drafter_is_exact_under_greedy_decoding(registered, target):
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    greedy = se.SamplingParams(temperature=0)
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy, seed=0)
    drafter = se.make_drafter("repeat-last", Loaded(target))
    result = se.SpeculativeDecoder(target, drafter).generate(prompt, k=3, max_new_tokens=24, sampling=greedy, seed=0)
    assert result.tokens == plain.tokens and len(result.tokens) == 24
    assert len(result.rounds) < 24                     # some repeats were accepted: rounds committed several tokens


def test_without_the_registration_the_name_is_a_model_preset(target):
    assert se.parse_draft("repeat-last") == se.DraftSpec("same-tokenizer", "repeat-last")


def test_make_drafter_takes_its_options_as_arguments_not_hidden_state(monkeypatch):
    """The options the playground passes (a layer set, a run's earlier verify-cost curve) go through make_drafter's
    arguments: the curve pinned is the one the drafts are sized by, and a layer set for a mode without layers is an
    error naming the argument."""
    from tiny import tiny_llama
    from spec_engine.drafters import lookup, sizing
    model = tiny_llama(vocab=8, layers=4, seed=1)
    curve = sizing.CostCurve((0.0, 1.0, 1.1, 1.2, 1.3, 1.4))
    monkeypatch.setattr(lookup, "verify_costs", lambda target_model: curve)
    assert se.make_drafter("layer-skip", Loaded(model), skip_layers=[2]).skip_layers == [2]
    with pytest.raises(ValueError, match="skip_layers"):
        se.make_drafter("prompt-lookup", Loaded(model), skip_layers=[2])
    free = se.make_drafter("prompt-lookup", Loaded(model))
    se.SpeculativeDecoder(model, free)
    measured = se.drafter_sizing(free)
    assert measured is not None and measured.costs == curve.measured
    wanted = se.Sizing((0.0, 1.0, 2.0, 3.0, 4.0, 5.0), "a run's first pass")
    pinned = se.make_drafter("prompt-lookup", Loaded(model), sizing=wanted)
    se.SpeculativeDecoder(model, pinned)
    assert se.drafter_sizing(pinned) == wanted
    assert se.drafter_sizing(se.make_drafter("layer-skip", Loaded(model))) is None
