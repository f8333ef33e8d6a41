"""Cheaper products on the CPU: for an fp32 model the engine's own blocked kernel (blocked_gemm.py) or MKL's packed
GEMM, whichever this machine measures faster per row count, and oneDNN's product on reordered weights for a bf16
model (every forward).

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

Which fp32 kernel is fastest depends on the CPU, so `prepack` measures it (`tune`). On an AMD EPYC with AVX-512
(torch 2.13, one thread, SmolLM2-135M's 120 layer products, weights streamed from memory) the three kernels cost,
in ms, by rows:  F.linear 35 / 57 / 66 / 45 / 61 (rows 1 / 2 / 3 / 4 / 9), MKL packed 28 / 40 / 48 / 49 / 65,
oneDNN (fp32, reordered) 30 / 39 / 40 / 44 / 52: MKL's sgemm takes slow paths on this CPU for 2-3 rows, while on
the Intel Xeon that the static rule above was measured on, F.linear was best below 4 rows and MKL packed from 4.
A fourth kernel, the engine's own (blocked_gemm.py, built where a C++ compiler and AVX2 or AVX-512 are there), costs
15 / 14 / 14 / 15 / 23 ms on that EPYC: it streams each weight once whatever the row count.
So each weight shape gets a plan, the fastest kernel per row count, timed over the model's own layers of that shape
(streamed, as a forward reads them) with the kinds interleaved; no maintained library picks kernels for eager
modules at run time (inductor's freezing passes choose by fixed rules at compile time). A shape with no plan (the
model was not prepacked, or SPEC_ENGINE_GEMM_TUNE=0) takes the static rule: the blocked kernel where it is built,
else MKL packed for 4-16 rows. The kernels differ by float rounding
only (tests compare each with F.linear at every row count).

Blocks of more than 16 rows (a prompt's prefill) are compute-bound, and there the vendor matters: MKL's sgemm reaches
~190 GFLOP/s on the two EPYC cores (it takes its AVX2 path on an AMD CPU). So a plan also holds a kernel for blocks,
measured at BLOCK_ROWS rows among F.linear, oneDNN on the module's own weight ("onednn_direct": it reorders inside
each call and keeps no second copy) and the blocked kernel, which serves any row count on its copy (each column
block stays in the caches while groups of 8 rows pass over it) and gives a row the same numbers whatever the other
rows. `python -m bench.kernel_cost --threads 2 --rows 16 32 64 128` (bench/results/kernel-cost-blocks-2threads-epyc.md):
120 layer products over 64 rows cost 129 ms by F.linear, 61 by onednn_direct, 37 by the blocked kernel; SmolLM2-135M's
prefill of 80 tokens 168 / 92 / 76 ms.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import functools
import os
import platform
import time

import torch
import torch.nn.functional as F
from torch import nn

from spec_engine.accel import blocked_gemm
from spec_engine.paths import cache_root

MIN_ROWS, MAX_ROWS = 4, 16            # rows the engine's kernels serve (1..16); MKL's static rule: 4-16 rows
KERNELS = ("linear", "mkl", "onednn", "blocked")  # the fp32 candidates: F.linear, MKL's packed sgemm, oneDNN on
                                                 # reordered weights, the engine's own (blocked_gemm.py)
BLOCK_KERNELS = ("linear", "onednn_direct", "blocked")   # for blocks of more rows (prefill): F.linear, oneDNN
                                      # on the module's own weight (reordered inside each call: no copy kept), and
                                      # the blocked kernel on its copy
COPYLESS = ("linear", "onednn_direct")  # kernels that multiply by the module's own weight: nothing to pack
BLOCK_ROWS = 64                       # the rows a plan's block entry is measured at
PLAN_LENGTH = MAX_ROWS + 2            # [0] unused, [1..MAX_ROWS] per row count, [-1] blocks of more rows
TUNE_BYTES = 48 << 20                 # time each shape over at most this many bytes of its layers (beyond a 32 MB L3)
TUNE_PASSES = 3                       # passes per shape; the fastest pass of each kernel decides
TUNE_MARGIN = 0.85                    # another kernel displaces the static rule's only when this much faster or more:
                                      # on a shared host, noise alone had put F.linear and oneDNN at some row counts
                                      # (6 and 8 rows of SmolLM2 cost 2x 5 and 11 rows: a jagged verify-cost curve)
PLAN_RULE = "v5: the static rule's kernel unless another is TUNE_MARGIN faster; blocks planned too"   # in the key:
                                      # plans saved under an older rule are measured again
PLANS_FILE = "gemm-plans.json"        # measured plans kept in the cache folder, by machine (paths.cache_root)
MAX_PACKED_BYTES = 2 << 30            # packed copies (one per kernel a plan picks): skip models above 2 GiB
ENGINE_LINEARS = "_spec_engine_lean"  # an attribute whose `.linears()` the engine also multiplies by (lean_llama.py)
_ENABLED = contextvars.ContextVar("spec_engine_batched_gemm", default=False)


def available() -> bool:
    """MKL's packed sgemm is compiled into this torch, and not switched off by SPEC_ENGINE_PACKED_GEMM=0."""
    return (os.environ.get("SPEC_ENGINE_PACKED_GEMM", "1") != "0" and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


@functools.lru_cache(maxsize=1)
def bf16_hardware() -> bool:
    """This torch and CPU have oneDNN's bf16 product on reordered weights (AVX-512 BW/VL/DQ or AVX-NE-CONVERT): an
    AVX2-only CPU has not, and the reorder raises there."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_available() -> bool:
    """oneDNN's bf16 product on reordered weights is usable on this CPU (it has bf16 dot products), and not switched
    off by SPEC_ENGINE_PACKED_GEMM=0."""
    return os.environ.get("SPEC_ENGINE_PACKED_GEMM", "1") != "0" and bf16_hardware()


def onednn_available() -> bool:
    """oneDNN's product on reordered weights is compiled into this torch (fp32 on any x86 CPU it supports)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def fp32_kernels() -> list[str]:
    """The fp32 kernels of KERNELS that this torch and machine have (F.linear always)."""
    have = {"linear": True, "mkl": available(), "onednn": onednn_available(), "blocked": blocked_gemm.available()}
    return [kernel for kernel in KERNELS if have[kernel]]


def block_kernels() -> list[str]:
    """The kernels of BLOCK_KERNELS that this torch has, for blocks of more than MAX_ROWS rows."""
    have = {"linear": True, "onednn_direct": onednn_available(), "blocked": blocked_gemm.available()}
    return [kernel for kernel in BLOCK_KERNELS if have[kernel]]


def packs(dtype: torch.dtype) -> bool:
    """Whether PackedLinear serves weights of `dtype` here: fp32 (the blocked kernel or MKL; oneDNN where tuned) or
    bf16 (oneDNN)."""
    return ((dtype == torch.float32 and (blocked_gemm.available() or available()))
            or (dtype == torch.bfloat16 and bf16_available()))


def static_kernel(rows: int) -> str:
    """The fp32 kernel for `rows` (1..MAX_ROWS) rows of a shape with no measured plan: the blocked kernel where it
    is built (fastest at every row count on the EPYC), else MKL packed for 4-16 rows (measured on the Xeon)."""
    if blocked_gemm.kernel() is not None:
        return "blocked"
    return "mkl" if MIN_ROWS <= rows and available() else "linear"


_PLANS: dict[tuple, tuple[str, ...]] = {}   # (out, in, bias, threads) -> fp32 kernel by rows (PLAN_LENGTH entries)


def plan_key(linear: nn.Linear) -> tuple:
    return (linear.out_features, linear.in_features, linear.bias is not None, torch.get_num_threads())


def kernel_for(linear: nn.Linear, rows: int) -> str:
    """The fp32 kernel that multiplies `rows` rows by `linear`'s weight: its shape's measured plan, else the static
    rule (for blocks of more than MAX_ROWS rows, a batch's packed rows or a prompt's: the blocked kernel where it is
    built, its many-row tiles measured ~2x F.linear at 32 and 64 rows on an AVX2 EPYC; else F.linear)."""
    plan = _PLANS.get(plan_key(linear))
    if rows > MAX_ROWS:
        return plan[-1] if plan is not None else ("blocked" if blocked_gemm.kernel() is not None else "linear")
    return plan[rows] if plan is not None else static_kernel(rows)


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
    """An nn.Linear that, inside `batched_gemm()`, multiplies with the kernel its shape's plan picks for the row
    count (fp32: F.linear, MKL's packed sgemm, oneDNN or the blocked kernel on its own copy; bf16: oneDNN at every
    row count).

    Made from an existing module in place (`wrap`), so parameters, tied weights and hooks stay as they were. A
    kernel's copy of the weight is made on the first call that uses it (a model whose kernels are all F.linear, such
    as an fp32 draft under MKL's static rule, never pays its memory), and made again if the weight changed since
    (pointer, version counter).
    """

    packed: dict | None = None          # kernel name -> its copy of the weight
    packed_key: tuple | None = None

    @classmethod
    def wrap(cls, linear: nn.Linear) -> "PackedLinear":
        linear.__class__ = cls
        linear.packed, linear.packed_key = None, None
        return linear

    def __getstate__(self):
        """Copies (deepcopy, pickle) leave the packed copies behind: MKL's opaque tensor has no storage to copy, and
        the copy packs its own on first use."""
        state = dict(super().__getstate__())
        state["packed"], state["packed_key"] = None, None
        return state

    def packed_weight(self, kernel: str) -> torch.Tensor:
        weight = self.weight
        # a new dtype or device is new memory; in-place edits bump _version
        key = (weight.data_ptr(), weight._version)
        if self.packed_key != key:
            self.packed, self.packed_key = {}, key
        packed = self.packed.get(kernel)
        if packed is None:
            packed = self.packed[kernel] = pack_weight(weight.detach(), kernel)
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(self, x)


def pack_weight(weight: torch.Tensor, kernel: str) -> torch.Tensor:
    """`weight` [out, in] in `kernel`'s layout: MKL's packed buffer (hinted for MIN_ROWS rows), oneDNN's blocked
    one, or the blocked kernel's column blocks."""
    if kernel == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, MIN_ROWS)
    if kernel == "blocked":
        return blocked_gemm.pack(weight)
    if kernel == "blocked_bf16":            # for the compiled layers only (native_layers.py)
        return blocked_gemm.pack_bf16(weight, blocked_gemm.kernel().block_width)
    assert kernel == "onednn", kernel
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def product(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) by the kernel the engine picks (see PackedLinear); a plain function, so the lean forward calls it
    without a module call per product."""
    if (_ENABLED.get() and isinstance(linear, PackedLinear) and not torch.is_grad_enabled() and x.device.type == "cpu"
            and x.dtype == linear.weight.dtype):
        if x.dtype == torch.bfloat16:
            if bf16_hardware():          # else F.linear below: an AVX2-only CPU has no oneDNN bf16 product
                if x.numel() // x.shape[-1] <= MAX_ROWS:
                    from spec_engine.accel import native_layers          # (imports this module)
                    found = native_layers.bf16_product(linear, x)       # AVX-512 BF16: the blocked kernel's twin
                    if found is not None:
                        return found
                return onednn_product(x, linear.packed_weight("onednn"), linear.bias, linear.out_features)
        elif x.dtype == torch.float32:
            rows = x.numel() // x.shape[-1]
            kernel = kernel_for(linear, rows)
            if kernel == "blocked":
                return blocked_gemm.product(x, linear.packed_weight("blocked"), linear.bias, linear.out_features)
            if kernel == "mkl":
                return packed_product(x.contiguous(), linear.packed_weight("mkl"), linear.weight, linear.bias, rows)
            if kernel == "onednn":
                return onednn_product(x, linear.packed_weight("onednn"), linear.bias, linear.out_features)
            if kernel == "onednn_direct":
                return onednn_product(x, linear.weight, linear.bias, linear.out_features)
    return F.linear(x, linear.weight, linear.bias)


def packed_product(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   rows: int) -> torch.Tensor:
    """x [..., in] @ weight.T + bias via the packed weight. `rows` must equal x's row count: the op runs the
    packed kernel only for the row count it is told, and plain linear for any other."""
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def onednn_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., in] @ weight.T + bias via oneDNN's reordered weight (fp32, or bf16 with fp32 accumulation: the same
    numbers as F.linear in bf16, measured equal, at ~0.7 of its time for one row on the Xeon). Given the plain
    weight [out, in] instead, oneDNN reorders it inside the call ("onednn_direct")."""
    rows = x.reshape(-1, x.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "").reshape(*x.shape[:-1], out_features)


