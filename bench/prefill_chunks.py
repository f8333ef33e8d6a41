"""What chunking the prefill costs: one forward over a prompt against forwards of `chunk` tokens each (what
spec_engine.core.cache.prefill runs, so that a deadline or Stop can end a long prefill between two chunks).
Prints each chunk's seconds and the sum, with the CPU speed layer and without it.

    PYTHONPATH=. python bench/prefill_chunks.py [--tokens 512] [--chunks 512 128]
"""
from __future__ import annotations

import argparse
import time

import spec_engine as se
from spec_engine.core import speed
from spec_engine.core.cache import forward_logits, new_cache


def chunk_seconds(model, ids: list[int], chunk: int) -> list[float]:
    cache, seconds = new_cache(model), []
    for begin in range(0, len(ids), chunk):
        start = time.perf_counter()
        forward_logits(model, ids[begin:begin + chunk], cache, 1)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--chunks", type=int, nargs="+", default=[512, 128])
    args = parser.parse_args()
    target = se.load_model("smollm2-135m-instruct", device="cpu", dtype="float32")
    text = " ".join(f"Line {i}: the tide comes in and goes out again over the grey sand." for i in range(args.tokens))
    ids = target.encode_prompt(text)[0].tolist()[:args.tokens]
    for label in ("speed layer", "core only"):
        if label == "core only":
            speed.install(speed.SpeedLayer())
        for chunk in args.chunks:
            seconds = chunk_seconds(target.model, ids, chunk)
            print(f"{label:11} {len(ids)} tokens, chunks of {chunk}: {' '.join(f'{s:.2f}' for s in seconds)} "
                  f"= {sum(seconds):.2f} s", flush=True)


if __name__ == "__main__":
    main()
