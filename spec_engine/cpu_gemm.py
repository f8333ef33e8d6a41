"""Cheaper products on the CPU: MKL's packed GEMM for the linear layers of an fp32 model (batched verification),
and oneDNN's product on reordered weights for a bf16 one (every forward).

Why this exists (measured here: torch 2.13 CPU, MKL 2024.2, one thread, SmolLM2-135M in fp32, weights far larger
than the caches): `F.linear` (MKL sgemm) on a few rows costs far more than reading the weights once. A forward
over 3 tokens costs 1.2x a 1-token forward, but 4 tokens cost 1.6x and 9 tokens 2.2x; one 1536 x 576 layer
alone steps up at 4 and 7 rows. Packing each weight once with MKL (`cblas_sgemm_pack`, reached
through `torch.ops.mkl._mkl_reorder_linear_weight` / `_mkl_linear`, the ops inductor's CPU weight freezing
emits) brings a 4-token forward to 1.3x and 9 tokens to 2.0x (bench/verify_cost.py, results in
bench/results/verify-cost-fp32.md), so verifying k = 3..8 draft tokens gets cheaper while plain decoding (one row)
is untouched. Inductor emits these ops only from `torch.compile` with weight
freezing, which compiles per input shape; no maintained library applies them to eager transformers modules, so
it is done here, by hand, for the row counts where it measured faster (4 to 16; prefill blocks of 32 rows and
more are faster unpacked).

It is scoped: packed weights are used only inside `batched_gemm()`, which the engine's own forwards enter
(`cache.forward_logits`). Anything else calling the same model object (Hugging Face `generate` in the benchmark,
training code) runs the stock `F.linear`, so comparisons against other implementations stay fair.
Numerics: the packed product differs from `F.linear` by float rounding only (|d logit| ~ 5e-5 here, the same
size as the difference between a batched and a one-token forward); greedy identity tests cover it.

bf16: `F.linear` in bf16 is no faster than fp32 here (it does not reach the CPU's bf16 dot products), so a bf16
model gained nothing from its smaller weights. oneDNN's product on weights reordered once (`mkldnn::
_reorder_linear_weight` / `_linear_pointwise`, the ops inductor's bf16 CPU freezing emits) returns the same numbers
as `F.linear` in bf16 and costs ~0.7 of it for 1-4 rows (120 layers of 1536 x 576: 19 ms against 28 ms, fp32 30 ms),
so a bf16 SmolLM2-135M forward takes ~38 ms against fp32's ~46 ms. It serves every row count, on CPUs with bf16 dot
products (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`), scoped the same way.
"""
from __future__ import annotations

import contextlib
import contextvars
import os

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS, MAX_ROWS = 4, 16            # rows per call where the packed product measured faster than F.linear
MAX_PACKED_BYTES = 2 << 30            # a second copy of the weights: skip models whose linear weights exceed 2 GiB
ENGINE_LINEARS = "_spec_engine_lean"  # an attribute whose `.linears()` the engine also multiplies by (lean_llama.py)
_ENABLED = contextvars.ContextVar("spec_engine_batched_gemm", default=False)


