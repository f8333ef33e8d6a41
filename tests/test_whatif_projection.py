"""The What-if projection's rows and costs (spec_engine/classroom/whatif.py) for chains and trees: a tree verifies its
nodes + 1 rows after one draft forward a level, and this machine's draft cost is per level, not per node."""
from types import SimpleNamespace

import pytest

from spec_engine.classroom import whatif

COST = whatif.CostModel(name="test", verify_one=1.0, verify_per_row=0.1, draft_forward=0.05,
                        plain_tokens_per_second=40.0, measured=False)
HEAD = whatif.Draft(id="head", label="a head", kind="head")
LOOKUP = whatif.Draft(id="lookup", label="lookup", kind="lookup")


def test_a_chain_verifies_k_plus_one_rows_after_k_draft_forwards():
    p = whatif.project_alphas([0.8, 0.5, 0.5], COST, HEAD)
    assert (p.verify_rows, p.draft_forwards) == (4, 3)
    assert p.tokens_per_forward == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert p.verify_cost == pytest.approx(1.3) and p.draft_cost == pytest.approx(0.15)
    assert p.speedup == pytest.approx(2.4 / 1.45)
    assert p.tokens_per_second == pytest.approx(40.0 * 2.4 / 1.45)


def test_a_tree_verifies_its_nodes_plus_one_rows_after_one_draft_forward_a_level():
    p = whatif.project_alphas([0.8, 0.5, 0.5], COST, HEAD, tree_nodes=10)
    assert (p.verify_rows, p.draft_forwards) == (11, 3)
    assert p.verify_cost == pytest.approx(2.0) and p.draft_cost == pytest.approx(0.15)
    assert p.round_cost == pytest.approx(2.15) and p.speedup == pytest.approx(2.4 / 2.15)
    lookup = whatif.project_alphas([0.8, 0.5, 0.5], COST, LOOKUP, tree_nodes=5)
    assert (lookup.verify_rows, lookup.draft_forwards, lookup.draft_cost) == (6, 0, 0.0)
    exact = whatif.project_alphas([0.8, 0.5], COST, HEAD, tree_nodes=2)          # a tree as deep as its nodes
    assert (exact.verify_rows, exact.draft_forwards) == (3, 2)
    with pytest.raises(ValueError, match="at least 3 nodes"):
        whatif.project_alphas([0.8, 0.5, 0.5], COST, HEAD, tree_nodes=2)


def tree_round(parents, verify, draft):
    return SimpleNamespace(drafted=[0] * len(parents), accepted=1, tree_parents=parents, verify_seconds=verify,
                           draft_seconds=draft)


def test_this_machines_draft_cost_of_a_tree_is_per_level_not_per_node():
    # 6 nodes 2 levels deep, then 3 nodes 3 deep: 5 levels drafted for 9 ms of drafting over 10 ms plain steps
    rounds = [tree_round([-1, -1, -1, 0, 1, 2], verify=0.02, draft=0.004),
              tree_round([-1, 0, 1], verify=0.015, draft=0.005)]
    cost = whatif.measured_cost(rounds, [0.01])
    assert cost.draft_forward == pytest.approx(0.009 / 0.01 / 5)
    assert cost.verify_per_row == pytest.approx((2.0 - 1.5) / (7 - 4))   # rows are nodes + 1: 7 and 4
    assert cost.verify_one == pytest.approx(1.5 - cost.verify_per_row * 3)
    assert "fitted over 2 rounds of 4-7 rows" in cost.assumptions[1]


def test_one_row_count_gives_a_flat_verify_cost_and_says_so():
    rounds = [tree_round([-1, 0], verify=0.02, draft=0.002)] * 3
    cost = whatif.measured_cost(rounds, [0.01, 0.03, 0.0])       # a zero step time is left out: the mean is 20 ms
    assert cost.verify_per_row == 0.0 and cost.verify_one == pytest.approx(1.0)
    assert cost.draft_forward == pytest.approx(0.002 / 0.02 / 2)
    assert cost.plain_tokens_per_second == pytest.approx(50.0)
    assert "every round verified 3 rows" in cost.assumptions[1] and cost.measured
    assert whatif.measured_cost([tree_round([], 0.01, 0.0)], [0.01]).draft_forward == 0.0     # nothing drafted