def pack_linears(model: nn.Module, max_bytes: int = MAX_PACKED_BYTES) -> int:
    """Make every fp32 or bf16 CPU nn.Linear of `model` a PackedLinear (see the module docstring), where this CPU
    serves that dtype; returns the bytes of weight they may pack on first use, 0 if the packed product is unavailable
    here or they exceed `max_bytes`. The device is checked first: `packs` may build the blocked kernel (a C++
    compile on a machine's first use), which a model on an accelerator never needs."""
    linears = [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"
               and packs(m.weight.dtype)]
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
    # Layers moved off the CPU since they were wrapped (`model.to("cuda")`) multiply by F.linear: nothing to pack.
    layers = [m for m in modules if isinstance(m, PackedLinear) and m.weight.device.type == "cpu"
              and not getattr(m, "superseded", False) and packs(m.weight.dtype)]
    if not layers:
        return 0
    if os.environ.get("SPEC_ENGINE_GEMM_TUNE", "1") != "0":
        tune([layer for layer in layers if layer.weight.dtype == torch.float32])
    for layer in layers:
        if layer.weight.dtype == torch.bfloat16:
            layer.packed_weight("onednn")
        else:
            needed = {kernel_for(layer, rows) for rows in range(1, MAX_ROWS + 2)}    # each row count's, and blocks'
            for kernel in needed - set(COPYLESS):
                layer.packed_weight(kernel)
    return len(layers)


