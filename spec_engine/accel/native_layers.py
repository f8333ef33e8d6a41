"""The lean forward's decoder layers in one C++ call (csrc/lean_layers.cpp), for Llama stacks on the CPU over a few
rows: the fp32 target's plain steps and verify forwards, and the EAGLE head's bf16 steps (on CPUs with AVX-512 BF16).

Why this exists (measured on an AMD EPYC, two threads, SmolLM2-135M in fp32, 200 cached tokens, `python -m
bench.native_layers`): a lean one-token forward cost 20.6 ms, of which the blocked kernel's 121 products took
13.2 ms; the other 7.4 ms (a third of the step, 9.5 ms of a 4-row tree verify) were ~30 torch operations a layer
around the products (norms, the rotary embedding, the cache's writes, attention, the activation, residuals),
each dispatched from Python on its own. Speculative decoding pays that per round and plain decoding per token, and
the EAGLE head pays it in each of its steps, where it is most of the step. torch.compile, the maintained remedy,
measured slower here (lean_llama.py). So, as llama.cpp does, the layers run in compiled code: one call per forward
does every layer, with the products by blocked_gemm.cpp's kernel.

Scope: the lean path (lean_llama.run_layers) takes it when the stack is on the CPU, fp32 with the blocked kernel's
products at this row count (cpu_gemm's plan) or bf16 where the library multiplies bf16 (the blocked kernel's twin,
fp32 rows between the products), every layer's KV cache is a GrowingLayer (it writes into the buffer's spare room;
fp32 keys and values), at most cpu_gemm.MAX_ROWS rows, and SPEC_ENGINE_NATIVE_LAYERS is not 0; anything else,
prefill blocks included, runs the lean path's torch operations. Numerics: transformers' arithmetic in fp32
(|d logit| ~1e-5, as the lean path; tests/test_native_layers.py compares both paths with transformers) and
batch-invariant: a row's numbers do not depend on the other rows of the call (see the .cpp), so a verified token
gets a one-token forward's numbers bit for bit.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings

import torch

from spec_engine.accel import blocked_gemm, cpu_gemm, native
from spec_engine.accel.growing_cache import GrowingLayer

SOURCE = native.CSRC / "lean_layers.cpp"
MAX_HEAD_DIM = 512          # the .cpp's rotary scratch row

_LOCK = threading.Lock()
_BUILT: dict[str, object] = {}          # isa -> the loaded library, or None where it failed


class LayerPointers(ctypes.Structure):
    """lean_layers.cpp's LeanLayer: one layer's packed weights, norms and KV buffers."""
    _fields_ = [(name, ctypes.c_void_p) for name in ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm",
                                                      "gate_up", "gate_up_bias", "down", "down_bias", "keys",
                                                      "values")] + [(name, ctypes.c_int) for name in ("capacity",
                                                                                                     "capture", "bf16")]


def switched_off() -> bool:
    return os.environ.get("SPEC_ENGINE_NATIVE_LAYERS", "1") == "0" or blocked_gemm.switched_off()


def library():
    """The built library for the blocked kernel's instruction set (its weights are packed for that kernel's block
    width), or None where either is unavailable."""
    kernel = blocked_gemm.kernel()
    if kernel is None or switched_off():
        return None
    isa = kernel.isa
    if isa not in _BUILT:
        with _LOCK:
            if isa not in _BUILT:
                try:
                    _BUILT[isa] = build(isa, SOURCE, blocked_gemm.SOURCE)
                except native.ERRORS as error:
                    _BUILT[isa] = None
                    warnings.warn(f"spec_engine: the compiled decoder layers are unavailable ({type(error).__name__}: "
                                  f"{error}); the lean path's torch operations run instead", RuntimeWarning,
                                  stacklevel=2)
    return _BUILT[isa]


def build(isa: str, source, gemm_source, name: str = "lean_layers"):
    """Compile `source` (including `gemm_source`) for `isa` into the cache folder (once per source: native.py) and
    load it with its functions' signatures; raises native.ERRORS where it cannot. `library()` builds the shipped
    files; bench/native_layers.py --against builds another revision's beside them."""
    bf16 = isa == "avx512" and torch.cpu._is_avx512_bf16_supported()   # the EAGLE head's products
    flags = [*native.BASE_FLAGS, "-fopenmp", *native.ISA_FLAGS[isa], *(["-mavx512bf16"] if bf16 else [])]
    built = native.load_library(native.compile_library(source, f"{name}-{isa}{'bf16' if bf16 else ''}", flags,
                                                       includes=(gemm_source,)))
    pointer, integer, number = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    built.lean_layers.argtypes = [pointer, *[integer] * 8, number, number, pointer, pointer, pointer, pointer,
                                  pointer, integer]
    built.lean_layers.restype = None
    built.lean_layers_packed.argtypes = [pointer, integer, integer, pointer, pointer, pointer, pointer, pointer,
                                         pointer, *[integer] * 5, number, number, pointer, pointer, pointer, pointer,
                                         integer]
    built.lean_layers_packed.restype = None
    built.lean_layers_bf16.restype = ctypes.c_int
    built.move_positions.argtypes = [pointer, pointer, pointer, *[integer] * 3, pointer, pointer, integer]
    built.move_positions.restype = None
    built.bf16 = bool(built.lean_layers_bf16())
    if built.bf16:
        built.blocked_gemm_bf16.argtypes = [pointer] * 4 + [integer] * 4
        built.blocked_gemm_bf16.restype = None
    return built


