"""The engine's CPU products (spec_engine/accel/cpu_gemm.py): every kernel equal to F.linear for every row count, the
static rule (the blocked kernel for 1-16 rows where it is built, else MKL packed for 4-16) or a measured plan
applied inside the engine's forwards only, never stale, off where it cannot apply; plans measured once per machine
and kept in the cache folder."""
import copy
import json

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from spec_engine.accel import blocked_gemm, cpu_gemm
from spec_engine.core.cache import forward_logits, new_cache
from spec_engine.accel.cpu_gemm import PackedLinear, batched_gemm, pack_linears

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="this torch has no MKL packed sgemm")


@pytest.fixture(autouse=True)
def no_plans(monkeypatch, tmp_path):
    """Each test starts with no measured plans, and any it saves go to its own cache folder."""
    monkeypatch.setattr(cpu_gemm, "_PLANS", {})
    monkeypatch.setenv("SPEC_ENGINE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(params=["blocked", "mkl"])
def static_rule(request, monkeypatch):
    """Each static rule in turn: the blocked kernel for 1-16 rows (where it is built), and MKL packed for 4-16 rows
    (the blocked kernel switched off). Returns the rows that take a packed kernel under it."""
    if request.param == "blocked":
        if blocked_gemm.kernel() is None:
            pytest.skip(f"no blocked kernel here: {blocked_gemm.unavailable_reason()}")
    else:
        monkeypatch.setenv("SPEC_ENGINE_BLOCKED_GEMM", "0")
    blocked_gemm.reset()
    yield list(range(1 if request.param == "blocked" else cpu_gemm.MIN_ROWS, cpu_gemm.MAX_ROWS + 1))
    monkeypatch.undo()
    blocked_gemm.reset()


@pytest.fixture
def packed_calls(monkeypatch):
    """Row counts of every call that took a packed product (MKL's or the blocked kernel's)."""
    calls, real_mkl, real_blocked = [], cpu_gemm.packed_product, blocked_gemm.product

    def counting_mkl(x, packed, weight, bias, rows):
        calls.append(rows)
        return real_mkl(x, packed, weight, bias, rows)

    def counting_blocked(x, packed, bias, out_features, built=None):
        calls.append(x.numel() // x.shape[-1])
        return real_blocked(x, packed, bias, out_features, built)
    monkeypatch.setattr(cpu_gemm, "packed_product", counting_mkl)
    monkeypatch.setattr(blocked_gemm, "product", counting_blocked)
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_linear_for_every_row_count(bias, static_rule, packed_calls):
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).requires_grad_(False)
    reference = copy.deepcopy(linear)
    PackedLinear.wrap(linear)
    with torch.no_grad(), batched_gemm():
        for rows in range(1, 21):
            for shape in ((rows, 96), (1, rows, 96)):
                x = torch.randn(shape)
                torch.testing.assert_close(linear(x), reference(x), rtol=1e-5, atol=1e-5)
    beyond = list(range(cpu_gemm.MAX_ROWS + 1, 21)) if 1 in static_rule else []   # the blocked kernel's many-row tiles
    assert sorted(set(packed_calls)) == static_rule + beyond


@pytest.mark.skipif(not cpu_gemm.bf16_available(), reason="this CPU has no oneDNN bf16 product")
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_packed_linear_equals_bf16_linear_for_every_row_count(bias, monkeypatch):
    """bf16 weights take the blocked kernel's bf16 twin up to MAX_ROWS rows where the CPU has AVX-512 BF16
    (native_layers.bf16_product) and oneDNN's product on reordered weights otherwise, inside the engine's block only,
    with the same numbers as F.linear in bf16 either way."""
    from spec_engine.accel import native_layers
    twin = native_layers.library() is not None and native_layers.library().bf16
    calls, real = [], cpu_gemm.onednn_product
    monkeypatch.setattr(cpu_gemm, "onednn_product", lambda x, *a: calls.append(x.shape[-2]) or real(x, *a))
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16).requires_grad_(False)
    reference = copy.deepcopy(linear)
    PackedLinear.wrap(linear)
    with torch.no_grad():
        linear(torch.randn(3, 96, dtype=torch.bfloat16))                         # outside: stock
        with batched_gemm():
            for rows in (1, 2, 3, 4, 9, 17, 40):
                for shape in ((rows, 96), (1, rows, 96)):
                    x = torch.randn(shape, dtype=torch.bfloat16)
                    torch.testing.assert_close(linear(x), reference(x), rtol=0, atol=0)
    assert calls == [rows for rows in (1, 2, 3, 4, 9, 17, 40) for _ in range(2) if not twin or rows > cpu_gemm.MAX_ROWS]


