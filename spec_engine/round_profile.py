"""Where a speculative round's time goes, part by part, against one plain decoding step (issue #35).

    with RoundProfile(decoder) as profile:
        result = decoder.generate(...)
    profile.parts()     # {"draft forwards": seconds, ...} summed over the run's rounds

The engine itself carries only the clocks its events report (draft, verify, round: core/timing.py). The finer split
is measured from outside, for a profiling run only: the profile wraps the calls `SpeculativeDecoder.step` makes
(the target's forward, the rule, the cache trims, the event builders, the drafter's propose and rollback) and hooks
the drafter's model modules, and puts everything back on exit. A run that is not profiled runs the engine's code
untouched, so profiling costs nothing when it is off. Clock reads wait for the device (timing.clock).

Parts (each a sum over rounds; per round and against a plain step in `table`):

    draft forwards       the draft model's / EAGLE head's forwards while proposing
    head catch-up        the drafter's rollback: the EAGLE head's forward over the accepted tokens' true features
    tree building        proposing minus its forwards: matching, scoring, ranking, q rows (Python and small ops)
    verify forward       the target's forward over [last, drafts] (by row count in `verify_rows`)
    sampling + rule      warping, the accept / reject rule, the correction or bonus draw, and their host reads
    cache trim           trimming / compacting the target cache and checking the invariant
    event building       the RoundEvent: with display=True its display extras (target top tokens, p and q of each
                         node) and their host reads; `bench_hf --profile` decodes with display=False, as its timed
                         arms and the app's timed run do
    bookkeeping          the rest of the round: committing, EOS, stop checks, the engine's Python
"""
from __future__ import annotations

from collections import defaultdict

from spec_engine.core import decoder as decoder_module
from spec_engine.core import timing

PARTS = ("draft forwards", "head catch-up", "tree building", "verify forward", "sampling + rule", "cache trim",
         "event building", "bookkeeping")


class RoundProfile:
    """Wraps one SpeculativeDecoder for the runs inside `with` (see the module docstring)."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.device = decoder.target.device
        self.seconds: dict[str, float] = defaultdict(float)
        self.verify_rows: dict[int, list[float]] = defaultdict(list)     # rows -> forward seconds of each
        self.rounds = 0
        self._restore: list = []
        self._in = None                       # "propose" / "rollback" while the drafter works, else None
        self._module_start: dict[int, float] = {}

    def _clock(self) -> float:
        return timing.clock(self.device)

    def _patch(self, owner, name: str, wrapper) -> None:
        had = name in vars(owner)                 # a module's own name, or an instance's own attribute
        original = getattr(owner, name)
        self._restore.append((owner, name, original, had))
        setattr(owner, name, wrapper(original))

    def _timed(self, part: str):
        def wrap(original):
            def timed(*args, **kwargs):
                start = self._clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.seconds[part] += self._clock() - start
            return timed
        return wrap

    def _forward(self, rows_of):
        def wrap(original):
            def timed(*args, **kwargs):
                start = self._clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    spent = self._clock() - start
                    self.seconds["verify forward"] += spent
                    self.verify_rows[rows_of(*args, **kwargs)].append(spent)
            return timed
        return wrap

    def _drafter(self, phase: str):
        def wrap(original):
            def timed(*args, **kwargs):
                start, self._in = self._clock(), phase
                try:
                    return original(*args, **kwargs)
                finally:
                    self._in = None
                    self.seconds[phase] += self._clock() - start
            return timed
        return wrap

    def _step(self, original):
        def timed(*args, **kwargs):
            start = self._clock()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds["round"] += self._clock() - start
                self.rounds += 1
        return timed

    def _pre(self, module, args):
        self._module_start[id(module)] = self._clock()

    def _post(self, module, args, output):
        spent = self._clock() - self._module_start.pop(id(module), self._clock())
        if self._in == "propose":
            self.seconds["draft forwards"] += spent

    def __enter__(self) -> "RoundProfile":
        d = self.decoder
        self._patch(decoder_module, "forward_logits", self._forward(lambda model, ids, *a, **k: len(ids)))
        self._patch(decoder_module, "one_forward", self._forward(lambda model, segment, *a, **k: len(segment.tokens)))
        self._patch(decoder_module, "verify", self._timed("sampling + rule"))
        self._patch(decoder_module, "verify_tree", self._timed("sampling + rule"))
        for name in ("trim_cache", "keep_path", "check_invariant"):
            self._patch(decoder_module, name, self._timed("cache trim"))
        self._patch(d, "_event", self._timed("event building"))
        self._patch(d, "_tree_event", self._timed("event building"))
        self._patch(d, "step", self._step)
        self._patch(d.drafter, "propose", self._drafter("propose"))
        self._patch(d.drafter, "rollback", self._drafter("rollback"))
        for module in d.drafter.model_modules():
            self._restore.append(module.register_forward_pre_hook(self._pre))
            self._restore.append(module.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc) -> None:
        for item in reversed(self._restore):
            if hasattr(item, "remove"):
                item.remove()
                continue
            owner, name, original, had = item
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)              # the wrapper shadowed its class's method on the instance
        self._restore.clear()

    def parts(self) -> dict[str, float]:
        """Seconds per part, summed over the profiled rounds (PARTS, in order)."""
        s = self.seconds
        split = {"draft forwards": s["draft forwards"], "head catch-up": s["rollback"],
                 "tree building": s["propose"] - s["draft forwards"], "verify forward": s["verify forward"],
                 "sampling + rule": s["sampling + rule"], "cache trim": s["cache trim"],
                 "event building": s["event building"]}
        split["bookkeeping"] = s["round"] - sum(split.values())
        return split


def plain_step_seconds(baseline) -> float:
    """One plain decoding step of a `BaselineResult`: its decoding time (after the prefill) per token after the
    first, the forward and the sampling both."""
    steps = max(len(baseline.tokens) - 1, 1)
    return (baseline.total_seconds - baseline.prefill_seconds) / steps


def profile_table(rows: list[dict]) -> str:
    """rows: {"arm", "rounds", "tokens", "plain_step", "parts": {part: seconds}} (sums over the profiled runs) ->
    a Markdown table of each part per round, in plain steps, and the round's total; tokens per round beside it."""
    head = ["arm", "tokens per round", "plain step ms", *PARTS, "round", "round / tokens per round"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        per_round = {part: r["parts"][part] / max(r["rounds"], 1) / r["plain_step"] for part in PARTS}
        total = sum(per_round.values())
        tpr = r["tokens"] / max(r["rounds"], 1)
        lines.append(f"| {r['arm']} | {tpr:.2f} | {1e3 * r['plain_step']:.1f} | "
                     + " | ".join(f"{per_round[p]:.3f}" for p in PARTS) + f" | **{total:.2f}** | {total / tpr:.2f} |")
    return "\n".join(lines)


def rows_table(verify_rows: dict[str, dict[int, list[float]]], plain_step: dict[str, float]) -> str:
    """The verify forward by row count, per arm: forwards, mean ms and mean in plain steps."""
    lines = ["| arm | rows | forwards | mean ms | plain steps |", "|---|---|---|---|---|"]
    for arm, by_rows in verify_rows.items():
        for n in sorted(by_rows):
            values = by_rows[n]
            mean = sum(values) / len(values)
            lines.append(f"| {arm} | {n} | {len(values)} | {1e3 * mean:.2f} | {mean / plain_step[arm]:.2f} |")
    return "\n".join(lines)