def products(lean, layer) -> tuple:
    """A decoder layer's four products, in the order lean_layers.cpp takes them: q|k|v, o, gate|up, down."""
    fused = lean.fused[layer]
    return fused.qkv_proj, layer.self_attn.o_proj, fused.gate_up_proj, layer.mlp.down_proj


class Stack:
    """What lean_layers needs of one decoder stack, worked out once: its layers' pointers (the packed weights held
    here so they stay alive), shapes and cache indices; None from `of` where the stack does not qualify."""

    def __init__(self, inner, lean):
        self.layers = list(inner.layers)
        first = self.layers[0]
        self.dtype = first.self_attn.o_proj.weight.dtype            # fp32, or bf16 (a library built with bf16)
        kind = "blocked_bf16" if self.dtype == torch.bfloat16 else "blocked"
        attn, mlp = first.self_attn, first.mlp
        self.first_linears = products(lean, first)
        self.heads, self.kv_heads = attn.config.num_attention_heads, lean.fused[first].kv_heads
        self.head_dim = attn.head_dim
        self.hidden, self.intermediate = inner.config.hidden_size, mlp.down_proj.in_features
        self.eps, self.scale = float(first.input_layernorm.variance_epsilon), float(attn.scaling)
        self.cache_indices = [layer.self_attn.layer_idx for layer in self.layers]
        self.array = (LayerPointers * len(self.layers))()
        self.held = []
        for slot, layer in zip(self.array, self.layers):
            linears = products(lean, layer)
            packed = [linear.packed_weight(kind) for linear in linears]
            biases = [linear.bias.detach().float().contiguous() if linear.bias is not None else None
                      for linear in linears]
            norms = [layer.input_layernorm.weight.detach().float().contiguous(),
                     layer.post_attention_layernorm.weight.detach().float().contiguous()]
            self.held += packed + [b for b in biases if b is not None] + norms
            slot.qkv, slot.o, slot.gate_up, slot.down = (p.data_ptr() for p in packed)
            slot.qkv_bias, slot.o_bias, slot.gate_up_bias, slot.down_bias = (
                b.data_ptr() if b is not None else None for b in biases)
            slot.input_norm, slot.post_norm = (w.data_ptr() for w in norms)
            slot.bf16 = int(self.dtype == torch.bfloat16)
        self.kind, self.packed_first = kind, self.held[0]

    @staticmethod
    def qualifies(inner, lean, built) -> bool:
        layers = list(inner.layers)
        if not layers:
            return False
        first = layers[0]
        eps = first.input_layernorm.variance_epsilon
        dtype = first.self_attn.o_proj.weight.dtype
        if not (dtype == torch.float32 or dtype == torch.bfloat16 and built.bf16):
            return False
        for layer in layers:
            if not all(isinstance(linear, cpu_gemm.PackedLinear) and linear.weight.dtype == dtype
                       for linear in products(lean, layer)):
                return False
            if (lean.fused[layer].act is not torch.nn.functional.silu or layer.self_attn.head_dim > MAX_HEAD_DIM
                    or layer.self_attn.head_dim % 16):              # whole vectors of AVX-512 (and of AVX2)
                return False
            if {layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon} != {eps}:
                return False
        return first.self_attn.config.num_attention_heads % lean.fused[first].kv_heads == 0

    def fresh(self) -> bool:
        """The packed weights are still the ones pointed at (a changed weight is packed again: cpu_gemm)."""
        return self.first_linears[0].packed_weight(self.kind) is self.packed_first


