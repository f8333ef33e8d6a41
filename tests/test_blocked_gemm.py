"""The engine's own fp32 kernel (spec_engine/accel/blocked_gemm.py): F.linear's numbers within float rounding for every
shape and row count, each row's result bitwise independent of the other rows in the call (batch invariance), for
both instruction-set builds and one or two threads; checked inputs; cleanly unavailable without a compiler."""
import pytest
import torch
import torch.nn.functional as F

from spec_engine.accel import blocked_gemm, cpu_gemm, native

ISAS = [isa for isa in ("avx512", "avx2") if blocked_gemm.native_isa() == "avx512" or isa == blocked_gemm.native_isa()]
pytestmark = pytest.mark.skipif(not ISAS or blocked_gemm.kernel(ISAS[0]) is None,
                                reason=f"no blocked kernel here: {blocked_gemm.unavailable_reason()}")

# (out, in): whole blocks, a partial last block, fewer outputs than one block, inputs not a multiple of a vector
SHAPES = [(128, 64), (200, 96), (7, 5), (130, 577)]


@pytest.fixture(params=ISAS)
def built(request):
    return blocked_gemm.kernel(request.param)


def test_pack_puts_each_block_of_outputs_input_major_and_pads_with_zeros(built):
    width = built.block_width
    weight = torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5) + 1          # [out 3, in 5]
    packed = blocked_gemm.pack(weight, built)
    assert packed.shape == (1, 5, width)                                            # [blocks, in, width]
    torch.testing.assert_close(packed[0, :, :3], weight.T, rtol=0, atol=0)
    assert not packed[0, :, 3:].any()
    weight = torch.randn(width + 1, 4)
    packed = blocked_gemm.pack(weight, built)
    assert packed.shape == (2, 4, width) and torch.equal(packed[1, :, 0], weight[width])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_product_equals_linear_for_every_shape_and_row_count(built, bias, threads):
    generator = torch.Generator().manual_seed(0)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features, generator=generator)
            bias_values = torch.randn(out_features, generator=generator) if bias else None
            packed = blocked_gemm.pack(weight, built)
            for rows in range(0, 21):
                x = torch.randn(1, rows, in_features, generator=generator)              # [batch, rows, in]
                y = blocked_gemm.product(x, packed, bias_values, out_features, built)
                assert y.shape == (1, rows, out_features)
                # one fp32 FMA chain over `in` terms of size ~1: rounding grows like sqrt(in) ulps of the sum
                torch.testing.assert_close(y, F.linear(x, weight, bias_values), rtol=1e-5,
                                           atol=1e-5 * in_features ** 0.5)
    finally:
        torch.set_num_threads(previous)


def test_each_output_is_bitwise_the_same_whatever_the_thread_count(built):
    """Which thread computes a column block changes with the thread count (9 blocks: 5 / 4 at two threads, 3 / 3 / 3
    at three): every output must still be the same FMA chain, bit for bit, at 1, 2 and 3 threads, with and without a
    bias, for whole and partial blocks."""
    generator = torch.Generator().manual_seed(2)
    previous = torch.get_num_threads()
    try:
        for out_features, in_features in [(9 * built.block_width, 40), (15 * built.block_width, 24), (100, 33)]:
            weight = torch.randn(out_features, in_features, generator=generator)
            bias = torch.randn(out_features, generator=generator)
            packed = blocked_gemm.pack(weight, built)
            for rows in (1, 5, 8, 13):
                x = torch.randn(rows, in_features, generator=generator)
                results = []
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    results.append((blocked_gemm.product(x, packed, None, out_features, built),
                                    blocked_gemm.product(x, packed, bias, out_features, built)))
                for plain, biased in results[1:]:
                    assert torch.equal(plain, results[0][0]) and torch.equal(biased, results[0][1]), \
                        (out_features, rows)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_each_rows_result_is_bitwise_independent_of_the_other_rows(built, threads):
    """Row r of a call over n rows equals, bit for bit, the same row multiplied alone, for every n up to 20
    (row blocks of every size the kernel splits into), so a verify forward gives each position a one-token
    forward's numbers."""
    generator = torch.Generator().manual_seed(1)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        weight = torch.randn(200, 96, generator=generator)
        packed = blocked_gemm.pack(weight, built)
        x = torch.randn(20, 96, generator=generator)
        alone = torch.cat([blocked_gemm.product(x[r:r + 1], packed, None, 200, built) for r in range(20)])
        for rows in range(1, 21):
            together = blocked_gemm.product(x[:rows], packed, None, 200, built)
            assert torch.equal(together, alone[:rows]), rows
    finally:
        torch.set_num_threads(previous)


def test_product_refuses_what_does_not_match_the_packed_weight(built):
    """The C function trusts its pointers, so shapes and dtypes are checked before the call."""
    packed = blocked_gemm.pack(torch.randn(40, 16), built)
    with pytest.raises(ValueError, match="do not match"):
        blocked_gemm.product(torch.randn(2, 17), packed, None, 40, built)         # wrong input size
    with pytest.raises(ValueError, match="do not match"):
        blocked_gemm.product(torch.randn(2, 16), packed, None, 40 + built.block_width, built)
    with pytest.raises(ValueError, match="do not match"):
        blocked_gemm.product(torch.randn(2, 16, dtype=torch.float64), packed, None, 40, built)
    with pytest.raises(ValueError, match="do not match"):
        blocked_gemm.product(torch.randn(2, 16), packed, torch.randn(39), 40, built)


def test_without_a_compiler_it_is_unavailable_and_the_engine_keeps_its_other_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(blocked_gemm, "_BUILT", {})
    monkeypatch.setattr(blocked_gemm, "_REASONS", {})
    monkeypatch.setenv("SPEC_ENGINE_CACHE", str(tmp_path))                      # nothing built there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="unavailable"):
        assert blocked_gemm.kernel() is None
    assert "no-such-compiler" in blocked_gemm.unavailable_reason()
    assert "blocked" not in cpu_gemm.fp32_kernels()
    assert cpu_gemm.static_kernel(1) == "linear"
    assert cpu_gemm.static_kernel(4) == ("mkl" if cpu_gemm.available() else "linear")


def test_a_failed_build_says_what_the_compiler_said(monkeypatch, tmp_path):
    monkeypatch.setattr(blocked_gemm, "_BUILT", {})
    monkeypatch.setattr(blocked_gemm, "_REASONS", {})
    monkeypatch.setenv("SPEC_ENGINE_CACHE", str(tmp_path))
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(blocked_gemm, "SOURCE", broken)
    with pytest.warns(RuntimeWarning):
        assert blocked_gemm.kernel(ISAS[0]) is None
    assert "failed" in blocked_gemm._REASONS[ISAS[0]]
    assert not list((tmp_path / "kernels").glob("*.tmp"))                       # no half-written library left


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(blocked_gemm, "_BUILT", dict(blocked_gemm._BUILT))
    for variable in ("SPEC_ENGINE_BLOCKED_GEMM", "SPEC_ENGINE_PACKED_GEMM"):
        with monkeypatch.context() as patch:
            patch.setenv(variable, "0")
            blocked_gemm.reset()
            assert blocked_gemm.kernel() is None and "switched off" in blocked_gemm.unavailable_reason()
    blocked_gemm.reset()
    assert blocked_gemm.kernel() is not None


def test_a_built_library_is_reused(monkeypatch):
    """The library is compiled once per source and instruction set; later processes load it from the cache."""
    path = blocked_gemm.build(ISAS[0])
    assert path.exists()
    monkeypatch.setattr(native.subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
    assert blocked_gemm.build(ISAS[0]) == path