def test_packed_weights_only_inside_the_engines_block(static_rule, packed_calls):
    linear = PackedLinear.wrap(nn.Linear(32, 48).requires_grad_(False))
    x = torch.randn(5, 32)
    with torch.no_grad():
        linear(x)                          # e.g. Hugging Face generate() on the same model object
        with batched_gemm():
            linear(x)
        linear(x)
    with batched_gemm():
        linear(x)                          # autograd on: training code never sees the packed copy
    assert packed_calls == [5]


def test_packed_on_first_use_and_never_served_stale(static_rule, packed_calls):
    linear = PackedLinear.wrap(nn.Linear(32, 48).requires_grad_(False))
    x = torch.randn(6, 32)
    with torch.no_grad(), batched_gemm():
        linear(x[:1])
        if 1 not in static_rule:
            assert linear.packed is None                   # under MKL's rule one row never needs the copy
        linear(x)
        first = linear.packed
        assert first is not None
        linear(x)
        assert linear.packed is first                      # packed once
        linear.weight.mul_(2.0)
        out = linear(x)
    assert linear.packed is not first
    torch.testing.assert_close(out, x @ linear.weight.T + linear.bias)
    assert packed_calls == [1] * (1 in static_rule) + [6, 6, 6]


def tiny_llama():
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


def test_pack_linears_keeps_tied_weights_and_outputs(static_rule, packed_calls):
    model = tiny_llama()
    reference = copy.deepcopy(model)
    n_linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model) == sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == n_linears
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = list(range(10, 18))
    for keep in (1, 8):
        out = forward_logits(model, ids, new_cache(model), keep)
        torch.testing.assert_close(out, forward_logits(reference, ids, new_cache(reference), keep),
                                   rtol=1e-4, atol=1e-4)
    assert 8 in packed_calls


def test_pack_linears_declines_what_it_cannot_serve(monkeypatch):
    assert pack_linears(tiny_llama(), max_bytes=1024) == 0                     # over the memory budget
    assert pack_linears(tiny_llama().to(torch.float16)) == 0                   # fp32 (MKL) and bf16 (oneDNN) only
    monkeypatch.setenv("SPEC_ENGINE_PACKED_GEMM", "0")
    blocked_gemm.reset()
    model = tiny_llama()
    assert pack_linears(model) == 0 and not any(isinstance(m, PackedLinear) for m in model.modules())
    monkeypatch.undo()
    blocked_gemm.reset()


def test_a_model_off_the_cpu_builds_no_kernel(monkeypatch):
    """pack_linears, prepack and the speed layer's adopt / warm check the device before anything that may compile
    the blocked kernel: a model on an accelerator (meta stands in here) never needs it. The builder is made to fail."""
    from spec_engine.accel import CpuSpeedLayer, native

    def no_build(*args, **kwargs):
        raise AssertionError("built a CPU kernel for a model off the CPU")
    monkeypatch.setattr(blocked_gemm, "kernel", no_build)
    monkeypatch.setattr(native, "compile_library", no_build)
    model = tiny_llama().to("meta")
    assert pack_linears(model) == 0 and not any(isinstance(m, PackedLinear) for m in model.modules())
    layer = CpuSpeedLayer()
    assert layer.adopt(model) is None
    layer.warm(model)
    assert cpu_gemm.prepack(model) == 0
    monkeypatch.undo()
    packed = tiny_llama()
    pack_linears(packed)                      # wrapped on the CPU, then moved: nothing to pack either
    packed.to("meta")
    monkeypatch.setattr(blocked_gemm, "kernel", no_build)
    assert cpu_gemm.prepack(packed) == 0