def stack_for(inner, lean, built) -> Stack | None:
    """The Stack of `inner` (cached on its fused projections' holder `lean`), or None where it does not qualify."""
    stacks = lean.__dict__.setdefault("native_stacks", {})          # layers -> Stack, or False: does not qualify
    key = tuple(id(layer) for layer in inner.layers)
    stack = stacks.get(key)
    if stack is False or (stack is not None and stack.fresh()):
        return stack or None
    stack = stacks[key] = Stack(inner, lean) if Stack.qualifies(inner, lean, built) else False
    return stack or None


def run(inner, lean, embeds: torch.Tensor, cache, start: int, cos: torch.Tensor, sin: torch.Tensor,
        visible: torch.Tensor | None, wanted: set[int]) -> tuple[torch.Tensor, dict] | None:
    """lean_llama.run_layers' work before the final norm, in one call: embeds [1, n, H] placed after the `start`
    cached positions -> (the last layer's output [1, n, H], {index: state [1, n, H]} for the wanted indices below
    the layer count); None where this path does not apply (the caller runs the torch operations)."""
    if embeds.shape[1] > cpu_gemm.MAX_ROWS:
        return None                         # prefill blocks: the torch operations (MKL / oneDNN products)
    built = library()
    stack = stack_for(inner, lean, built) if built is not None else None
    if stack is not None and stack.dtype == torch.float32 and not all(
            cpu_gemm.kernel_for(linear, embeds.shape[1]) == "blocked" for linear in stack.first_linears):
        return None                         # the plan picked another kernel at this row count: the torch operations
    return run_packed(inner, lean, embeds, [cache], [start], [embeds.shape[1]], [visible], cos, sin, wanted)


def run_packed(inner, lean, embeds: torch.Tensor, caches: list, starts: list[int], sizes: list[int], visibles: list,
               cos: torch.Tensor, sin: torch.Tensor, wanted: set[int]) -> tuple[torch.Tensor, dict] | None:
    """The same over several sequences' rows packed side by side (core/packed.py): embeds [1, N, H] holds one run
    of rows per cache, in order, run s (sizes[s] rows) placed after the starts[s] positions that caches[s] holds and
    seeing them as visibles[s] says ([rows, starts[s] + rows] bool, or None: causal); each run's keys and values go to
    its own cache. -> (the last layer's output [1, N, H], states) or None where this path does not apply."""
    n = embeds.shape[1]
    built = library()
    if built is None or embeds.device.type != "cpu" or not cpu_gemm.enabled() or any(c is None for c in caches):
        return None
    stack = stack_for(inner, lean, built)
    if stack is None or embeds.dtype != stack.dtype:
        return None
    # A batch's rows may number more than MAX_ROWS (many sequences' decode and verify rows: prompts are fed alone,
    # core/batch.py); the blocked kernel's many-row tiles serve them, whatever kernel cpu_gemm's plan would pick at
    # that row count: a row then gets the numbers its lone one-row forward gets (the plan's pick there), bit for bit.
    per_cache = [[cache.layers[index] if index < len(cache.layers) else None for index in stack.cache_indices]
                 for cache in caches]
    if not all(type(layer) is GrowingLayer for layers in per_cache for layer in layers):
        return None
    bounds = [0]
    for rows in sizes:
        bounds.append(bounds[-1] + rows)
    if bounds[-1] != n:
        return None
    # The compiled layers keep fp32 keys and values, a bf16 stack's too (its rows are fp32 between the products);
    # reserve converts a layer that a torch forward filled in bf16, once.
    like = torch.empty((1, stack.kv_heads, 0, stack.head_dim), dtype=torch.float32)
    slots = sorted(index for index in wanted if index < len(stack.layers))
    array = type(stack.array).from_buffer_copy(stack.array)       # this call's own: other threads share the stack
    for i, slot in enumerate(array):
        slot.capture = slots.index(i) if i in wanted else -1
    count, layer_count = len(caches), len(stack.layers)
    keys, values = (ctypes.c_void_p * (count * layer_count))(), (ctypes.c_void_p * (count * layer_count))()
    capacities = (ctypes.c_int * (count * layer_count))()
    for s, layers in enumerate(per_cache):
        for i, layer in enumerate(layers):
            if layer.reserve(like, bounds[s + 1] - bounds[s]) != starts[s]:
                return None                 # layers out of step: let the torch path's checks speak
            at = s * layer_count + i
            keys[at], values[at] = layer.key_buffer.data_ptr(), layer.value_buffer.data_ptr()
            capacities[at] = layer.key_buffer.shape[-2]
    hidden = embeds.to(torch.float32, copy=True).contiguous()                        # [1, N, H], written in place
    captured = torch.empty((len(slots), n, stack.hidden)) if slots else None
    masks = [v.contiguous().view(torch.uint8) if v is not None else None for v in visibles]   # [rows, start + rows]
    sees = (ctypes.c_void_p * count)(*(m.data_ptr() if m is not None else None for m in masks))
    cos, sin = cos.reshape(n, -1).float().contiguous(), sin.reshape(n, -1).float().contiguous()   # [N, D]
    built.lean_layers_packed(ctypes.addressof(array), layer_count, count, (ctypes.c_int * (count + 1))(*bounds),
                             (ctypes.c_int * count)(*starts), keys, values, capacities, sees, stack.hidden,
                             stack.heads, stack.kv_heads, stack.head_dim, stack.intermediate, stack.eps, stack.scale,
                             cos.data_ptr(), sin.data_ptr(), hidden.data_ptr(),
                             captured.data_ptr() if captured is not None else None, torch.get_num_threads())
    for s, layers in enumerate(per_cache):
        for layer in layers:
            layer.extend(bounds[s + 1] - bounds[s])
    states = {index: captured[j][None].to(embeds.dtype) for j, index in enumerate(slots)}
    return hidden.to(embeds.dtype), states


