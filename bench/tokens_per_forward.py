"""Tokens per target forward of engine draft arms on held-out prompts (issue #35), greedy, up to 64 tokens: timing-free
but for the verify-cost curve, which is measured once per process and shared by every arm, so arms compare within a
run. Each run's tokens are checked equal to plain greedy decoding's. Arms are NAME[@K] (default K = 8);
NAME~X sets a SuffixFirstDrafter's min_expected to X, NAME^F a suffix drafter's max_spec_factor (none: no cap).

    python -m bench.tokens_per_forward 1 eagle+lookup-tree@8 eagle+suffix@8 suffix@8 prompt-lookup@8 \
        > bench/results/tokens-per-forward-six-kinds.md

The first argument is how many prompts of each kind of bench/data/six_kinds.json.
"""
import sys
import statistics
import torch
import spec_engine as se
from spec_engine.models import load_model
from spec_engine.bench_hf import load_prompts, encode, Path, select_prompts, interleaved
torch.set_num_threads(1)
m = load_model("smollm2-135m-instruct", "cpu", "float32")
prompts = interleaved(select_prompts(load_prompts(Path("bench/data/six_kinds.json")), "held-out", None,
                                     int(sys.argv[1])))
arms = sys.argv[2:]
G = se.SamplingParams(temperature=0)
eos = m.tokenizer.eos_token_id
res = {a: {} for a in arms}
for p in prompts:
    ids = encode(m, p)
    plain = se.autoregressive_generate(m.model, ids, max_new_tokens=64, sampling=G, eos_token_id=eos).tokens
    for a in arms:
        name, _, kk = a.partition("@")
        expect = factor = None
        if "^" in name:
            name, _, factor = name.partition("^")
        if "~" in name:
            name, _, expect = name.partition("~")
        d = se.make_drafter(name, m)
        if expect is not None:
            d.min_expected = float(expect)
        if factor is not None:
            target = d.suffix if hasattr(d, "suffix") else d
            target.max_spec_factor = None if factor == "none" else float(factor)
        r = se.SpeculativeDecoder(m.model, d).generate(ids, k=int(kk or 8), max_new_tokens=64, sampling=G,
                                                       eos_token_id=eos)
        assert r.tokens == plain, (a, p.name)
        res[a].setdefault(p.kind, []).append(len(r.tokens) / len(r.rounds))
    print(p.name, {a: round(res[a][p.kind][-1], 2) for a in arms}, flush=True)
kinds = list(dict.fromkeys(p.kind for p in prompts))
print("| arm | " + " | ".join(kinds) + " | all |")
print("|---|" + "---|" * (len(kinds) + 1))
for a in arms:
    allv = [v for k in kinds for v in res[a][k]]
    print(f"| {a} | " + " | ".join(f"{statistics.fmean(res[a][k]):.2f}" for k in kinds)
          + f" | **{statistics.fmean(allv):.2f}** |")
