"""The quantized self-draft: a copy of the target with its weights in fewer bytes (bf16, int8 or int4) proposes; the
full-precision target verifies every draft, so the text is the target's own, exactly as plain decoding writes it.

Why it can pay: a decoding step on a CPU is bound by the bytes of weight it reads, and the copy reads a half to a
seventh of them while agreeing with the target on most next tokens (ML-SpecQD and QSpec draft this way). Why it may
not: on a small model the per-step overheads the copy does not shrink (attention, norms, the module machinery of the
generic path its quantized linears run on) are a large part of a step. bench/quantized.py measures both.
"""
from __future__ import annotations

from spec_engine.core import speed
from spec_engine.drafters.model import ModelDrafter
from spec_engine.models.quantize import TORCH_SCHEMES, quantized_copy

SCHEMES_BY_BITS = {16: "bf16", 8: "int8", 4: "int4"}


class QuantizedSelfDrafter(ModelDrafter):
    """ModelDrafter over `quantized_copy(target_model, scheme)`: its own KV cache and its own quantized linears,
    sharing the target's embeddings and norms (int8 / int4). It only proposes; the target decides."""

    def __init__(self, target_model, scheme: str = "int8"):
        if scheme not in TORCH_SCHEMES:
            raise ValueError(f"a quantized self-draft is one of {', '.join(TORCH_SCHEMES)}, got {scheme!r}")
        self.target = target_model
        self.scheme = scheme
        draft = quantized_copy(target_model, scheme)
        layer = speed.active()
        layer.adopt(draft)          # bf16 keeps the CPU speed layer's lean forward; int8 / int4 run transformers'
        layer.warm(draft)
        super().__init__(draft, name=f"quantized-self:{scheme}")

    def check_target(self, target_model) -> None:
        if target_model is not self.target:
            raise ValueError(f"a {type(self).__name__} drafts for the model it was copied from; "
                             "build one for this target")
