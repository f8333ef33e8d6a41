"""The rules, in the paper's terms: one pure function, the reference every proof calls, and one table that says what
each rule is.

Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): draft tokens x_1..x_k were drawn from
q_1..q_k; the target scored them in one forward, giving p_1..p_{k+1}. For i = 1..k, accept x_i if
u_i < min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a token from normalize(max(0, p_i - q_i)) and stop;
if all k were accepted, emit a bonus token from p_{k+1}. The emitted tokens then follow p exactly.

The other rules engines ship or got wrong (RULE_INFO below says which are exact):
  strict      the target draws its own token y_i from p_i (the CDF of p_i inverted at u_i); x_i is kept when y_i == x_i,
              else y_i itself is emitted. Exact for any draft, since every emitted token is a draw from p; it keeps x_i
              with probability p_i(x_i), which is sum_x q(x) p(x) <= sum_x min(p(x), q(x)) on average over a sampled
              draft, and the same as the exact rule's for a one-hot draft (q(x_i) = 1).
  typical     Medusa's typical acceptance (Cai et al. 2024; FasterDecoding/Medusa, medusa/model/utils.py
              `evaluate_posterior`): keep x_i when p_i(x_i) > min(epsilon, delta * exp(-H(p_i))) with
              H(p) = -sum p log(p + 1e-5) as Medusa computes it and Medusa's defaults epsilon = posterior_threshold
              = 0.09, delta = posterior_alpha = 0.3 (the code's comment: "recommended to be sqrt(posterior_threshold)");
              at the first refusal emit a draw from p_i, after k acceptances the bonus from p_{k+1}. No draw decides a
              draft, q is not read. Lossy: a token above the threshold is kept whatever its share of p. Medusa's p is
              softmax(logits / T); here it is the warped row (the same when top-k and top-p are off).
  q_mismatch  the bug huggingface/transformers #32867 shipped (fixed by #33534): the exact rule fed a q that is not
              the distribution the draft sampled from, the draft's temperature-1 softmax before temperature, top-k
              and top-p, in the ratio and in the residual. Invisible at temperature 1 without top-k / top-p.
  invariant   drafter-invariant speculative decoding (Daliri, Musco and Suresh 2024, "Coupling without communication
              and drafter-invariant speculative decoding"): the token at every position is the Gumbel-max (here the
              equivalent exponential race, argmax_x p(x) / E_x) of p under noise E that depends on the run's seed and
              the position alone (`position_noise`); a draft is kept while it equals that token, and the first token
              that differs is emitted. Exact (the race picks x with probability p(x)), and more: the text is the
              plain sample of that seed (`autoregressive_generate(invariant=True)`), whatever the draft, k, the tree
              or the batch. A one-hot draft is kept with probability p(x), as under the exact rule.
  topp_membership, no_residual   older deliberate mistakes: keep any draft inside the target's top-p set; correct
              from p instead of the residual.

`speculative_step` is all of them, with its random draws given (so that tests can enumerate them) and nothing else:
no host batching, no numpy, no display. The engine runs `verify.verify_sampled` (the same rules plus what the display
shows, and a speed layer's shortcuts); tests/test_verify_enumeration.py proves this function exact (or measures its
drift) by enumeration and the engine's rule equal to it, draw for draw.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EXACT = "exact"
STRICT = "strict"
TYPICAL = "typical"
Q_MISMATCH = "q_mismatch"
INVARIANT = "invariant"
TYPICAL_EPSILON = 0.09        # Medusa's posterior_threshold
TYPICAL_DELTA = 0.3           # Medusa's posterior_alpha
MEDUSA_LOG_FLOOR = 1e-5       # Medusa's entropy reads log(p + 1e-5)


@dataclass(frozen=True)
class RuleInfo:
    """What one verification rule is, said once: the engine, the CLI, the app, the lab and the equivalent-code panel
    all read RULE_INFO."""

    name: str
    label: str                # the app's dropdown label
    lesson: str               # one sentence: what it teaches
    exact: bool               # the emitted tokens follow the target's distribution exactly
    kind: str                 # "exact" | "lossy" (a trade shipped on purpose) | "mistake" (a bug, kept to be measured)
    chains: bool = True       # judges chains of drafts
    trees: bool = False       # judges draft trees (core/tree_rule.py)


RULE_INFO: dict[str, RuleInfo] = {info.name: info for info in (
    RuleInfo(EXACT, "exact (rejection sampling)", "Accept x with probability min(1, p(x)/q(x)) and correct from the "
             "residual max(0, p - q): exact for any draft.", True, "exact", trees=True),
    RuleInfo(STRICT, "strict (target's own draw)", "Keep x only when the target's own draw equals it, else emit that "
             "draw: exact for any draft, but a sampled draft is kept less often (p(x) instead of min(1, p/q)).",
             True, "exact", trees=True),
    RuleInfo(INVARIANT, "drafter-invariant (the seed fixes the text)", "Each position's token is the target's own "
             "Gumbel-max draw under noise fixed by the seed and the position; keep drafts that equal it: exact, and a "
             "seed gives the same text whatever the draft, k or batch.", True, "exact", trees=True),
    RuleInfo(TYPICAL, "typical acceptance (Medusa, lossy)", "Keep x when p(x) > min(0.09, 0.3 exp(-H(p))) (Medusa's "
             "defaults): faster, and the text no longer follows the target's distribution.", False, "lossy",
             trees=True),
    RuleInfo(Q_MISMATCH, "q before warping (transformers bug #32867)", "The exact rule with the draft's distribution "
             "before temperature / top-k / top-p: a shipped bug, invisible at temperature 1.", False, "mistake"),
    RuleInfo("topp_membership", "top-p membership (wrong)", "Keep any draft inside the target's top-p set: "
             "over-weights the draft's picks.", False, "mistake"),
    RuleInfo("no_residual", "no residual (wrong)", "Correct from p instead of the residual: the draft's picks count "
             "twice.", False, "mistake"),
    RuleInfo("tree_best_sibling", "best sibling (wrong, trees)", "Judge every sibling against p itself, no residual "
             "between them: extra siblings become free extra chances.", False, "mistake", chains=False, trees=True),
)}
CHAIN_RULES = tuple(name for name, info in RULE_INFO.items() if info.chains)
EXACT_RULES = tuple(name for name, info in RULE_INFO.items() if info.exact)
# Rules that are not exact, kept so their drift can be measured: the chain's, then the tree's.
WRONG = tuple(name for name, info in RULE_INFO.items() if not info.exact and info.chains)

# The rule each library verifies with by default (equivalent-code panel). From the sources issue #37 cites.
LIBRARY_RULES = {
    "transformers": (EXACT, "rejection sampling with the assistant's own probabilities when it samples "
                            "(`_speculative_sampling`); prompt lookup and other assistants without logits keep a draft "
                            "while it equals the target's own sample, which is `strict`"),
    "vLLM": (STRICT, "drafts (n-gram, EAGLE, draft model) propose their top token, kept with the target's probability "
                     "of it: `strict` (the same as `exact` with a one-hot draft); a probabilistic draft option came "
                     "later (vllm-project/vllm #16899, #20459, #35461)"),
    "llama.cpp": (STRICT, "the target samples its own token at each drafted position and keeps the draft while they "
                          "are equal (a probabilistic rule is asked for in #27694)"),
    "SGLang": (STRICT, "target-only verification with its accept thresholds at 1.0 by default; lowering "
                       "--speculative-accept-threshold-single / -acc makes it lossy"),
}


def rule_info(name: str) -> RuleInfo:
    if name not in RULE_INFO:
        raise ValueError(f"rule must be one of {tuple(RULE_INFO)}, got {name!r}")
    return RULE_INFO[name]


def typical_threshold(p_row: torch.Tensor, epsilon: float = TYPICAL_EPSILON, delta: float = TYPICAL_DELTA) -> float:
    """min(epsilon, delta * exp(-H(p))) for one distribution [vocab], H as Medusa computes it (log(p + 1e-5)), in
    float64: a draft x is kept by the typical rule when p(x) > this."""
    row = p_row.to(torch.float64)
    entropy = float(-(row * torch.log(row + MEDUSA_LOG_FLOOR)).sum())
    return min(epsilon, delta * math.exp(-entropy))


def speculative_step(
    p: torch.Tensor,            # [k + 1, vocab] the target's warped distributions at the k + 1 positions
    q: torch.Tensor,            # [k, vocab] the distributions the drafts were drawn from (one-hot: deterministic);
                                #   q_mismatch: the draft's distributions before warping (the bug is this wrong q)
    drafted: list[int],         # [k] x_1..x_k
    uniforms: list[float],      # [k] u_i in [0, 1), one per draft token (strict: where p_i's CDF is inverted)
    point: float,               # in [0, 1): where the emitted token's CDF is inverted
    rule: str = EXACT,
) -> tuple[int, int]:
    """-> (accepted: how many drafts are kept, next token: the correction after them, or the bonus). The invariant
    rule's draws are noise rows, not uniforms: `invariant_step`."""
    if rule == INVARIANT:
        raise ValueError("rule 'invariant' draws noise per position: use rule.invariant_step")
    k = len(drafted)
    for i in range(k):
        p_x, q_x = float(p[i, drafted[i]]), float(q[i, drafted[i]])
        if rule == STRICT:
            own = inverse_cdf(p[i], uniforms[i])
            if own != drafted[i]:
                return i, own
            continue
        if rule == "topp_membership":
            keep = p_x > 0
        elif rule == TYPICAL:
            keep = p_x > typical_threshold(p[i])
        else:
            keep = q_x > 0 and uniforms[i] < min(1.0, p_x / q_x)
        if not keep:
            return i, inverse_cdf(residual(p[i], q[i]) if rule in (EXACT, Q_MISMATCH) else p[i], point)
    return k, inverse_cdf(p[k], point)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)), [vocab]. Where p <= q everywhere (p == q up to rounding: a rejection then has
    probability ~0) it is p."""
    left = torch.clamp(p - q, min=0.0)
    total = left.sum()
    return p if total <= torch.finfo(left.dtype).tiny else left / total


def inverse_cdf(probs: torch.Tensor, point: float) -> int:
    """The token whose step of the CDF of probs [vocab] (accumulated in float64, in id order) holds point * total;
    a token of probability zero is never returned."""
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    return min(int(torch.searchsorted(cdf, point * cdf[-1], right=True)), probs.shape[-1] - 1)


NOISE_KEY = 0x9E3779B97F4A7C15          # splitmix64's increment: seed and position mix into one generator seed


def noise_key(seed: int, position: int) -> int:
    """A 63-bit generator seed from (seed, position), by splitmix64's finalizer: nearby seeds and positions give
    unrelated streams."""
    mask = (1 << 64) - 1
    z = ((seed & mask) * NOISE_KEY + position * 0xBF58476D1CE4E5B9 + NOISE_KEY) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def position_noise(seed: int, positions, vocab: int, device="cpu") -> torch.Tensor:
    """Exponential(1) noise E [len(positions), vocab] float64 for the invariant rule: row j is a function of (seed,
    positions[j]) alone, drawn on the CPU (so a GPU and a CPU run, a batch and a lone run, see the same numbers)."""
    rows = []
    for position in positions:
        generator = torch.Generator("cpu").manual_seed(noise_key(seed, int(position)))
        rows.append(torch.empty(vocab, dtype=torch.float64).exponential_(generator=generator))
    return torch.stack(rows).to(device) if rows else torch.empty(0, vocab, dtype=torch.float64, device=device)


def race(p_row: torch.Tensor, noise_row: torch.Tensor) -> int:
    """The exponential race argmax_x p(x) / E_x, [vocab], [vocab] -> a token drawn with probability p(x) (the
    Gumbel-max trick: log p(x) - log E_x is log p(x) plus Gumbel noise); a token of probability zero never wins."""
    return int(torch.argmax(p_row.to(torch.float64) / noise_row))


def invariant_step(
    p: torch.Tensor,            # [k + 1, vocab] the target's warped distributions at the k + 1 positions
    drafted: list[int],         # [k] x_1..x_k
    noise: torch.Tensor,        # [k + 1, vocab] position_noise of the k + 1 positions
) -> tuple[int, int]:
    """The drafter-invariant rule: -> (accepted, next token). The target's token at position i is race(p_i, E_i);
    x_i is kept while equal to it, and the first that differs is emitted (after k keeps, the bonus race(p_k, E_k))."""
    k = len(drafted)
    assert p.shape[0] == k + 1 and noise.shape == p.shape, (tuple(p.shape), tuple(noise.shape), k)
    for i in range(k):
        own = race(p[i], noise[i])
        if own != drafted[i]:
            return i, own
    return k, race(p[k], noise[k])
