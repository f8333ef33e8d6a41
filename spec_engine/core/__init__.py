"""The core: what speculative decoding is, in device-generic torch + transformers code.

    sampling.py   SamplingParams and warp (temperature, top-k, top-p), inverse-CDF draws
    rule.py       the rule in the paper's terms, one pure function (the reference the proofs call)
    tree_rule.py  the same on a token tree: recursive rejection sampling over siblings, and greedy on trees
    verify.py     the rule as the engine runs it, with the display's extras (tested equal to rule.py)
    drafting.py   what the loop asks of a drafter (Drafter, Proposal, TreeProposal)
    cache.py      KV caches: creation, trimming, the invariant checked every round, the forward (and the tree
                  forward with its attention mask, and the accepted path's compaction)
    decoder.py    the loop (draft, score, verify, commit, trim) and plain decoding
    events.py     the typed per-round events and run summaries; metrics.py: the speedup formula's terms
    timing.py     clock reads that wait for the device first (CUDA runs kernels asynchronously)
    speed.py      the one seam where an optional speed layer (spec_engine/accel) plugs in

Rule: nothing here imports the speed layer, the drafters, the models, the classroom or the UI
(tests/test_architecture.py reads the imports).
"""