def available() -> bool:
    """MKL's packed sgemm is compiled into this torch, and not switched off by SPEC_ENGINE_PACKED_GEMM=0."""
    return (os.environ.get("SPEC_ENGINE_PACKED_GEMM", "1") != "0" and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


def bf16_available() -> bool:
    """oneDNN's bf16 product on reordered weights is usable on this CPU (it has bf16 dot products), and not switched
    off by SPEC_ENGINE_PACKED_GEMM=0."""
    return (os.environ.get("SPEC_ENGINE_PACKED_GEMM", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packs(dtype: torch.dtype) -> bool:
    """Whether PackedLinear serves weights of `dtype` here: fp32 (MKL, 4-16 rows) or bf16 (oneDNN, any row count)."""
    return (dtype == torch.float32 and available()) or (dtype == torch.bfloat16 and bf16_available())


def enabled() -> bool:
    """Inside `batched_gemm()` on this thread: the engine's own forwards (packed weights, grouped attention)."""
    return _ENABLED.get()


@contextlib.contextmanager
def batched_gemm():
    """Inside this block (this thread only) the engine's kernels apply: packed linear weights (here) and grouped-query
    attention without the KV copy (cpu_attention.py)."""
    token = _ENABLED.set(True)
    try:
        yield
    finally:
        _ENABLED.reset(token)


class PackedLinear(nn.Linear):
    """An nn.Linear that computes 4-16 rows (fp32; bf16: every row count) inside `batched_gemm()` from a copy of its
    weight packed by MKL (oneDNN for bf16).

    Made from an existing module in place (`wrap`), so parameters, tied weights and hooks stay as they were. The
    copy is made on the first call that uses it (an fp32 model that never verifies 4+ tokens, such as a draft model,
    never pays its memory; a bf16 one uses it from its first forward), and made again if the weight changed since
    (version counter, pointer, dtype).
    """

    packed: torch.Tensor | None = None
    packed_key: tuple | None = None

    @classmethod
    def wrap(cls, linear: nn.Linear) -> "PackedLinear":
        linear.__class__ = cls
        linear.packed, linear.packed_key = None, None
        return linear

    def __getstate__(self):
        """Copies (deepcopy, pickle) leave the packed copy behind: MKL's opaque tensor has no storage to copy, and
        the copy packs its own on first use."""
        state = dict(super().__getstate__())
        state["packed"], state["packed_key"] = None, None
        return state

    def packed_weight(self) -> torch.Tensor:
        weight = self.weight.detach()
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if self.packed_key != key:
            if weight.dtype == torch.bfloat16:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)      # oneDNN's blocked layout
            else:
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, MIN_ROWS)    # MKL's layout of [out, in]
            self.packed_key = key
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _ENABLED.get() and not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == self.weight.dtype:
            rows = x.numel() // x.shape[-1]
            if x.dtype == torch.float32 and MIN_ROWS <= rows <= MAX_ROWS:
                return packed_product(x.contiguous(), self.packed_weight(), self.weight, self.bias, rows)
            if x.dtype == torch.bfloat16:
                return bf16_product(x, self.packed_weight(), self.bias, self.out_features)
        return F.linear(x, self.weight, self.bias)


def packed_product(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   rows: int) -> torch.Tensor:
    """x [..., in] @ weight.T + bias via the packed weight. `rows` must equal x's row count: the op runs the
    packed kernel only for the row count it is told, and plain linear for any other."""
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def bf16_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., in] (bf16) @ weight.T + bias via oneDNN's reordered weight: the same numbers as F.linear in bf16
    (fp32 accumulation; equal outputs measured), at ~0.7 of its time for one row on this CPU."""
    rows = x.reshape(-1, x.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "").reshape(*x.shape[:-1], out_features)


def pack_linears(model: nn.Module, max_bytes: int = MAX_PACKED_BYTES) -> int:
    """Make every fp32 or bf16 CPU nn.Linear of `model` a PackedLinear (see the module docstring), where this CPU
    serves that dtype; returns the bytes of weight they may pack on first use, 0 if the packed product is unavailable
    here or they exceed `max_bytes`."""
    linears = [m for m in model.modules() if type(m) is nn.Linear and packs(m.weight.dtype)
               and m.weight.device.type == "cpu"]
    total = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if not linears or total > max_bytes:
        return 0
    for linear in linears:
        PackedLinear.wrap(linear)
    return total


def prepack(model: nn.Module) -> int:
    """Pack every PackedLinear of `model` now (a benchmark or an app's default target should not pay for it inside
    a measured run); returns the number packed (0 for anything that is not a torch module)."""
    if not isinstance(model, nn.Module):
        return 0
    modules = list(model.modules())
    modules += [linear for m in modules if getattr(m, ENGINE_LINEARS, None) is not None
                for linear in getattr(m, ENGINE_LINEARS).linears()]
    # A linear layer the lean forward superseded by a fused one is multiplied by only outside the engine's forwards.
    layers = [m for m in modules if isinstance(m, PackedLinear) and packs(m.weight.dtype)
              and not getattr(m, "superseded", False)]
    for layer in layers:
        layer.packed_weight()
    return len(layers)
