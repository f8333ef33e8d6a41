"""A small fp32 matrix product for the engine's CPU forwards: a few rows (1-16) times a weight packed in column
blocks, built from `csrc/blocked_gemm.cpp` with the machine's C++ compiler on first use. It serves any row count;
where the kernel plans measure it fastest it also takes a prompt's prefill blocks (cpu_gemm.BLOCK_KERNELS).

Why this exists (measured here: AMD EPYC with AVX-512, torch 2.13, SmolLM2-135M's 120 layer products per forward,
weights streamed from memory; `python -m bench.kernel_cost`, bench/results/kernel-cost-fp32*-epyc.md): a forward's
products over 1 / 2 / 4 / 8 rows cost, in ms,

    one thread:   F.linear 34 / 53 / 45 / 53, MKL packed 27 / 39 / 48 / 56, oneDNN fp32 29 / 38 / 43 / 50
                  this kernel 15 / 14 / 15 / 19
    two threads:  oneDNN fp32 22 / 24 / 26 / 29, this kernel 13 / 13 / 13 / 13

MKL and oneDNN are built for large products; with a handful of rows they neither stream the weight at the memory's
speed nor keep the cost flat in the row count, and a flat cost is what makes verifying k draft tokens as cheap as
decoding one. This kernel reads each column block of the weight once, as one contiguous stream, and lets every
row of the call use each load (the layout and loop are the classic packed GEMM micro-kernel's, as in BLIS or
inductor's CPU GEMM template; see the .cpp). Inductor's template also gave a flat cost on one shape (8 layers of
3072 x 576: 2.5 ms at 1 and at 4 rows), but it is reached only through `torch.compile` with freezing and
max-autotune, compiling per row count (seconds per shape, minutes per model), which an eager engine with a changing
row count cannot afford; so the 90-line kernel is written here.

Numerics: each output is one fused multiply-add chain over the input in order, so results differ from F.linear by
float rounding only, and a row's result is bitwise the same whatever the row count of the call (tests check both).

Built per instruction set (AVX-512F, or AVX2 with FMA; none on other CPUs) into the cache folder (paths.cache_root),
keyed by the source's hash, then loaded with ctypes (the call releases the GIL). No compiler, a failed build, or
SPEC_ENGINE_BLOCKED_GEMM=0 / SPEC_ENGINE_PACKED_GEMM=0 leaves it unavailable, and cpu_gemm uses its other kernels.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from spec_engine.accel import native

SOURCE = Path(__file__).parent / "csrc" / "blocked_gemm.cpp"
ISA_FLAGS = native.ISA_FLAGS
BUILD_FLAGS = [*native.BASE_FLAGS, "-fopenmp"]


@dataclass(frozen=True)
class Kernel:
    """The built library for one instruction set."""

    isa: str
    block_width: int            # outputs per packed column block (64 for AVX-512, 32 for AVX2)
    function: ctypes._CFuncPtr
    path: Path


_LOCK = threading.Lock()
_BUILT: dict[str | None, Kernel | None] = {}   # isa -> kernel (None: failed); key None: the default, see kernel()
_REASONS: dict[str, str] = {}


def native_isa() -> str | None:
    """The best instruction set this CPU gives the kernel, by torch's own CPU detection; None where there is none.
    SPEC_ENGINE_BLOCKED_ISA=avx2 forces the narrower build (tests run both on an AVX-512 machine)."""
    best = native.cpu_isa()
    forced = os.environ.get("SPEC_ENGINE_BLOCKED_ISA")
    if forced == "avx2" and best is not None:
        return "avx2"
    return best


def switched_off() -> bool:
    return "0" in (os.environ.get("SPEC_ENGINE_BLOCKED_GEMM", "1"), os.environ.get("SPEC_ENGINE_PACKED_GEMM", "1"))


def kernel(isa: str | None = None) -> Kernel | None:
    """The kernel for `isa` (default: native_isa()), built on the first call of the process (~1.5 s; then loaded
    from the cache folder); None where it is unavailable (see unavailable_reason). The default is settled once per
    process (the products call this per layer), reading the environment then; reset() settles it again."""
    if isa is None:
        if None not in _BUILT:
            _BUILT[None] = None if native_isa() is None or switched_off() else kernel(native_isa())
        return _BUILT[None]
    if switched_off():
        return None
    if isa in _BUILT:
        return _BUILT[isa]
    with _LOCK:
        if isa not in _BUILT:
            try:
                _BUILT[isa] = load(build(isa), isa)
            except native.ERRORS as error:
                _BUILT[isa], _REASONS[isa] = None, f"{type(error).__name__}: {error}"
                warnings.warn(f"spec_engine: the blocked fp32 kernel is unavailable ({_REASONS[isa]}); "
                              "using MKL / oneDNN / F.linear", RuntimeWarning, stacklevel=2)
    return _BUILT[isa]


def available() -> bool:
    return kernel() is not None


def unavailable_reason() -> str | None:
    """Why kernel() is None, or None when it is available."""
    isa = native_isa()
    if isa is None:
        return f"no AVX-512 or AVX2 on this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()})"
    if switched_off():
        return "switched off by SPEC_ENGINE_BLOCKED_GEMM=0 or SPEC_ENGINE_PACKED_GEMM=0"
    return None if kernel(isa) is not None else _REASONS.get(isa)


def reset() -> None:
    """Settle the default kernel again at its next use, reading the environment anew (builds stay loaded)."""
    with _LOCK:
        _BUILT.pop(None, None)


def build(isa: str) -> Path:
    """Compile the source for `isa` into the cache folder, unless that exact build is there already (native.py);
    returns the library's path."""
    return native.compile_library(SOURCE, f"blocked_gemm-{isa}", [*BUILD_FLAGS, *ISA_FLAGS[isa]])


