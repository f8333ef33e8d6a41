"""How far batching can go on this CPU: the FMA peak against what a batch's forward costs. Not a test.

    python -m bench.batch_ceiling --threads 2 --out bench/results/batch-ceiling-2threads

Plain decoding at batch 1 reads every weight once per token, so it runs at the memory's pace; at batch B one read
serves B tokens and the forward's arithmetic (2 x weights x B FLOPs) takes over. However good the kernel, a forward
over B rows cannot take less than that arithmetic over the cores' FMA peak. This script measures, in one process:

    peak       the FMA peak (GFLOP/s) of a compiled loop of independent fused multiply-adds, at `--threads`
    products   the model's 120 layer products and its LM head through the engine's blocked kernel at 1 and B rows
    forward    the engine's packed forward (core/packed.py) over 1 and B sequences of one row after `--context`
               cached tokens each (attention, norms and the rest included)

and prints the ceiling on batch B's decode throughput over batch 1's: B x forward(1) / (arithmetic(B) / peak).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from pathlib import Path

import torch

import spec_engine as se
from spec_engine.accel import blocked_gemm, lean_llama, native
from spec_engine.core.cache import cache_len, new_cache
from spec_engine.core.packed import Segment, forward_packed
from spec_engine.models.presets import default_model_name

# 24 independent accumulators (the FMA latency times the pipes, with room), each a chain of fused multiply-adds on
# registers only: what the cores' FMA units can do, with no memory in the way.
PEAK_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
extern "C" double fma_peak(long iterations, int threads) {
  double total = 0.0;
  #pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    __m512 acc[24];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iterations; n++)
      for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 sum = acc[0];
    for (int i = 1; i < 24; i++) sum = _mm512_add_ps(sum, acc[i]);
    total += _mm512_reduce_add_ps(sum);
  }
  return total;
}
"""


def fma_peak(threads: int, iterations: int = 20_000_000) -> float:
    """GFLOP/s of `threads` threads each running 24 chains of 512-bit FMAs (16 lanes x 2 FLOPs each)."""
    source = native.cache_root() / "kernels" / "fma_peak.cpp"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(PEAK_SOURCE)
    built = native.load_library(native.compile_library(source, "fma_peak", [*native.BASE_FLAGS, "-fopenmp",
                                                                            "-mavx512f", "-mfma"]))
    built.fma_peak.restype, built.fma_peak.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int]
    built.fma_peak(iterations // 10, threads)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        built.fma_peak(iterations, threads)
        best = max(best, threads * iterations * 24 * 16 * 2 / (time.perf_counter() - start) / 1e9)
    return best


def median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def products_ms(model, rows: int) -> tuple[float, float]:
    """(ms of the stack's products over `rows` rows, GFLOP of them), LM head included, by the blocked kernel."""
    lean = lean_llama.lean_layers(model)
    linears = [model.lm_head]
    for layer in model.model.layers:
        fused = lean.fused[layer]
        linears += [fused.qkv_proj, layer.self_attn.o_proj, fused.gate_up_proj, layer.mlp.down_proj]
    packed = [(linear.packed_weight("blocked"), linear.bias, linear.out_features, linear.in_features)
              for linear in linears]
    inputs = {k: torch.randn(1, rows, k) for k in {p[3] for p in packed}}

    def run():
        for weight, bias, out_features, in_features in packed:
            blocked_gemm.product(inputs[in_features], weight, bias, out_features)
    return median_ms(run), sum(2 * rows * p[2] * p[3] for p in packed) / 1e9


def forward_ms(model, sequences: int, context: int) -> float:
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    caches = []
    for _ in range(sequences):
        cache = new_cache(model)
        forward_packed(model, [Segment(torch.randint(0, vocab, (context,), generator=generator).tolist(), cache, 1)])
        caches.append(cache)

    def run():
        forward_packed(model, [Segment([5], cache, 1) for cache in caches])
        for cache in caches:
            cache.crop(context - cache_len(cache))
    return median_ms(run)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--out", default=None, help="write OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = os.getloadavg()[0]
    target = se.load_model(default_model_name())
    se.prepare(target.model)
    peak = fma_peak(args.threads)
    one_ms, one_gflop = products_ms(target.model, 1)
    many_ms, many_gflop = products_ms(target.model, args.batch)
    step_ms, batch_ms = forward_ms(target.model, 1, args.context), forward_ms(target.model, args.batch, args.context)
    floor_ms = many_gflop / peak * 1e3
    lines = [f"python -m bench.batch_ceiling --threads {args.threads} --batch {args.batch} --context {args.context}",
             "", f"load average (1 min) before/after: {before:.2f} / {os.getloadavg()[0]:.2f}; speed layer "
             f"{se.speed_layer()}", "",
             "| measured | value |", "|---|---|",
             f"| FMA peak, {args.threads} threads | {peak:.0f} GFLOP/s |",
             f"| products (120 layer + LM head), 1 row | {one_ms:.1f} ms ({one_gflop / one_ms * 1e3:.0f} GFLOP/s) |",
             f"| products, {args.batch} rows | {many_ms:.1f} ms ({many_gflop / many_ms * 1e3:.0f} GFLOP/s, "
             f"{many_gflop / many_ms * 1e3 / peak:.0%} of peak) |",
             f"| packed forward, 1 sequence x 1 row | {step_ms:.1f} ms |",
             f"| packed forward, {args.batch} sequences x 1 row | {batch_ms:.1f} ms |",
             f"| batch {args.batch} decode throughput over batch 1 (these forwards) | "
             f"x{args.batch * step_ms / batch_ms:.2f} |",
             f"| arithmetic of {args.batch} rows at the FMA peak | {floor_ms:.1f} ms |",
             f"| ceiling: batch {args.batch} over batch 1 if the forward were its products at peak | "
             f"x{args.batch * step_ms / floor_ms:.2f} |"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