def test_the_offline_default_scores_the_same_packed(smollm2, static_rule, packed_calls):
    """A verify forward of 1-12 tokens on SmolLM2-135M: packed (the engine's path) against stock F.linear."""
    model = smollm2.model
    assert any(isinstance(m, PackedLinear) for m in model.modules())
    prompt = smollm2.encode_prompt("Name three rivers in Europe.")[0].tolist()
    seen = []                                   # row counts of the verify forwards' packed calls
    for n in range(1, 13):
        tokens = list(range(1000, 1000 + n))
        cache = new_cache(model)
        forward_logits(model, prompt, cache, 1)
        del packed_calls[len(seen):]            # the prompt's rows (many-row blocks take the blocked kernel too)
        packed = forward_logits(model, tokens, cache, n)                          # [n, vocab]
        seen = list(packed_calls)
        with torch.inference_mode():
            stock = model(torch.tensor([prompt + tokens]), logits_to_keep=n).logits[0]
        torch.testing.assert_close(packed, stock, rtol=0, atol=2e-3)
        assert torch.equal(packed.argmax(-1), stock.argmax(-1))
    assert set(seen) == set(static_rule) & set(range(1, 13))


@pytest.mark.measured_costs
def test_prepack_and_the_apps_warm_up_pack_the_default_target_only():
    """The pinned target is packed and its verify-cost curve measured at warm-up (spec_engine/drafters/sizing.py); a
    draft is neither."""
    from types import SimpleNamespace

    from spec_engine.accel.cpu_gemm import prepack
    from ui.playground.registry import warm_up
    target, draft = tiny_llama(), tiny_llama()
    pack_linears(target), pack_linears(draft)
    layers = lambda model: [m for m in model.modules() if isinstance(m, PackedLinear)]
    warm_up(SimpleNamespace(model=draft, device=torch.device("cpu")))
    warm_up(SimpleNamespace(model=target, device=torch.device("cpu")), prepack=True)
    assert all(m.packed is None for m in layers(draft))             # a draft-only model never pays the memory
    assert all(m.packed is not None for m in layers(target))
    assert not hasattr(draft, "_spec_engine_verify_costs")          # and only the target's cost curve is measured
    assert [len(curve) for curve in target._spec_engine_verify_costs.values()] == [18]   # one thread count
    assert prepack(draft) == len(layers(draft)) and all(m.packed is not None for m in layers(draft))


@pytest.mark.slow
def test_verify_cost_benchmark_writes_its_table(tmp_path):
    """bench/verify_cost.py runs end to end (timings are its output, never asserted here)."""
    from bench import verify_cost
    verify_cost.main(["--repeats", "1", "--tokens", "1", "4", "--context", "8", "--out", str(tmp_path / "cost")])
    rows = __import__("json").loads((tmp_path / "cost.json").read_text())["rows"]
    assert [r["tokens"] for r in rows] == [1, 4] and rows[0]["stock"] == 1.0
    assert "| 4 |" in (tmp_path / "cost.md").read_text()


def test_a_packed_model_can_be_copied(static_rule, packed_calls):
    """The benchmark gives Hugging Face a deep copy of a cross-tokenizer draft; MKL's packed tensor cannot be copied."""
    model = tiny_llama()
    pack_linears(model)
    from spec_engine.accel.cpu_gemm import prepack
    prepack(model)
    twin = copy.deepcopy(model)
    assert all(m.packed is None for m in twin.modules() if isinstance(m, PackedLinear))
    ids = list(range(20, 26))
    torch.testing.assert_close(forward_logits(twin, ids, new_cache(twin), 6),
                               forward_logits(model, ids, new_cache(model), 6))
    assert all(m.packed is not None for m in twin.modules() if isinstance(m, PackedLinear))


@pytest.mark.parametrize("bias", [True, False])
def test_every_fp32_kernel_equals_linear_for_every_row_count(bias, monkeypatch):
    """Each kernel a plan may pick gives F.linear's numbers (float rounding) at every row count, and the plan decides
    which one runs."""
    calls = []
    for module, name in ((cpu_gemm, "packed_product"), (cpu_gemm, "onednn_product"), (blocked_gemm, "product")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).requires_grad_(False)
    reference = copy.deepcopy(linear)
    PackedLinear.wrap(linear)
    for kernel in cpu_gemm.fp32_kernels():
        cpu_gemm._PLANS[cpu_gemm.plan_key(linear)] = (kernel,) * cpu_gemm.PLAN_LENGTH
        calls.clear()
        with torch.no_grad(), batched_gemm():
            for rows in range(1, cpu_gemm.MAX_ROWS + 1):
                x = torch.randn(1, rows, 96)
                torch.testing.assert_close(linear(x), reference(x), rtol=1e-5, atol=1e-5)
        expected = {"linear": [], "mkl": ["packed_product"], "onednn": ["onednn_product"],
                    "blocked": ["product"]}[kernel]
        assert calls == expected * cpu_gemm.MAX_ROWS, kernel


