"""The comparison against stock Hugging Face (spec_engine/bench_hf.py, issue #27): the logic that decides whether
its numbers can be trusted, never its timings. The Hugging Face side is transformers' own model (not the engine's
object, nothing of spec_engine on it); the held-out prompts were never tuning prompts; every cell carries a spread
from its repeats and ratios pair runs of the same repeat; the verify-cost curve is the one of the thread count in
use."""
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from spec_engine import bench_hf
from spec_engine.bench_hf import HF_LOOKUP, HF_PLAIN, ENGINE_PLAIN, Run


def test_held_out_prompts_are_disjoint_from_every_prompt_used_for_tuning():
    """Headline figures come from prompts nothing was tuned on: not the tuning set, not the benchmark's own four,
    not the prompts behind LookupOdds' priors (bench/lookup_policy.py), not the playground's presets."""
    from bench.lookup_policy import prompt_set
    from spec_engine.bench import PROMPTS
    prompts = bench_hf.load_prompts()
    held_out = [p for p in prompts if p.set == "held-out"]
    tuning = {p.text for p in prompts if p.set == "tuning"} | set(PROMPTS.values()) | set(prompt_set().values())
    assert not [p.name for p in held_out if p.text in tuning]
    assert not [p.name for p in held_out if any(p.text[-120:] in t or t[-120:] in p.text for t in tuning)]
    assert {p.kind: sum(q.kind == p.kind for q in held_out) for p in held_out} == {
        "edit": 8, "summarise": 8, "qa": 8, "chat": 8}
    assert len({p.name for p in prompts}) == len(prompts) and len({p.text for p in prompts}) == len(prompts)
    assert set(PROMPTS.values()) <= {p.text for p in prompts if p.set == "tuning"}


def test_prompt_selection_and_its_errors_name_the_field(tmp_path):
    prompts = bench_hf.load_prompts()
    chosen = bench_hf.select_prompts(prompts, "held-out", ["qa", "chat"], per_kind=2)
    assert [p.name for p in chosen] == ["held-out-qa-0", "held-out-qa-1", "held-out-chat-0", "held-out-chat-1"]
    assert {p.set for p in bench_hf.select_prompts(prompts, "tuning")} == {"tuning"}
    with pytest.raises(ValueError, match="--kinds: no held-out prompts of kind poetry"):
        bench_hf.select_prompts(prompts, "held-out", ["poetry"])
    with pytest.raises(ValueError, match="--set"):
        bench_hf.select_prompts(prompts, "train")
    broken = tmp_path / "prompts.json"
    broken.write_text(json.dumps({"tuning": [], "held_out": [{"kind": "chat", "name": "x", "text": " "}]}))
    with pytest.raises(ValueError, match=r"held_out\[0\] needs non-empty strings kind, name and text"):
        bench_hf.load_prompts(broken)


def test_the_hugging_face_side_is_a_stock_model_not_the_engines(smollm2):
    """load_stock gives transformers' own object with the engine's float32 weights, in its own memory, with none of
    what load_model does to a model (lean forward attributes, packed linear layers, replaced forwards)."""
    stock = bench_hf.load_stock(smollm2.source, smollm2.dtype)
    engine = smollm2.model
    assert stock is not engine and type(stock) is LlamaForCausalLM
    for name, module in stock.named_modules():
        assert type(module).__module__.startswith(("transformers.", "torch.nn.")), (name, type(module))
        assert "forward" not in vars(module), name
        assert not isinstance(module, nn.Linear) or type(module) is nn.Linear, name
        assert not [a for a in vars(module) if "spec_engine" in a or a.startswith("_engine")], name
    engine_state = engine.state_dict()
    for key, value in stock.state_dict().items():
        assert torch.equal(value, engine_state[key]) and value.data_ptr() != engine_state[key].data_ptr(), key
    with pytest.raises(ValueError, match="random"):
        bench_hf.load_stock("random weights, llama-1b shape", torch.float32)


def fake_run(arm: str, seconds: float, tokens: int = 10, calls: int = 6, rows: int = 60, forward: float = 0.6) -> Run:
    """A prefill of 40 rows in 0.1 s, then 5 forwards of 4 rows in 0.5 s."""
    return Run(arm, seconds, [1] * tokens, calls, rows, forward, prefill_rows=40, prefill_seconds=0.1)


def fake_result(threads: int, prompt: str, kind: str, seconds: dict[str, list[float]]) -> dict:
    return {"threads": threads, "prompt": prompt, "kind": kind, "identical": True,
            "runs": {arm: [fake_run(arm, s) for s in values] for arm, values in seconds.items()}}


SECONDS = {HF_PLAIN: [1.0, 2.0, 1.25], HF_LOOKUP: [0.5, 1.0, 0.4], ENGINE_PLAIN: [1.0, 1.0, 1.0],
           "prompt-lookup": [0.25, 1.0, 0.5]}


