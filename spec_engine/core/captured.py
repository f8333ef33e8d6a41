"""Fixed-shape forwards of the static path, run eagerly, under inductor, or replayed from a captured CUDA graph.

A step is one model forward over `width` rows (a verify bucket, core/static_cache.py) after a static cache, with
every varying input in a tensor of fixed shape: the token ids [1, width], their rotary positions [1, width], the
cache slots they are written to [width] and an additive mask over the cache's whole capacity
[1, 1, width, capacity]. Nothing the forward reads from Python changes between two rounds of one bucket, so one
graph (compiled or captured) per (model, cache buffers, width, hidden states wanted) serves every round.

    eager_step      the forward as transformers runs it (the reference every runner is tested equal to)
    CompiledSteps   torch.compile, inductor, fullgraph at fixed shapes (dynamic=False): the CPU's compiled form
    CapturedSteps   torch.cuda.CUDAGraph, one graph per key, replayed after copying the inputs in

CUDA graphs are used directly rather than torch.compile(mode="reduce-overhead"): every input already has a fixed
shape and a fixed address here, so a plain capture replays the whole forward with one launch and needs no compile;
inductor's compile of a 1.7B or 8B model takes minutes per bucket (a GPU check has 5 minutes in all), and its
cudagraph trees re-record when a guard or an input address changes, which a cache made per generation would cause.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch


def _set_slots(cache, slots: torch.Tensor | None) -> None:
    for layer in cache.layers:
        layer.slots = slots


def eager_step(model, cache, input_ids, positions, slots, mask, hidden: bool):
    """input_ids [1, W], positions [1, W], slots [W], mask [1, 1, W, capacity] -> (logits [W, vocab], hidden states
    (a tuple of [1, W, H]) or None). The cache's static layers write the W rows at `slots` and attend over their
    whole buffers under `mask`."""
    _set_slots(cache, slots)
    try:
        out = model(input_ids=input_ids, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                    logits_to_keep=0, output_hidden_states=hidden)
    finally:
        _set_slots(cache, None)
    return out.logits[0], (tuple(out.hidden_states) if hidden else None)


class CompiledSteps:
    """eager_step under torch.compile (inductor, fullgraph, dynamic=False): dynamo keeps one graph per input shape,
    that is per bucket, and per model. The recompile limit is raised for this function only, so that six buckets,
    with and without hidden states, for a target and its draft model all keep their graphs."""

    name = "inductor"

    def __init__(self, recompile_limit: int = 64):
        self.recompile_limit = recompile_limit
        self.compiled = torch.compile(eager_step, backend="inductor", fullgraph=True, dynamic=False)

    def __call__(self, model, cache, input_ids, positions, slots, mask, hidden: bool):
        import torch._dynamo
        with torch._dynamo.config.patch(recompile_limit=self.recompile_limit):
            return self.compiled(model, cache, input_ids, positions, slots, mask, hidden)


class _Graph:
    """One captured forward: its static inputs (copied into before each replay) and outputs (cloned after)."""

    def __init__(self, model, cache, input_ids, positions, slots, mask, hidden: bool, warmups: int = 2):
        self.inputs = [t.clone() for t in (input_ids, positions, slots, mask)]
        self.model = weakref.ref(model)       # the graph reads its weights' addresses: only this model may replay it
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):       # warm-up off the capture (lazy inits, cuBLAS workspaces), as documented
            for _ in range(warmups):
                eager_step(model, cache, *self.inputs, hidden)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = eager_step(model, cache, *self.inputs, hidden)

    def replay(self, input_ids, positions, slots, mask):
        for static, given in zip(self.inputs, (input_ids, positions, slots, mask)):
            static.copy_(given, non_blocking=True)
        self.graph.replay()
        logits, hidden = self.outputs         # cloned: the next replay of this graph overwrites them
        return logits.clone(), (tuple(h.clone() for h in hidden) if hidden is not None else None)


class CapturedSteps:
    """One CUDA graph per (model, cache buffers, width, hidden), captured at its first use and replayed after.

    A graph reads and writes the cache's buffers at the addresses it was captured with, so the key holds them (and
    not the cache, which may be freed): a later cache of the same model whose buffers the allocator placed at the
    same addresses has the same shapes, and reuses the graph correctly.
    A cache not yet initialized (no buffers) runs eagerly once. At most `limit` graphs are kept (least recently
    used dropped), each with its own memory pool."""

    name = "cuda-graph"

    def __init__(self, limit: int = 48):
        self.limit = limit
        self.graphs: OrderedDict = OrderedDict()
        self.captures = self.replays = 0

    def __call__(self, model, cache, input_ids, positions, slots, mask, hidden: bool):
        buffers = [layer.key_buffer for layer in cache.layers] + [layer.value_buffer for layer in cache.layers]
        if any(b is None for b in buffers):
            return eager_step(model, cache, input_ids, positions, slots, mask, hidden)
        key = (id(model), tuple(b.data_ptr() for b in buffers), tuple(mask.shape), hidden)
        graph = self.graphs.pop(key, None)
        if graph is None or graph.model() is not model:
            graph = _Graph(model, cache, input_ids, positions, slots, mask, hidden)
            self.captures += 1
        self.graphs[key] = graph
        while len(self.graphs) > self.limit:
            self.graphs.popitem(last=False)
        self.replays += 1
        return graph.replay(input_ids, positions, slots, mask)


def runner_for(device: torch.device, compile_cpu: bool = False):
    """The fixed-shape runner for a model on `device`: captured graphs on CUDA; on other devices eager_step, or
    CompiledSteps with `compile_cpu`."""
    if device.type == "cuda":
        return CapturedSteps()
    return CompiledSteps() if compile_cpu else eager_step
