"""The quantized self-draft: a copy of the target with its weights in fewer bytes (bf16, int8 or int4) proposes; the
full-precision target verifies every draft, so the text is the target's own, exactly as plain decoding writes it.

Why it can pay: a decoding step on a CPU is bound by the bytes of weight it reads, and the copy reads a half to a
seventh of them while agreeing with the target on most next tokens (ML-SpecQD and QSpec draft this way). Why it may
not: on a small model the per-step overheads the copy does not shrink (attention, norms, the module machinery of the
generic path its quantized linears run on) are a large part of a step. bench/quantized.py measures both.
"""
from __future__ import annotations

import threading
import weakref

from torch import nn

from spec_engine.core import speed
from spec_engine.drafters.model import ModelDrafter
from spec_engine.models.quantize import TORCH_SCHEMES, quantized_copy

SCHEMES_BY_BITS = {16: "bf16", 8: "int8", 4: "int4"}

_SHARED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()   # target -> {key: copy}
_SHARED_LOCK = threading.Lock()


def shared_copy(target_model, scheme: str) -> nn.Module:
    """The quantized copy of `target_model` in `scheme`, prepared for the speed layer, made once per target and
    scheme and kept while the target lives (one scheme at a time). Why: quantizing every linear layer is a load's
    work, not a run's, and the app builds a fresh drafter for every run; the copy is only read while drafting (each
    drafter keeps its own cache), so runs share it as they share the target. A target whose weights were replaced
    since (moved, cast) gets a new copy."""
    embedding = target_model.get_input_embeddings().weight
    key = (scheme, str(embedding.device), embedding.dtype, embedding.data_ptr())
    with _SHARED_LOCK:
        copies = _SHARED.setdefault(target_model, {})
        if key not in copies:
            copies.clear()
            draft = quantized_copy(target_model, scheme)
            layer = speed.active()
            layer.adopt(draft)      # bf16 keeps the CPU speed layer's lean forward; int8 / int4 run transformers'
            layer.warm(draft)
            copies[key] = draft
        return copies[key]


class QuantizedSelfDrafter(ModelDrafter):
    """ModelDrafter over `quantized_copy(target_model, scheme)`: its own KV cache and its own quantized linears,
    sharing the target's embeddings and norms (int8 / int4). It only proposes; the target decides."""

    def __init__(self, target_model, scheme: str = "int8"):
        if scheme not in TORCH_SCHEMES:
            raise ValueError(f"a quantized self-draft is one of {', '.join(TORCH_SCHEMES)}, got {scheme!r}")
        self.target = target_model
        self.scheme = scheme
        super().__init__(shared_copy(target_model, scheme), name=f"quantized-self:{scheme}")

    def check_target(self, target_model) -> None:
        if target_model is not self.target:
            raise ValueError(f"a {type(self).__name__} drafts for the model it was copied from; "
                             "build one for this target")