@pytest.mark.parametrize("bias", [True, False])
def test_every_block_kernel_equals_linear_and_the_plan_picks_it(bias, monkeypatch):
    """Blocks of more than MAX_ROWS rows (a prefill's) take the plan's last entry: F.linear, oneDNN on the module's
    own weight (no copy kept) or the blocked kernel, each giving F.linear's numbers (float rounding)."""
    calls = []
    for module, name in ((cpu_gemm, "onednn_product"), (blocked_gemm, "product")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: calls.append((_name, a[1])) or _real(*a))
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).requires_grad_(False)
    reference = copy.deepcopy(linear)
    PackedLinear.wrap(linear)
    for kernel in cpu_gemm.block_kernels():
        cpu_gemm._PLANS[cpu_gemm.plan_key(linear)] = ("linear",) * (cpu_gemm.PLAN_LENGTH - 1) + (kernel,)
        calls.clear()
        with torch.no_grad(), batched_gemm():
            for rows in (cpu_gemm.MAX_ROWS + 1, 40, cpu_gemm.BLOCK_ROWS, 300):
                x = torch.randn(1, rows, 96)
                torch.testing.assert_close(linear(x), reference(x), rtol=1e-5, atol=1e-5)
            linear(torch.randn(1, cpu_gemm.MAX_ROWS, 96))           # a row count's entry (F.linear), not the block's
        expected = {"linear": [], "onednn_direct": ["onednn_product"], "blocked": ["product"]}[kernel]
        assert [name for name, _ in calls] == expected * 4, kernel
        if kernel == "onednn_direct":
            assert all(weight is linear.weight for _, weight in calls)      # the module's own weight: no copy
            assert "onednn" not in (linear.packed or {})


def test_tune_measures_a_plan_per_shape_keeps_it_and_prepack_follows_it(monkeypatch, tmp_path):
    model = tiny_llama()
    pack_linears(model)
    shapes = {cpu_gemm.plan_key(m) for m in model.modules() if isinstance(m, PackedLinear)}
    monkeypatch.setenv("SPEC_ENGINE_GEMM_TUNE", "1")
    assert cpu_gemm.prepack(model)
    plans = dict(cpu_gemm._PLANS)
    assert set(plans) == shapes
    for plan in plans.values():
        assert len(plan) == cpu_gemm.PLAN_LENGTH and set(plan[1:-1]) <= set(cpu_gemm.fp32_kernels())
        assert plan[-1] in cpu_gemm.block_kernels()
    # the kernels a plan picks are packed now, the others never
    for m in model.modules():
        if isinstance(m, PackedLinear):
            assert set(m.packed or {}) == set(plans[cpu_gemm.plan_key(m)][1:]) - set(cpu_gemm.COPYLESS)
    # kept in the cache folder: a new process (no plans in memory) reads them back without measuring
    saved = json.loads((tmp_path / "cache" / cpu_gemm.PLANS_FILE).read_text())
    assert list(saved) == [cpu_gemm.machine_key()] and len(saved[cpu_gemm.machine_key()]) == len(shapes)
    monkeypatch.setattr(cpu_gemm, "_PLANS", {})
    monkeypatch.setattr(cpu_gemm, "measure_plan", lambda *a: pytest.fail("measured again"))
    assert cpu_gemm.tune([m for m in model.modules() if isinstance(m, PackedLinear)]) == plans


def test_an_unreadable_plans_file_is_measured_again(monkeypatch, tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / cpu_gemm.PLANS_FILE).write_text("{not json")
    linear = PackedLinear.wrap(nn.Linear(32, 48).requires_grad_(False))
    made = cpu_gemm.tune([linear])
    assert set(made) == {cpu_gemm.plan_key(linear)}
    assert cpu_gemm.machine_key() in json.loads((folder / cpu_gemm.PLANS_FILE).read_text())
    assert cpu_gemm.tune([linear]) == {}                   # planned already: nothing to do


def test_without_tuning_prepack_keeps_the_static_rule(monkeypatch, static_rule):
    monkeypatch.setenv("SPEC_ENGINE_GEMM_TUNE", "0")
    model = tiny_llama()
    pack_linears(model)
    cpu_gemm.prepack(model)
    assert cpu_gemm._PLANS == {}
    expected = (["blocked"] * 5 if 1 in static_rule else ["linear", "linear", "mkl", "mkl", "linear"])
    assert [cpu_gemm.kernel_for(model.lm_head, rows) for rows in (1, 3, 4, 16, 17)] == expected
    assert set(model.lm_head.packed) == set(expected) - {"linear"}