def load(path: Path, isa: str) -> Kernel:
    library = native.load_library(path)
    function = library.blocked_gemm
    function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    function.restype = None
    library.blocked_gemm_block_width.restype = ctypes.c_int
    return Kernel(isa, library.blocked_gemm_block_width(), function, path)


def pack(weight: torch.Tensor, built: Kernel | None = None) -> torch.Tensor:
    """weight [out, in] (fp32) -> [ceil(out / width), in, width]: each block of `width` outputs, input-major,
    zero-padded to whole blocks."""
    built = built or kernel()
    width = built.block_width
    out_features, in_features = weight.shape
    padded = F.pad(weight.float(), (0, 0, 0, (-out_features) % width))
    return padded.reshape(-1, width, in_features).transpose(1, 2).contiguous()


def pack_bf16(weight: torch.Tensor, width: int) -> torch.Tensor:
    """weight [out, in] -> bf16 [ceil(out / width), ceil(in / 2), width, 2]: each block of `width` outputs, and for
    each pair of inputs each output's two weights side by side (csrc/blocked_gemm.cpp's blocked_gemm_bf16, which
    the compiled layers call: native_layers.py); zero-padded to whole blocks and pairs."""
    out_features, in_features = weight.shape
    padded = F.pad(weight.to(torch.bfloat16), (0, in_features % 2, 0, (-out_features) % width))
    return padded.reshape(-1, width, padded.shape[1] // 2, 2).transpose(1, 2).contiguous()


def product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int,
            built: Kernel | None = None) -> torch.Tensor:
    """x [..., in] @ weight.T + bias, the weight packed by `pack` (fp32, CPU)."""
    built = built or kernel()
    in_features = x.shape[-1]
    rows = x.reshape(-1, in_features).contiguous()
    blocks = -(-out_features // built.block_width)
    # The C function trusts its pointers: check what it will read before handing them over.
    if (x.dtype != torch.float32 or packed.dtype != torch.float32 or not packed.is_contiguous()
            or tuple(packed.shape) != (blocks, in_features, built.block_width)
            or (bias is not None and (bias.dtype != torch.float32 or bias.numel() != out_features))):
        raise ValueError(f"blocked_gemm.product: x {tuple(x.shape)} {x.dtype}, packed {tuple(packed.shape)} "
                         f"{packed.dtype}, out_features {out_features} do not match")
    bias = bias.contiguous() if bias is not None else None
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32)   # [rows, out]
    built.function(rows.data_ptr(), packed.data_ptr(), bias.data_ptr() if bias is not None else None, y.data_ptr(),
                   rows.shape[0], in_features, out_features, torch.get_num_threads())
    return y.reshape(*x.shape[:-1], out_features)