def bf16_product(linear, x: torch.Tensor) -> torch.Tensor | None:
    """linear(x) for a bf16 PackedLinear by the blocked kernel's bf16 twin (fp32 accumulation, x rounded to bf16 as
    oneDNN rounds it), or None where it is unavailable. Why not oneDNN's: the EAGLE head multiplies one to a few rows
    by weights that the target's forward has just evicted from the caches, and there oneDNN's bf16 product read them
    at ~20 GB/s where the blocked kernel streams at ~40 (an LM head of 8,192 rows: 0.46-0.78 ms cold)."""
    built = library()
    if built is None or not built.bf16:
        return None
    in_features, out_features = x.shape[-1], linear.out_features
    rows = x.reshape(-1, in_features).float().contiguous()
    bias = linear.bias.detach().float().contiguous() if linear.bias is not None else None
    packed = linear.packed_weight("blocked_bf16")
    y = torch.empty(rows.shape[0], out_features)
    built.blocked_gemm_bf16(rows.data_ptr(), packed.data_ptr(), bias.data_ptr() if bias is not None else None,
                            y.data_ptr(), rows.shape[0], in_features, out_features, torch.get_num_threads())
    return y.reshape(*x.shape[:-1], out_features).to(x.dtype)


def move_positions(cache, moves: list[tuple[int, int]]) -> bool:
    """core/cache.py keep_path's moves (to, from), in one compiled call for every layer, where each layer is a
    GrowingLayer holding fp32 CPU buffers [1, Hkv, capacity, D] that cover the positions moved; False elsewhere (and
    nothing moved: the caller's torch code moves them)."""
    built = library()
    layers = list(getattr(cache, "layers", ()))
    if built is None or not layers or not moves:
        return False
    reach = max(max(pair) for pair in moves)
    shape = None
    for layer in layers:
        if not (type(layer) is GrowingLayer and layer.in_buffers() and reach < layer.get_seq_length()):
            return False
        for buffer in (layer.key_buffer, layer.value_buffer):
            if buffer.dtype != torch.float32 or buffer.device.type != "cpu" or not buffer.is_contiguous() \
                    or buffer.shape[0] != 1:
                return False
        heads, dim = layer.key_buffer.shape[1], layer.key_buffer.shape[3]
        if shape not in (None, (heads, dim)) or layer.value_buffer.shape != layer.key_buffer.shape:
            return False
        shape = (heads, dim)
    count = len(layers)
    keys = (ctypes.c_void_p * count)(*(layer.key_buffer.data_ptr() for layer in layers))
    values = (ctypes.c_void_p * count)(*(layer.value_buffer.data_ptr() for layer in layers))
    capacities = (ctypes.c_int * count)(*(layer.key_buffer.shape[2] for layer in layers))
    to = (ctypes.c_int * len(moves))(*(pair[0] for pair in moves))
    frm = (ctypes.c_int * len(moves))(*(pair[1] for pair in moves))
    built.move_positions(keys, values, capacities, count, shape[0], shape[1], to, frm, len(moves))
    return True