@pytest.mark.skipif(not cpu_gemm.onednn_available(), reason="this torch has no oneDNN")
def test_the_offline_default_is_greedy_identical_under_a_mixed_plan(smollm2, monkeypatch):
    """Plain decoding and the engine (eagle+lookup, k = 3 and 6) give the same greedy tokens on SmolLM2-135M when
    one row takes MKL's packed product, 2+ rows oneDNN's (the plan measured on an AMD EPYC) and the prompt's prefill
    oneDNN on the plain weights, so the kernels' float rounding stays within what greedy identity tolerates here."""
    import spec_engine as se
    mixed = ("linear", "mkl") + ("onednn",) * (cpu_gemm.MAX_ROWS - 1) + ("onednn_direct",)
    for m in list(smollm2.model.modules()) + smollm2.model._spec_engine_lean.linears():
        if isinstance(m, PackedLinear):
            cpu_gemm._PLANS[cpu_gemm.plan_key(m)] = mixed
    greedy = se.SamplingParams(temperature=0.0)
    ids = smollm2.encode_prompt("Write a Python function that returns the n-th Fibonacci number.")
    blocks, real = [], cpu_gemm.onednn_product
    monkeypatch.setattr(cpu_gemm, "onednn_product",
                        lambda x, *a: blocks.append(x.numel() // x.shape[-1]) or real(x, *a))
    plain = se.autoregressive_generate(smollm2.model, ids, 40, greedy).tokens
    assert ids.shape[1] > cpu_gemm.MAX_ROWS and set(blocks) == {ids.shape[1]}     # its prefill took the block kernel
    decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter("eagle+lookup", smollm2))
    for k in (3, 6):
        assert decoder.generate(ids, k=k, max_new_tokens=40, sampling=greedy).tokens == plain


def test_kernel_cost_benchmark_writes_its_table(tmp_path):
    """bench/kernel_cost.py runs end to end over every kernel this machine has (timings never asserted)."""
    from bench import kernel_cost
    result = kernel_cost.main(["--layers", "1", "--rows", "1", "3", "--passes", "1", "--out", str(tmp_path / "k")])
    assert set(result["ms"]) == set(cpu_gemm.fp32_kernels()) | set(cpu_gemm.block_kernels())
    assert "| linear |" in (tmp_path / "k.md").read_text()


def test_plans_are_measured_again_when_the_candidate_kernels_change(monkeypatch):
    """A plan saved before the blocked kernel existed (or where it failed to build) is not reused once it can
    compete: the candidate kernels are part of the key the plans are kept under."""
    key = cpu_gemm.machine_key()
    monkeypatch.setattr(cpu_gemm, "fp32_kernels", lambda: ["linear", "mkl"])
    assert cpu_gemm.machine_key() != key


def test_a_plan_leaves_the_static_rule_only_for_a_kernel_clearly_faster():
    """Noise on a shared host had handed single row counts to F.linear or oneDNN at twice the blocked kernel's cost;
    a challenger now needs to take at most TUNE_MARGIN of the static rule's time."""
    kernels = ["linear", "mkl", "onednn", "blocked"]
    noisy = {"linear": 1.0, "mkl": 1.1, "onednn": 0.95, "blocked": 1.0}
    assert cpu_gemm.pick(kernels, noisy, "blocked") == "blocked"
    clear = {"linear": 1.0, "mkl": 1.1, "onednn": 0.8, "blocked": 1.0}
    assert cpu_gemm.pick(kernels, clear, "blocked") == "onednn"
    tie = {"linear": 0.5, "mkl": 0.5, "onednn": 1.0, "blocked": 1.0}
    assert cpu_gemm.pick(kernels, tie, "blocked") == "linear"            # F.linear wins a tie among challengers
    assert cpu_gemm.pick(["linear", "mkl"], {"linear": 1.0, "mkl": 0.9}, "blocked") == "linear"   # not built here


def test_plans_measured_under_the_old_rule_are_measured_again(monkeypatch):
    """The rule is part of the saved plans' key, so a machine's plans from before the margin are not reused."""
    key = cpu_gemm.machine_key()
    monkeypatch.setattr(cpu_gemm, "PLAN_RULE", "v1")
    assert cpu_gemm.machine_key() != key
