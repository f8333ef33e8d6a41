"""What each fp32 product kernel costs on this CPU for a forward's worth of layer products: SmolLM2-135M's 30 layers
as the lean forward multiplies them (q|k|v 960 x 576, o 576 x 576, gate|up 3072 x 576, down 576 x 1536), random
weights of those shapes (their values do not change the time), streamed from memory as a forward streams them.
Every kernel cpu_gemm can pick (F.linear, MKL packed, oneDNN on reordered weights, the blocked kernel, and for
a prefill's blocks oneDNN on the plain weights), at each row count, interleaved, the fastest of `--passes` passes;
milliseconds per forward's worth.

    python -m bench.kernel_cost --threads 1 --out bench/results/kernel-cost-fp32-epyc
    python -m bench.kernel_cost --threads 2 --rows 16 32 64 128 --out bench/results/kernel-cost-blocks-2threads-epyc
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spec_engine.accel import blocked_gemm, cpu_gemm

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]    # (out, in) per layer, lean forward's products


def product(kernel: str, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    if kernel == "linear":
        return F.linear(x, weight)
    if kernel == "mkl":
        return cpu_gemm.packed_product(x, packed, weight, None, x.shape[0])
    if kernel == "onednn":
        return cpu_gemm.onednn_product(x, packed, None, weight.shape[0])
    if kernel == "onednn_direct":
        return cpu_gemm.onednn_product(x, weight, None, weight.shape[0])
    return blocked_gemm.product(x, packed, None, weight.shape[0])


@torch.inference_mode()
def measure(kernels: list[str], rows: list[int], layers: int, passes: int) -> dict[str, dict[int, float]]:
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inp, generator=generator) * 0.05 for _ in range(layers) for out, inp in LAYER_SHAPES]
    packed = {kernel: [None if kernel in cpu_gemm.COPYLESS else cpu_gemm.pack_weight(w, kernel) for w in weights]
              for kernel in kernels}
    fastest = {kernel: {n: float("inf") for n in rows} for kernel in kernels}
    for _ in range(passes):
        for n in rows:
            inputs = {inp: torch.randn(n, inp, generator=generator) for inp in {inp for _, inp in LAYER_SHAPES}}
            for kernel in kernels:
                start = time.perf_counter()
                for weight, copy in zip(weights, packed[kernel]):
                    product(kernel, inputs[weight.shape[1]], weight, copy)
                fastest[kernel][n] = min(fastest[kernel][n], time.perf_counter() - start)
    return {kernel: {n: seconds * 1e3 for n, seconds in by_rows.items()} for kernel, by_rows in fastest.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 9, 12, 16])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = cpu_gemm.fp32_kernels() + [k for k in cpu_gemm.block_kernels() if k not in cpu_gemm.fp32_kernels()]
    ms = measure(kernels, args.rows, args.layers, args.passes)
    lines = [f"| kernel | {' | '.join(str(n) for n in args.rows)} |", "|---" * (len(args.rows) + 1) + "|"]
    lines += [f"| {kernel} | {' | '.join(f'{ms[kernel][n]:.1f}' for n in args.rows)} |" for kernel in kernels]
    lines.append(f"\nms for {args.layers * len(LAYER_SHAPES)} layer products by rows, {args.threads} thread(s), "
                 f"fastest of {args.passes} passes; {torch.backends.cpu.get_cpu_capability()}, "
                 f"torch {torch.__version__}")
    table = "\n".join(lines)
    print(table)
    result = {"threads": args.threads, "layers": args.layers, "passes": args.passes, "rows": args.rows, "ms": ms,
              "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(table + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