def test_cells_are_medians_with_their_min_max_and_ratios_pair_runs_of_one_repeat():
    result = fake_result(2, "held-out-edit-0", "edit", SECONDS)
    # tok/s of 10 tokens: HF lookup 20, 10, 25; the engine's lookup 40, 10, 20; per repeat 2.0, 1.0, 0.8
    assert bench_hf.ratios(result["runs"], "prompt-lookup", HF_LOOKUP) == [2.0, 1.0, 0.8]
    row = bench_hf.cell_rows([result], ["prompt-lookup"]).splitlines()[-1]
    assert "| 20.00 [10.00-25.00] |" in row           # HF lookup tok/s
    assert "| 1.00x [0.80-2.00] |" in row             # the engine's lookup / HF lookup, paired by repeat
    assert row.endswith("| yes |")
    assert bench_hf.cell_rows([{**result, "identical": False}], ["prompt-lookup"]).endswith("| **no** |")


def test_summary_is_a_geometric_mean_over_prompts_with_the_lowest_and_highest():
    a = fake_result(2, "held-out-edit-0", "edit", SECONDS)                        # median ratio 1.0
    b = fake_result(2, "held-out-qa-0", "qa", {**SECONDS, "prompt-lookup": [0.125, 0.25, 0.1]})   # 4.0
    c = fake_result(2, "held-out-chat-0", "chat", SECONDS)
    lines = bench_hf.summary([a, b, c], ["prompt-lookup"]).splitlines()
    grounded = next(line for line in lines if "grounded (2)" in line and "prompt-lookup / hf-lookup" in line)
    assert "| **2.00x** | 1.00x | 4.00x |" in grounded
    assert any("| 2 | all (3) | prompt-lookup / hf-lookup | **1.59x** |" in line for line in lines)


def test_the_time_split_reports_forwards_rows_and_time_outside_them():
    result = fake_result(1, "held-out-chat-0", "chat", {HF_LOOKUP: [0.7, 0.9, 0.8]})
    line = next(x for x in bench_hf.time_split([result], [HF_LOOKUP]).splitlines() if "| hf-lookup |" in x)
    # median run 0.8 s (12.5 tok/s): a 100 ms prefill, then 10 tokens in 5 forwards of 4 rows, 100 ms each, and
    # 0.8 - 0.6 s outside the forwards: 40 ms per forward; 0.6 of 0.8 s in forwards
    assert line == "| 1 | chat | hf-lookup | 12.5 | 100.0 | 0.50 | 4.00 | 100.00 | 40.00 | 75% |"


def test_arms_rotate_so_none_always_runs_first():
    arms = [HF_PLAIN, HF_LOOKUP, ENGINE_PLAIN, "prompt-lookup"]
    firsts = [bench_hf.rotated(arms, r)[0] for r in range(4)]
    assert sorted(firsts) == sorted(arms)
    assert all(sorted(bench_hf.rotated(arms, r)) == sorted(arms) for r in range(6))


