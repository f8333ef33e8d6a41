"""Weight-only quantization with torch's own CPU kernels, and a quantized copy of a model that shares the rest.

The schemes (`TORCH_SCHEMES`), each chosen for what a CPU runs with no extra library:

    bf16   every weight and activation in bfloat16 (`model.to(torch.bfloat16)`): half of fp32's bytes, and the
           engine's CPU speed layer (its lean forward and packed bf16 products) still runs the model.
    int8   each decoder linear's weight as int8 with one bf16 scale per output row (symmetric, weight-only), multiplied
           by torch's `_weight_int8pack_mm`, the kernel gpt-fast's int8 mode uses: a quarter of fp32's bytes.
    int4   each decoder linear's weight in groups of INT4_GROUP input columns, 4 bits a weight with a bf16 scale and
           zero per group (asymmetric, as llama.cpp's Q4_1 and gpt-fast's int4), multiplied by torch's
           `_weight_int4pack_mm_for_cpu`: about a seventh of fp32's bytes.

Why these kernels and not others: torch.ao's dynamic quantization rounds the activations to int8 as well (a second
change to the model) and is deprecated in favour of torchao, which is not a dependency here; bitsandbytes ("8bit",
"4bit" in models/loading.py) runs on the CPU but its kernels were not faster there than fp32. The int8 / int4 kernels
take bf16 activations: measured on two shared AVX-512 cores (one 1536 x 576 product, one row) they took 85-115 us
with bf16 rows and 1.2 / 2.3 ms with fp32 rows (a slow fallback), so each quantized linear casts its input to bf16 and
its output back to the model's dtype.

The LM head of an int8 / int4 model is kept in bf16 instead (`Bf16Head`): the engine and the drafters read the output
embedding's weight (the vocabulary size every run, the EAGLE head's reduced rows), it is tied to the input embedding
in the offline models (which must stay dense for the token lookup), and the top-1 choice is most sensitive there.
Embeddings and norms stay as loaded. Quantized modules are not nn.Linear, so the CPU speed layer's lean forward
declines such a model and transformers' modules run it (accel/lean_llama.py `unsupported_reason`).

The offline default's fp32 weights were themselves dequantized from a Q4_1 GGUF (blocks of 32 weights with a scale and
a minimum), so int4 in groups of 32 nearly reproduces them (up to the bf16 rounding of scale and zero): on that model
int4 may change less than int8, which says nothing about int4 on a model trained and shipped in bf16.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

TORCH_SCHEMES = ("bf16", "int8", "int4")
COMPUTE_DTYPE = torch.bfloat16      # the activations the int8 / int4 kernels are fast with (module docstring)
INT4_GROUP = 32                     # input columns per scale and zero: the finest group the kernel takes
INT4_INNER_K_TILES = 2              # the packing layout torch's CPU int4 kernel reads
INT4_ROWS = 16                      # the kernel's output rows come in multiples of 16: others are padded with zeros
_TINY = 1e-12                       # an all-zero row or group gets this scale instead of 0 (never divide by 0)


def check_scheme(scheme: str) -> None:
    if scheme not in TORCH_SCHEMES:
        raise ValueError(f"quantization scheme must be one of {', '.join(TORCH_SCHEMES)}, got {scheme!r}")


def check_kernels(scheme: str, device: torch.device) -> None:
    """The int8 / int4 schemes need torch's CPU kernels; raise with what is missing."""
    if scheme == "bf16":
        return
    if device.type != "cpu":
        raise ValueError(f"{scheme} weights multiply by torch's CPU kernels; the model is on {device}: use '8bit' "
                         "or '4bit' (bitsandbytes) there")
    op = "_weight_int8pack_mm" if scheme == "int8" else "_weight_int4pack_mm_for_cpu"
    if not hasattr(torch.ops.aten, op):
        raise ValueError(f"{scheme} needs torch.ops.aten.{op}, which this torch {torch.__version__} lacks")


# ---------------------------------------------------------------- the arithmetic (pure functions, tested directly)


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 [out, in], bf16 scales [out]) with weight ~ int8 * scales[:, None]; the scales are
    rounded to bf16 before the weights are, so the pair describes exactly what the kernel multiplies by."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=_TINY).to(COMPUTE_DTYPE)          # [out]
    quantized = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized, scales