def test_a_verify_faster_than_a_plain_step_is_kept_and_the_model_says_how_it_was_measured():
    rounds = [tree_round([-1, 0], verify=0.005, draft=0.001)] * 2
    cost = whatif.measured_cost(rounds, [0.01])
    assert cost.verify_one == pytest.approx(0.5) and cost.name == "this CPU"
    assert cost.assumptions[0].startswith("measured on this machine, from this run's rounds") and \
        "(10.0 ms)" in cost.assumptions[0]
    assert whatif.measured_cost(rounds, [0.01], label="a laptop").name == "a laptop"


def test_a_draft_forwards_cost_by_kind():
    target = whatif.Target(id="t", label="t", params_b=8.0, layers=32, hidden=4096, vocab=128000)
    assert LOOKUP.forward_cost(target) == 0.0
    head = (8e9 / 32 + 2 * 4096 ** 2 + 4096 * 128000) / 8e9          # a layer, the 2h -> h projection, the LM head
    assert HEAD.forward_cost(target) == pytest.approx(head) and head > 1 / 32
    tiny_head = whatif.Target(id="s", label="s", params_b=1000.0, layers=4, hidden=8, vocab=8)
    assert HEAD.forward_cost(tiny_head) == pytest.approx(1 / 4)        # at least one layer's share
    model = whatif.Draft(id="m", label="m", kind="model", params_b=0.5, layers=16)
    assert model.forward_cost(target) == pytest.approx(0.5)             # its layers' share beats its weights'


def test_positions_run_from_one_to_sixteen_and_alphas_above_one_count_as_one():
    assert whatif.project_alphas([0.5], COST).verify_rows == 2
    assert whatif.project_alphas([0.5] * whatif.MAX_POSITIONS, COST).verify_rows == whatif.MAX_POSITIONS + 1
    for alphas in ([], [0.5] * (whatif.MAX_POSITIONS + 1)):
        with pytest.raises(ValueError, match=f"needs 1 to {whatif.MAX_POSITIONS} positions, got {len(alphas)}"):
            whatif.project_alphas(alphas, COST)
    assert whatif.expected_tokens([1.5, 1.5]) == 3.0 and whatif.expected_tokens([-1.0, 1.0]) == 1.0


def test_an_unknown_preset_is_named_with_the_known_ones():
    presets = whatif.load_presets()
    known = ", ".join(h.id for h in presets.hardware)
    with pytest.raises(ValueError) as refused:
        presets.get("hardware", "tpu")
    assert str(refused.value) == f"unknown hardware preset 'tpu'; known: {known}"


