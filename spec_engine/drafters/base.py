"""The drafter protocol (defined beside the loop that calls it, core/drafting.py) and helpers drafters share."""
from __future__ import annotations

from spec_engine.core.drafting import Drafter, Proposal

__all__ = ["Drafter", "Proposal", "vocab_size", "common_prefix_len"]


def vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
