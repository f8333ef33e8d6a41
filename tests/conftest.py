"""Shared fixtures: the two packaged models, loaded once per test session in float32 on CPU.

They use the normal spec_engine cache, so only the very first session on a machine
pays for dequantizing the GGUF files (~20 s SmolLM2, ~55 s Gemma).
"""
import sys
from pathlib import Path

import pytest
import torch

from spec_engine.models import load_model

sys.path.insert(0, str(Path(__file__).parent))   # tests import the tiny-model helpers as `tiny`

# Tests check correctness, not speed. On two shared cores, intra-op threads fight over tiny tensors
# (measured: 100 ms vs 6 ms per tiny-model sample), so one thread keeps the suite fast and steady.
torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: loads a large model or does a long computation")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (LlamaForCausalLM, vocab 49152, ChatML chat template)."""
    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def gemma():
    """Gemma-3-270M base (Gemma3ForCausalLM, vocab 262144, no chat template, another tokenizer)."""
    return load_model("gemma-3-270m", device="cpu", dtype="float32")
