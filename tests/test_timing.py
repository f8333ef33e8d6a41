"""Clock reads wait for the device (spec_engine/core/timing.py): CUDA queues kernels and returns, so a clock read
right after a forward would time the launch. Without a GPU: `sync` dispatches to torch.cuda.synchronize (patched
to record), is a no-op on the CPU, and every clock read of both loops goes through it with the model's device."""
import pytest
import torch

import spec_engine as se
from spec_engine.core import decoder, timing
from tiny import tiny_llama

PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])


@pytest.fixture
def cuda_syncs(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("cuda", device)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
    return calls


def test_sync_waits_for_cuda_and_is_a_no_op_on_the_cpu(cuda_syncs):
    for device in ("cpu", torch.device("cpu"), torch.device("meta"), None):
        timing.sync(device)
    assert cuda_syncs == []
    timing.sync(torch.device("cuda", 1))
    timing.sync("cuda:0")
    timing.sync(torch.device("mps"))
    assert cuda_syncs == [("cuda", torch.device("cuda", 1)), ("cuda", "cuda:0"), ("mps", None)]
    before = timing.clock(torch.device("cuda", 0))
    assert cuda_syncs[-1] == ("cuda", torch.device("cuda", 0)) and timing.clock("cpu") >= before


def test_every_clock_read_of_both_loops_waits_for_the_models_device(monkeypatch):
    """Plain decoding's prefill and step clocks (the speed plot's plain curve) and the speculative loop's round,
    draft and verify clocks: each perf_counter() read directly follows a sync on the target's device."""
    events = []
    real_counter = timing.perf_counter
    monkeypatch.setattr(timing, "sync", lambda device: events.append(("sync", device)))
    monkeypatch.setattr(timing, "perf_counter", lambda: events.append(("clock", None)) or real_counter())
    assert not hasattr(decoder, "perf_counter")          # the loop reads no clock of its own
    model = tiny_llama(vocab=8, layers=2, seed=0)
    greedy = se.SamplingParams(0.0)
    plain = se.autoregressive_generate(model, PROMPT, max_new_tokens=6, sampling=greedy)
    plain_reads = sum(kind == "clock" for kind, _ in events)
    assert plain_reads == 2 + 2 * len(plain.step_seconds) + 1           # prefill, each step, the total
    spec = se.SpeculativeDecoder(model, se.PromptLookupDrafter()).generate(PROMPT, k=3, max_new_tokens=6,
                                                                           sampling=greedy)
    assert sum(kind == "clock" for kind, _ in events) - plain_reads == 2 + 2 + 4 * len(spec.rounds)
    assert events and all(events[i - 1] == ("sync", torch.device("cpu"))
                          for i, (kind, _) in enumerate(events) if kind == "clock")
    assert spec.tokens == plain.tokens and all(r.verify_seconds >= 0 for r in spec.rounds)