def int4_groups(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (codes int32 in 0..15 [out, in], scales [out, in / group], zeros [out, in / group]), both
    bf16, with weight ~ (codes - 8) * scale + zero for each group of `group` input columns (the kernel's convention).
    Scale and zero are rounded to bf16 first and the codes chosen against the rounded values."""
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"int4 needs in_features divisible by {group}, got a weight of shape {tuple(weight.shape)}")
    groups = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)                                # [out, in / group]
    scales = ((high - low) / 15).clamp(min=_TINY).to(COMPUTE_DTYPE)
    zeros = (low + 8 * scales.float()).to(COMPUTE_DTYPE)
    offset = zeros.float() - 8 * scales.float()                                         # what code 0 stands for
    codes = torch.round((groups - offset[..., None]) / scales.float()[..., None]).clamp(0, 15)
    return codes.to(torch.int32).reshape(out_features, in_features), scales, zeros


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int = INT4_GROUP):
    """The float32 weight [out, in] that `int4_groups`' output stands for (the reference the kernel is tested on)."""
    out_features, in_features = codes.shape
    grouped = codes.float().reshape(out_features, in_features // group, group)
    return ((grouped - 8) * scales.float()[..., None] + zeros.float()[..., None]).reshape(out_features, in_features)


# ------------------------------------------------------------------------------------------------- the modules


class Int8Linear(nn.Module):
    """y = x W^T + b, W stored as int8 [out, in] with a bf16 scale per output row (`int8_rows`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        quantized, scales = int8_rows(linear.weight)
        self.register_buffer("weight_int8", quantized)                                   # [out, in]
        self.register_buffer("scales", scales)                                           # [out]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def dequantized(self) -> torch.Tensor:
        return self.weight_int8.float() * self.scales.float()[:, None]                   # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE).contiguous()             # [n, in]
        if rows.device.type == "cpu":
            out = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales)
        else:
            out = F.linear(rows, self.dequantized().to(COMPUTE_DTYPE))
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per output row"


class Int4Linear(nn.Module):
    """y = x W^T + b, W stored as 4-bit codes packed for torch's CPU kernel with a bf16 scale and zero per group of
    INT4_GROUP input columns (`int4_groups`). Output rows are padded to a multiple of INT4_ROWS for the kernel."""

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP):
        super().__init__()
        self.in_features, self.out_features, self.group = linear.in_features, linear.out_features, group
        padded = -(-self.out_features // INT4_ROWS) * INT4_ROWS
        weight = F.pad(linear.weight.detach().float(), (0, 0, 0, padded - self.out_features))   # [padded, in]
        codes, scales, zeros = int4_groups(weight, group)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INT4_INNER_K_TILES))
        # [in / group, padded, 2]: the kernel's layout of each group's scale and zero
        self.register_buffer("scales_and_zeros", torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE).contiguous()             # [n, in]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group, self.scales_and_zeros)
        out = out[:, :self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 in groups of {self.group}"


class Bf16Head(nn.Module):
    """The LM head of an int8 / int4 model: a bf16 copy of the head's weight (untied from the input embedding),
    fed bf16 and answering in the caller's dtype. `weight` is the real bf16 tensor, for the readers of the output
    embedding (vocabulary size, EAGLE's reduced rows)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.head = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              device=linear.weight.device, dtype=COMPUTE_DTYPE)
        self.head.requires_grad_(False)
        self.head.weight.copy_(linear.weight.detach())
        if linear.bias is not None:
            self.head.bias.copy_(linear.bias.detach())

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.to(COMPUTE_DTYPE)).to(x.dtype)


QUANTIZED_LINEARS = (Int8Linear, Int4Linear)


# -------------------------------------------------------------------------------------- whole models


def quantize_(model: nn.Module, scheme: str) -> nn.Module:
    """Quantize `model` in place (see the module docstring); returns it. bf16 casts it; int8 / int4 replace every
    floating-point nn.Linear but the LM head, which becomes a Bf16Head."""
    check_scheme(scheme)
    device = next(model.parameters()).device
    check_kernels(scheme, device)
    if scheme == "bf16":
        return model.to(torch.bfloat16)
    head = model.get_output_embeddings()
    make = Int8Linear if scheme == "int8" else Int4Linear
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if child is not head and isinstance(child, nn.Linear) and child.weight.is_floating_point()]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no floating-point nn.Linear layers besides its LM head for "
                         f"{scheme} (GPT-2's are Conv1D); use bf16 or bitsandbytes")
    with torch.no_grad():
        for parent, name, child in targets:
            setattr(parent, name, make(child))
        if isinstance(head, nn.Linear):
            model.set_output_embeddings(Bf16Head(head))
    if hasattr(model, "config"):
        model.config.tie_word_embeddings = False     # the head is its own bf16 copy now: never re-tie it
    return model


def quantized_copy(model: nn.Module, scheme: str) -> nn.Module:
    """A quantized copy of a transformers causal LM for drafting beside it: fresh modules (none of the speed layer's
    state on the original carries over) that share the original's embeddings and norms (int8 / int4) and hold their
    own quantized linears; the original is left untouched. bf16 copies every weight. Built on the meta device and
    filled from the original's state dict, so no full-size random initialisation is paid for."""
    check_scheme(scheme)
    device = next(model.parameters()).device
    check_kernels(scheme, device)
    config = copy.deepcopy(model.config)
    with torch.device("meta"):
        clone = type(model)(config)
    clone.load_state_dict(model.state_dict(), assign=True, strict=True)
    _share_derived_modules(clone, model)
    clone.eval().requires_grad_(False)
    if scheme == "bf16":
        return clone.to(torch.bfloat16)          # new bf16 tensors: the original's stay as they were
    return quantize_(clone, scheme)


def _share_derived_modules(clone: nn.Module, model: nn.Module) -> None:
    """Modules whose tensors are not in the state dict (rotary frequencies: non-persistent buffers and plain tensor
    attributes computed in __init__) are still on the meta device after `load_state_dict`; they hold only constants
    derived from the config, so the clone takes copies of the original's (copies: a bf16 cast of the clone must not
    cast the original's buffers)."""
    originals = dict(model.named_modules())
    for name, module in list(clone.named_modules()):
        if name and _has_meta_tensor(module):
            parent_name, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent_name) if parent_name else clone, child, copy.deepcopy(originals[name]))
    meta = [name for name, t in list(clone.named_parameters()) + list(clone.named_buffers()) if t.is_meta]
    if meta:
        raise ValueError(f"the quantized copy could not take these tensors from the original: {', '.join(meta)}")


def _has_meta_tensor(module: nn.Module) -> bool:
    own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    attributes = [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    return any(t.is_meta for t in own + attributes)


def weight_bytes_per_token(model: nn.Module) -> int:
    """The bytes of weights one decoding step reads: every parameter and buffer once (tied tensors once), the LM head
    whole, and of the input embedding table one row (unless the head is that table)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    rows_only = embedding.data_ptr() != head.data_ptr()
    seen = {embedding.data_ptr()} if rows_only else set()
    total = embedding[0].numel() * embedding.element_size() if rows_only else 0
    for tensor in [head, *model.parameters(), *model.buffers()]:
        if tensor.is_meta or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total
