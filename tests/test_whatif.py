"""The what-if panel's cost model (spec_engine/classroom/whatif.py): pure arithmetic, no model, milliseconds.

The calibration test is the one that matters: from each Spec-Bench method's own reported tokens per forward and its
own draft shape, the datasheet cost model must land within 15% of the speedup Spec-Bench measured.
"""
from types import SimpleNamespace

import pytest

from spec_engine.classroom import whatif

SPEC_BENCH_3090 = {"PLD": (1.73, 1.64), "SpS": (2.28, 1.79), "EAGLE": (3.57, 2.03), "EAGLE-2": (4.35, 2.19)}


def test_calibration_rows_are_spec_benchs_and_each_projection_lands_within_15_percent():
    rows = whatif.calibration()
    assert {row.method: (row.tokens_per_forward, row.speedup) for row, _ in rows} == SPEC_BENCH_3090
    for row, projected in rows:
        assert projected.tokens_per_forward == row.tokens_per_forward
        assert abs(projected.speedup / row.speedup - 1) <= 0.15, (row.method, projected.formula())


def test_the_calibration_is_not_flat_a_wrong_cost_model_fails_it():
    """Guard against a test that cannot fail: verify rows that cost nothing on a GPU (v = 1) or cost as much as on
    a CPU (each row a full step) both miss a row by more than 15%."""
    data = whatif.load_presets()
    for per_row in (0.0, 1.0):
        misses = []
        for row in data.calibration:
            cost = whatif.gpu_cost(data.get("hardware", row.hardware), data.get("targets", row.target),
                                   data.get("drafts", row.draft))
            cost = whatif.CostModel(**{**cost.__dict__, "verify_per_row": per_row})
            p = whatif.project(row.tokens_per_forward, cost, row.verify_rows, row.draft_forwards)
            misses.append(abs(p.speedup / row.speedup - 1) > 0.15)
        assert any(misses), per_row


@pytest.mark.parametrize("alphas,expected", [([], 1.0), ([1, 1, 1], 4.0), ([0.5, 0.5], 1.75), ([0, 1, 1], 1.0),
                                             ([0.8, 0.5], 1 + 0.8 + 0.4)])
def test_expected_tokens_from_acceptance_by_position(alphas, expected):
    assert whatif.expected_tokens(alphas) == pytest.approx(expected)


def chain(accepted, drafted, verify=0.0, draft=0.0):
    return SimpleNamespace(drafted=[0] * drafted, accepted=accepted, tree_parents=None, verify_seconds=verify,
                           draft_seconds=draft)


def test_acceptance_by_position_counts_only_rounds_that_reached_the_position():
    rounds = [chain(0, 4), chain(2, 4), chain(4, 4), chain(1, 1), chain(0, 0)]
    # position 1: offered by 4 rounds (the empty draft offers none), kept by 3; position 2: rounds that kept
    # draft 1 and drafted a 2nd: 2 of them, both kept; position 3: offered 2, kept 1; position 4: offered 1, kept 1
    assert whatif.acceptance_by_position(rounds) == pytest.approx([3 / 4, 1.0, 0.5, 1.0])
    assert whatif.acceptance_by_position([]) == []


def test_run_acceptance_by_position_prefers_the_engines_field():
    rounds = [chain(1, 2)]
    assert whatif.run_acceptance_by_position(SimpleNamespace(acceptance_by_position=[0.25]), rounds) == [0.25]
    assert whatif.run_acceptance_by_position(SimpleNamespace(), rounds) == [1.0, 0.0]


def test_gpu_cost_model_terms():
    data = whatif.load_presets()
    h100, gpu3090 = data.get("hardware", "h100-sxm"), data.get("hardware", "rtx-3090")
    assert gpu3090.ridge_rows == pytest.approx(71e12 * 2 / (2 * 936e9))
    vicuna = data.get("targets", "vicuna-7b")
    assert data.get("drafts", "lookup").forward_cost(vicuna) == 0
    assert data.get("drafts", "vicuna-68m").forward_cost(vicuna) == pytest.approx(2 / 32)   # launch bound: layers
    assert data.get("drafts", "llama-3.2-1b").forward_cost(data.get("targets", "llama-3.1-8b")) == pytest.approx(0.5)
    # a faster-computing card verifies many rows more cheaply, so the same tree pays more there
    alphas = [0.8, 0.7, 0.6, 0.5]
    head = data.get("drafts", "eagle-head")
    on = {h.id: whatif.project_alphas(alphas, whatif.gpu_cost(h, vicuna, head), head, tree_nodes=60)
          for h in (h100, gpu3090)}
    assert on["h100-sxm"].speedup > on["rtx-3090"].speedup
    big = whatif.gpu_cost(h100, data.get("targets", "llama-3.1-70b"), head)
    assert "do not fit" in big.assumptions[0]


def test_model_free_mode_projects_from_sliders_with_no_model_loaded():
    """The panel's handler with no session and no run: sliders in, a projection out, and no model registry touched
    (it imports none: the UI module and the cost model are pure)."""
    from ui.classroom import whatif as panel

    text, table = panel.update(3, "rtx-3090", "vicuna-7b", "eagle-head", 0, 0.9, 0.8, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1,
                               None)
    expected = whatif.expected_tokens([0.9, 0.8, 0.7])
    assert f"{expected:.2f}" in text and "projection" in text and "Assumptions" in text
    assert list(table["where"]) == [h.label for h in whatif.load_presets().hardware]   # no CPU row without a run
    text, _ = panel.update(3, panel.CPU, "vicuna-7b", "eagle-head", 0, *[0.5] * 8, None)
    assert "press **Run**" in text


def test_measured_cost_fits_verify_cost_by_rows_in_plain_steps():
    rounds = [chain(1, 1, verify=0.02, draft=0.001), chain(3, 3, verify=0.03, draft=0.003),
              chain(0, 5, verify=0.04, draft=0.005)]
    cost = whatif.measured_cost(rounds, [0.01, 0.01])
    assert cost.verify_per_row == pytest.approx(0.5)       # 5 ms a row over a 10 ms step
    assert cost.verify_cost(2) == pytest.approx(2.0)
    assert cost.draft_forward == pytest.approx(0.1)
    assert cost.plain_tokens_per_second == pytest.approx(100)
    assert whatif.measured_cost([], [0.01]) is None and whatif.measured_cost(rounds, []) is None


def test_presets_are_validated_naming_the_field(tmp_path):
    text = whatif.PRESETS_PATH.read_text().replace("bandwidth_gb_s: 936", "bandwidth_gb_s: fast")
    bad = tmp_path / "whatif.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"whatif.yaml: hardware\[0\].bandwidth_gb_s"):
        whatif.load_presets(bad)
    with pytest.raises(ValueError, match="tokens_per_forward >= 1"):
        whatif.project(0.5, whatif.calibration()[0][1].cost, 2, 0)