def tune(layers: list[nn.Linear], save: bool = True) -> dict[tuple, tuple[str, ...]]:
    """Give every fp32 weight shape among `layers` a plan (see the module docstring): the one this machine measured
    before (kept in the cache folder, keyed by CPU, torch version, candidate kernels and thread count), else measured
    now: for 1..MAX_ROWS rows, and a block of BLOCK_ROWS, each candidate kernel multiplies by that shape's layers
    in turn (up to TUNE_BYTES), the kernels interleaved per row count, the fastest of TUNE_PASSES passes counting,
    the static rule's kernel kept unless another beats it by the margin (`pick`). Measuring takes ~6 s for
    SmolLM2-135M on one thread, once per machine. Returns the plans it set."""
    groups: dict[tuple, list[nn.Linear]] = {}
    for layer in layers:
        if layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu" and plan_key(layer) not in _PLANS:
            groups.setdefault(plan_key(layer), []).append(layer)
    if not groups:
        return {}
    kernels = fp32_kernels()        # after the check: it builds the blocked kernel, which nothing here may need
    saved = load_plans() if save else {}
    made, measured = {}, False
    for key, group in groups.items():
        plan = saved.get(plan_name(key))
        if plan is None or len(plan) != PLAN_LENGTH or not set(plan) <= set(kernels) | set(block_kernels()):
            group = group[:max(1, TUNE_BYTES // (group[0].weight.numel() * 4))]
            plan = measure_plan(group, kernels)
            measured = True
        made[key] = _PLANS[key] = tuple(plan)
    if save and measured:
        save_plans({**saved, **{plan_name(key): list(plan) for key, plan in made.items()}})
    return made


@torch.inference_mode()
def measure_plan(group: list[nn.Linear], kernels: list[str]) -> tuple[str, ...]:
    """The fastest of `kernels` for each row count 1..MAX_ROWS over the layers of `group` (one shape), then the
    fastest of `block_kernels()` for a block of BLOCK_ROWS rows (a prefill's); PLAN_LENGTH entries, [0] unused."""
    blocks = block_kernels()
    if len(kernels) == 1 and len(blocks) == 1:
        return ("linear",) * PLAN_LENGTH
    weights = [layer.weight.detach() for layer in group]
    copies = {kernel: [pack_weight(w, kernel) for w in weights] for kernel in kernels if kernel != "linear"}
    bias = group[0].bias.detach() if group[0].bias is not None else None
    generator = torch.Generator().manual_seed(0)
    inputs = {rows: torch.randn(rows, weights[0].shape[1], generator=generator)
              for rows in (*range(1, MAX_ROWS + 1), BLOCK_ROWS)}

    def run(kernel: str, rows: int) -> float:
        x, start = inputs[rows], time.perf_counter()
        for i, weight in enumerate(weights):
            if kernel == "linear":
                F.linear(x, weight, bias)
            elif kernel == "mkl":
                packed_product(x, copies["mkl"][i], weight, bias, rows)
            elif kernel == "blocked":
                blocked_gemm.product(x, copies["blocked"][i], bias, weight.shape[0])
            else:
                onednn_product(x, weight if kernel == "onednn_direct" else copies["onednn"][i], bias, weight.shape[0])
        return time.perf_counter() - start

    candidates = {rows: kernels if rows <= MAX_ROWS else blocks for rows in inputs}
    fastest = {(kernel, rows): float("inf") for rows in inputs for kernel in candidates[rows]}
    for _ in range(TUNE_PASSES):
        for rows in inputs:
            for kernel in candidates[rows]:
                fastest[kernel, rows] = min(fastest[kernel, rows], run(kernel, rows))
    return ("linear", *(pick(candidates[rows], {kernel: fastest[kernel, rows] for kernel in candidates[rows]},
                             static_kernel(rows) if rows <= MAX_ROWS else "linear")
                        for rows in inputs))


def pick(kernels: list[str], seconds: dict[str, float], incumbent: str) -> str:
    """The kernel for one row count: the static rule's (`incumbent`) unless the fastest other one took at most
    TUNE_MARGIN of its time (so that a noisy pass cannot hand a row count to a kernel that is not really faster);
    among the others F.linear wins a tie."""
    if incumbent not in kernels:
        incumbent = "linear"
    challenger = min(kernels, key=lambda kernel: (seconds[kernel], kernel != "linear"))
    return challenger if seconds[challenger] <= TUNE_MARGIN * seconds[incumbent] else incumbent


def machine_key() -> str:
    """What a plan depends on besides the shape: the CPU (model and feature flags), torch's version and build, and
    the candidate kernels (a plan measured before a kernel existed, or where it could not be built, is measured
    again once it can compete)."""
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        cpu = "".join(sorted(set(lines)))
    text = "|".join([platform.machine(), cpu or platform.processor(), torch.__version__, torch.__config__.show(),
                     ",".join(fp32_kernels() + block_kernels()), PLAN_RULE])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_name(key: tuple) -> str:
    out_features, in_features, bias, threads = key
    return f"{out_features}x{in_features}{'+bias' if bias else ''}@{threads}"


def load_plans() -> dict[str, list[str]]:
    """This machine's saved plans ({} when there are none or the file is unreadable)."""
    try:
        saved = json.loads((cache_root() / PLANS_FILE).read_text())
        return dict(saved.get(machine_key(), {}))
    except (OSError, ValueError, AttributeError):
        return {}


def save_plans(plans: dict[str, list[str]]) -> None:
    """Keep this machine's plans (other machines' entries in the file stay); a failed write only costs a re-measure."""
    path = cache_root() / PLANS_FILE
    try:
        try:
            everything = json.loads(path.read_text())
        except (OSError, ValueError):
            everything = {}
        everything = everything if isinstance(everything, dict) else {}
        everything[machine_key()] = plans
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        temp.write_text(json.dumps(everything, indent=1) + "\n")
        os.replace(temp, path)
    except OSError:
        pass