@pytest.mark.parametrize("edit, message", [
    (lambda t: "- just a list\n",
     "whatif.yaml: the top level must be a mapping with exactly hardware, targets, drafts, calibration"),
    (lambda t: t + "extra: 1\n", "the top level must be a mapping with exactly"),
    (lambda t: t.replace("hardware:\n  - id: rtx-3090", "hardware:\n  - rtx-3090\n  - id: rtx-3090", 1),
     "whatif.yaml: hardware[0]: must be a mapping"),
    (lambda t: t.replace("    memory_gb: 24\n", "    memory_gb: 24\n    colour: green\n", 1),
     "whatif.yaml: hardware[0]: unknown field(s) ['colour']"),
    (lambda t: t.replace("    bandwidth_gb_s: 936\n", "", 1),
     "whatif.yaml: hardware[0]: missing field 'bandwidth_gb_s'"),
    (lambda t: t.replace("  - id: rtx-3090", "  - id: 3090", 1),
     "whatif.yaml: hardware[0].id: expected a text, got 3090"),
    (lambda t: t.replace("bandwidth_gb_s: 936", "bandwidth_gb_s: -1", 1),
     "whatif.yaml: hardware[0].bandwidth_gb_s: expected a non-negative number, got -1"),
])
def test_each_bad_preset_is_named(tmp_path, edit, message):
    bad = tmp_path / "whatif.yaml"
    bad.write_text(edit(whatif.PRESETS_PATH.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        whatif.load_presets(bad)
    assert message in str(refused.value)


def test_counts_must_be_whole_and_optional_fields_may_be_left_out(tmp_path):
    text = whatif.PRESETS_PATH.read_text(encoding="utf-8")
    layers = next(line for line in text.splitlines() if line.strip().startswith("layers:"))
    bad = tmp_path / "whatif.yaml"
    bad.write_text(text.replace(layers, layers + ".5", 1), encoding="utf-8")
    with pytest.raises(ValueError, match=r"layers: expected a non-negative number"):
        whatif.load_presets(bad)
    sourceless = tmp_path / "sourceless.yaml"
    sourceless.write_text("\n".join(line for line in text.splitlines() if not line.strip().startswith("source:")),
                          encoding="utf-8")
    presets = whatif.load_presets(sourceless)
    assert presets.hardware[0].source == "" and len(presets.hardware) == len(whatif.load_presets().hardware)
    with pytest.raises(ValueError, match=r"missing.yaml: cannot read it"):
        whatif.load_presets(tmp_path / "missing.yaml")


def test_the_measured_models_notes_say_what_was_measured():
    cost = whatif.measured_cost([tree_round([-1, 0], verify=0.005, draft=0.001)], [0.0125])
    assert "(12.5 ms)" in cost.assumptions[0]
    assert cost.assumptions[2] == "draft cost per drafted token (a tree: per level); every round drafts all k"


def test_project_takes_one_row_no_draft_and_one_token_and_refuses_less():
    p = whatif.project(1.0, COST, 1, 0)
    assert (p.verify_cost, p.draft_cost, p.speedup) == (1.0, 0.0, 1.0)
    for args in ((1.0, COST, 0, 0), (1.0, COST, 1, -1), (0.99, COST, 1, 0)):
        with pytest.raises(ValueError, match="need verify_rows >= 1"):
            whatif.project(*args)
    free = whatif.CostModel("free", 0.0, 0.0, 0.0, 10.0, measured=True)
    assert whatif.project(2.0, free, 3, 2).speedup == 0.0                # no cost at all: no figure
    negative = whatif.CostModel("odd", 0.5, 0.0, -0.5, 10.0, measured=True)
    assert whatif.project(2.0, negative, 1, 2).speedup == 0.0            # verify + draft <= 0


def test_the_gpu_model_names_its_parts_and_its_assumptions():
    hardware = whatif.Hardware(id="g", label="a GPU", bandwidth_gb_s=1000.0, tensor_tflops=100.0, memory_gb=24.0)
    big = whatif.Target(id="b", label="a big model", params_b=70.0, layers=80, hidden=8192, vocab=128000)
    cost = whatif.gpu_cost(hardware, big, LOOKUP)
    assert cost.name == "a GPU, a big model" and cost.measured is False
    assert cost.plain_tokens_per_second == pytest.approx(1000.0 / 140.0)
    assert cost.verify_per_row == pytest.approx(1 / hardware.ridge_rows) and cost.verify_one == 1.0
    assert cost.assumptions[0] == ("140 GB of weights do not fit one 24 GB card: several cards in tensor parallel, "
                                   "whose communication is not modelled")
    assert cost.assumptions[-2:] == (
        "plain tokens/s is the bandwidth ceiling; real runs reach part of it (the speedup does not depend on which)",
        "prefill, sampling and Python overhead per round are left out")
    assert len(whatif.gpu_cost(hardware, whatif.Target("s", "s", 7.0, 32, 4096, 32000), LOOKUP).assumptions) == 5