@pytest.mark.measured_costs          # the real verify_costs, over a stand-in for the measurement: no timing
def test_the_verify_cost_curve_is_the_thread_counts_in_use(monkeypatch):
    """Measured once per thread count and kept: a curve measured at one thread must not size drafts at two."""
    from spec_engine.drafters import sizing
    measured = []
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda model: measured.append(torch.get_num_threads())
                        or (0.0, 1.0, float(torch.get_num_threads())))
    model = SimpleNamespace(device=torch.device("cpu"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sizing.verify_costs(model)
        torch.set_num_threads(2)
        two = sizing.verify_costs(model)
        torch.set_num_threads(1)
        again = sizing.verify_costs(model)
    finally:
        torch.set_num_threads(before)
    assert measured == [1, 2] and one == again == (0.0, 1.0, 1.0) and two == (0.0, 1.0, 2.0)


@pytest.mark.measured_costs          # the real verify_costs, over a stand-in for the measurement: no timing
def test_the_report_keeps_each_thread_counts_curve_at_start_up_and_as_corrected(monkeypatch):
    """Runs of the same code differ in tree size by the curve their process measured: the report says which."""
    from spec_engine.drafters import sizing
    monkeypatch.setattr(sizing, "measure_verify_costs",
                        lambda model: (0.0, 1.0, 1.0 + 0.5 * torch.get_num_threads(), 3.0))
    model = SimpleNamespace(device=torch.device("cpu"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert bench_hf.cost_curves(model, [1, 2]) == {}              # nothing measured: nothing reported
        sizing.verify_costs(model)
        torch.set_num_threads(2)
        sizing.verify_costs(model)
        # at 2 threads, 2 rows cost 1.2 one-row forwards; 3 rows, never timed, scale with them: 3.0 * 1.2 / 2.0
        for rows, seconds in [(1, 0.010)] * sizing.ONE_ROW_MIN + [(2, 0.012)]:
            sizing.observe(model, rows, seconds)
        curves = bench_hf.cost_curves(model, [1, 2])
        assert torch.get_num_threads() == 2                             # the caller's count is restored
    finally:
        torch.set_num_threads(before)
    assert curves["1"] == {"start-up": [1.0, 1.5, 3.0], "now": [1.0, 1.5, 3.0], "source": "measured at start-up"}
    assert curves["2"]["start-up"] == [1.0, 2.0, 3.0] and curves["2"]["now"] == [1.0, 1.2, 1.8]
    assert curves["2"]["source"] == "corrected from 4 timed forwards"
    text = bench_hf.curves_text(curves)
    assert "2 threads" in text and "at start-up 1.00 2.00 3.00; at the end 1.00 1.20 1.80" in text
    assert bench_hf.curves_text({}).startswith("No verify-cost curve")


def test_the_six_kinds_are_eight_held_out_prompts_each_and_multi_turn_chats_encode_every_turn():
    """Issue #26's benchmark prompts: six kinds of 8, none a prompt of the EAGLE head's training set (nor sharing a
    long passage with one), the chats' turns ending with the user's text; a chat is encoded with all its turns."""
    from spec_engine.bench import HELD_OUT_FILE
    path = bench_hf.PROMPTS_FILE.parent / "six_kinds.json"
    prompts = bench_hf.load_prompts(path)
    assert {p.kind: sum(q.kind == p.kind for q in prompts) for p in prompts} == {
        "chat": 8, "translate": 8, "summarise": 8, "qa": 8, "math": 8, "rag": 8}
    assert all(p.set == "held-out" for p in prompts) and all(len(p.turns) >= 3 for p in prompts if p.kind == "chat")
    training = [item["text"] for item in json.loads(HELD_OUT_FILE.read_text(encoding="utf-8"))["train"]]
    assert not [p.name for p in prompts if any(p.text[:60] in t or t[:60] in p.text for t in training)]
    seen = []
    engine = SimpleNamespace(device="cpu", encode_prompt=lambda text: torch.tensor([[0]]), tokenizer=SimpleNamespace(
        apply_chat_template=lambda turns, **kw: seen.append(turns) or {"input_ids": torch.tensor([[1, 2]])}))
    chat = next(p for p in prompts if p.turns)
    assert bench_hf.encode(engine, chat).tolist() == [[1, 2]] and seen == [list(chat.turns)]


def test_the_kind_table_reports_speedup_tokens_per_forward_and_acceptance_per_kind_and_over_all():
    draft = {"eagle-tree": [0.5, 0.5, 0.5]}
    a = fake_result(2, "chat-0", "chat", {**SECONDS, **draft})
    b = fake_result(2, "math-0", "math", {**SECONDS, **draft})
    for result in (a, b):
        result["runs"]["eagle-tree"] = [Run("eagle-tree", 0.5, [1] * 10, 6, 60, 0.6, 40, 0.1, rounds=4, drafted=12,
                                            accepted=6, tree={"tree_nodes": 3.0, "tree_path_per_round": 1.5,
                                                              "spine_per_round": 1.0, "tree_longer_share": 0.25})] * 3
    lines = bench_hf.kind_table([a, b], ["eagle-tree"]).splitlines()
    # the engine's plain decoding 1.0 s, the tree 0.5 s: 2x; 10 tokens in 4 rounds; 6 of 12 drafts accepted
    assert "| 2 | all (2) | eagle-tree | **2.00x** | 2.00-2.00x | 2.50 | 0.50 |" in lines
    # HF's lookup over its plain decoding, per repeat 2.0, 2.0, 3.125; 9 tokens after the prefill's in 5 forwards
    assert "| 2 | chat (1) | hf-lookup | 2.00x | 2.00-2.00x | 1.80 | – |" in lines
    tree = bench_hf.tree_table([a, b], ["eagle-tree"]).splitlines()
    assert "| 2 | all | eagle-tree | 3.0 | 1.50 | 1.00 | 25% |" in tree
    assert bench_hf.tree_table([a], []) == ""


def test_an_arm_may_name_its_own_k():
    assert bench_hf.arm_k("eagle-tree@8", 4) == ("eagle-tree", 8)
    assert bench_hf.arm_k("prompt-lookup:3/full", 4) == ("prompt-lookup:3/full", 4)
    assert bench_hf.arm_k("eagle+lookup@3", 4) == ("eagle+lookup", 3)


def test_prompts_run_interleaved_by_kind_so_a_stopped_run_covers_every_kind():
    prompts = [bench_hf.Prompt("held-out", kind, f"{kind}-{i}", "x") for kind in ("chat", "math") for i in range(2)]
    assert [p.name for p in bench_hf.interleaved(prompts)] == ["chat-0", "math-0", "chat-1", "math-1"]
