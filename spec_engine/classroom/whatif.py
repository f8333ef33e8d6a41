"""What would this run be on a GPU? A projection from acceptance by position and a cost model: never a measurement.

Words. alpha_i (acceptance at position i): the chance that draft i is accepted given that drafts 1..i-1 were. A round
that drafts k tokens then emits on average

    E = 1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 ... alpha_k        (tokens per target forward)

and costs, in plain decoding steps (one target forward over one token),

    round cost = v(rows) + c * draft_forwards
    v(rows)    = v_1 + s * (rows - 1)            the verify forward over rows = k + 1 (a tree: its nodes + 1)
    speedup    = E / round cost,   tokens/s = plain tokens/s * speedup

GPU classes (decode of a large target at batch 1 is memory bound): one forward reads every weight once, whatever its
rows, and each extra row adds its matmul work, so with no overlap of the two v_1 = 1 and s = 1 / n_ridge, where
n_ridge = tensor FLOP/s * bytes per parameter / (2 * memory bandwidth) is the rows at which the arithmetic takes as
long as reading the weights (76 on an RTX 3090, 153 on an A100, 295 on an H100 in fp16). A draft forward costs
c = max(P_draft / P_target, L_draft / L_target): its share of the weights to read, but at least its share of the
layers, since a small model's forward on a GPU is bound by its kernel launches, layer by layer. An EAGLE head reads
one decoder layer of the target's width, a 2h -> h projection and the target's LM head. Prompt lookup has no draft
forward. Plain tokens/s is the bandwidth ceiling (weights / bandwidth); real runs reach part of it, and the speedup
does not depend on that part when memory and arithmetic reach the same part of their peaks.

Batch size and bytes per weight (`forward_seconds`). One forward over N rows (all B sequences together: B in plain
decoding, B x rows when verifying) takes, in seconds,

    t(N) = overhead + params x bytes per weight / bandwidth + (N - 1) x 2 params / tensor FLOP/s

the weights read once (fewer bytes a weight: int8, 4-bit), then the arithmetic of every row after the first (the first
row's matrix-vector work hides under the weight read, which is what makes plain decoding memory bound). The two
terms add rather than overlap (a sum, not a roofline max): a decode forward is a chain of small dependent kernels,
each too small to keep the memory system and the tensor cores busy at once, and the published EAGLE-3 batch rows
rule the max out (a chain of 5 at batch 32 verifies 192 rows, under the H100's ridge, so a max would give batch 32
the same speedup as batch 8; SGLang measured 1.62x -> 1.32x). A plain step at batch B is t(B); verifying `rows` rows
a sequence costs t(B x rows) = t(B) + B (rows - 1) x the row cost, so in plain steps v_1 = 1 and s = B x row cost /
t(B): the gain of speculation falls as the batch grows towards compute bound. With no overhead at batch 1 in fp16
this is the model above, unchanged.

This CPU: v_1, s and c come from the run's own rounds, in units of its own plain decoding step (`measured_cost`): a
projection from measured costs, at the run's own batch (1) and weights.

The presets (presets/whatif.yaml) are datasheet figures and model configs, plus four calibrated numbers: a serving
stack's fixed time per forward and per speculative round (`Stack`), and the tokens per forward of a batch row whose
acceptance is not published, each stated there with the published row it was calibrated on. The calibration rows
(Spec-Bench's RTX 3090 leaderboard, EAGLE-3 on SGLang at batch 1, 8 and 32, gpt-fast's bf16 / int8 / int4 tokens/s)
check the model (tests/test_whatif.py, tests/test_whatif_batch.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spec_engine.core.metrics import draft_length

PRESETS_PATH = Path(__file__).resolve().parents[2] / "presets" / "whatif.yaml"
BYTES_PER_PARAM = 2          # fp16 / bf16 weights
MAX_POSITIONS = 16


# ------------------------------------------------------------------------------------------ acceptance by position

def acceptance_by_position(rounds) -> list[float]:
    """alpha_i from RoundEvents: of the rounds that offered a draft at position i (i drafts deep, a tree counted by
    its depth) after accepting the i - 1 before it, the share that accepted it. Positions no round reached are left
    off. (Issue #37 adds RunStats.acceptance_by_position; `run_acceptance_by_position` prefers it.)"""
    offered: list[int] = []
    kept: list[int] = []
    for r in rounds:
        depth = draft_length(r)
        for i in range(min(depth, r.accepted + 1)):     # positions 1..accepted + 1 were judged (if drafted)
            if i >= len(offered):
                offered.append(0)
                kept.append(0)
            offered[i] += 1
            kept[i] += i < r.accepted
    return [k / n for k, n in zip(kept, offered)]


def run_acceptance_by_position(stats, rounds) -> list[float]:
    """The run's alpha_i: RunStats.acceptance_by_position where the engine provides it, else from its rounds."""
    provided = getattr(stats, "acceptance_by_position", None) if stats is not None else None
    return list(provided) if provided else acceptance_by_position(rounds)


def expected_tokens(alphas: Sequence[float]) -> float:
    """E = 1 + sum over i of alpha_1 ... alpha_i: tokens per target forward when every round drafts len(alphas)."""
    total, survive = 1.0, 1.0
    for alpha in alphas:
        survive *= min(max(float(alpha), 0.0), 1.0)
        total += survive
    return total


# ------------------------------------------------------------------------------------------ presets

@dataclass(frozen=True)
class Hardware:
    id: str
    label: str
    bandwidth_gb_s: float
    tensor_tflops: float
    memory_gb: float
    source: str = ""

    @property
    def ridge_rows(self) -> float:
        """Rows at which a forward's arithmetic takes as long as reading its weights: F * b / (2 B)."""
        return self.tensor_tflops * 1e12 * BYTES_PER_PARAM / (2 * self.bandwidth_gb_s * 1e9)


@dataclass(frozen=True)
class Target:
    id: str
    label: str
    params_b: float
    layers: int
    hidden: int
    vocab: int

    @property
    def weight_gb(self) -> float:
        return self.params_b * BYTES_PER_PARAM


@dataclass(frozen=True)
class Draft:
    id: str
    label: str
    kind: str                 # "lookup" | "head" | "model"
    params_b: float = 0.0
    layers: int = 0

    def params(self, target: Target) -> float:
        """Parameters one draft forward reads (a count, not billions); a head's depend on its target."""
        if self.kind == "lookup":
            return 0.0
        if self.kind == "head":   # one decoder layer of the target's width, the 2h -> h projection, the LM head
            return target.params_b * 1e9 / target.layers + 2 * target.hidden ** 2 + target.hidden * target.vocab
        return self.params_b * 1e9

    def forward_cost(self, target: Target) -> float:
        """c: one draft forward in target forwards (see the module docstring)."""
        if self.kind == "lookup":
            return 0.0
        layers = 1 if self.kind == "head" else self.layers
        return max(self.params(target) / (target.params_b * 1e9), layers / target.layers)


@dataclass(frozen=True)
class CalibrationRow:
    method: str
    hardware: str
    target: str
    draft: str
    tokens_per_forward: float
    speedup: float
    verify_rows: int
    draft_forwards: int


@dataclass(frozen=True)
class Precision:
    id: str
    label: str
    bytes_per_weight: float       # weight bytes read per parameter, scales and zero points included
    source: str = ""


@dataclass(frozen=True)
class Stack:
    """A serving stack's calibrated constants (fitted, unlike the datasheet figures). forward_overhead_ms: time a
    target forward takes beyond its weight read and arithmetic (kernel launches and tails, attention, norms,
    sampling); round_overhead_ms: time a speculative round takes beyond its forwards (tree building, acceptance,
    cache bookkeeping). Each is calibrated on the published row named in `calibrated_on`."""
    id: str
    label: str
    hardware: str
    forward_overhead_ms: float
    round_overhead_ms: float = 0.0
    calibrated_on: str = ""


@dataclass(frozen=True)
class BatchRow:
    """A published speedup at a batch size, with the draft shape of its run (rows verified and draft forwards, per
    sequence; draft_rows: rows each draft forward runs per sequence, the top-k of a tree)."""
    method: str
    stack: str
    target: str
    draft: str
    precision: str
    batch: int
    tokens_per_forward: float
    verify_rows: int
    draft_forwards: int
    draft_rows: int
    speedup: float
    calibrates: str = ""          # the constant this row set ("" where the row is a prediction)


@dataclass(frozen=True)
class PrecisionRow:
    """A published plain-decoding rate (batch 1) at a weight precision."""
    system: str
    stack: str
    target: str
    precision: str
    tokens_per_second: float
    calibrates: str = ""


@dataclass(frozen=True)
class Presets:
    hardware: tuple[Hardware, ...]
    targets: tuple[Target, ...]
    drafts: tuple[Draft, ...]
    calibration: tuple[CalibrationRow, ...]
    precisions: tuple[Precision, ...] = ()
    stacks: tuple[Stack, ...] = ()
    batch_calibration: tuple[BatchRow, ...] = ()
    precision_calibration: tuple[PrecisionRow, ...] = ()

    def get(self, kind: str, id_: str):
        for item in getattr(self, kind):
            if item.id == id_:
                return item
        raise ValueError(f"unknown {kind} preset {id_!r}; known: {', '.join(x.id for x in getattr(self, kind))}")


Number = Annotated[float, Field(ge=0)]      # YAML integers pass as floats; booleans and text do not (strict)
Count = Annotated[int, Field(ge=0)]


class _Entry(BaseModel):
    """One entry of presets/whatif.yaml: known fields only, each of its type, no coercion."""
    model_config = ConfigDict(extra="forbid", strict=True)


class _HardwareEntry(_Entry):
    id: str
    label: str
    bandwidth_gb_s: Number
    tensor_tflops: Number
    memory_gb: Number
    source: str = ""


class _TargetEntry(_Entry):
    id: str
    label: str
    params_b: Number
    layers: Count
    hidden: Count
    vocab: Count


class _DraftEntry(_Entry):
    id: str
    label: str
    kind: str
    params_b: Number = 0.0
    layers: Count = 0


class _CalibrationEntry(_Entry):
    method: str
    hardware: str
    target: str
    draft: str
    tokens_per_forward: Number
    speedup: Number
    verify_rows: Count
    draft_forwards: Count


class _PrecisionEntry(_Entry):
    id: str
    label: str
    bytes_per_weight: Number
    source: str = ""


class _StackEntry(_Entry):
    id: str
    label: str
    hardware: str
    forward_overhead_ms: Number
    round_overhead_ms: Number = 0.0
    calibrated_on: str = ""


class _BatchEntry(_Entry):
    method: str
    stack: str
    target: str
    draft: str
    precision: str
    batch: Count
    tokens_per_forward: Number
    verify_rows: Count
    draft_forwards: Count
    draft_rows: Count
    speedup: Number
    calibrates: str = ""


class _PrecisionRowEntry(_Entry):
    system: str
    stack: str
    target: str
    precision: str
    tokens_per_second: Number
    calibrates: str = ""


_SECTIONS = {"hardware": (Hardware, _HardwareEntry), "targets": (Target, _TargetEntry),
             "drafts": (Draft, _DraftEntry), "calibration": (CalibrationRow, _CalibrationEntry),
             "precisions": (Precision, _PrecisionEntry), "stacks": (Stack, _StackEntry),
             "batch_calibration": (BatchRow, _BatchEntry), "precision_calibration": (PrecisionRow, _PrecisionRowEntry)}
# Which preset each field of a row names: checked on load, so a typo is named with the known ids.
_REFERENCES = {"calibration": {"hardware": "hardware", "target": "targets", "draft": "drafts"},
               "stacks": {"hardware": "hardware"},
               "batch_calibration": {"stack": "stacks", "target": "targets", "draft": "drafts",
                                     "precision": "precisions"},
               "precision_calibration": {"stack": "stacks", "target": "targets", "precision": "precisions"}}


def _validated(schema: type[_Entry], entry, where: str) -> dict:
    """`entry`'s fields checked by `schema`; the first error names the file, the entry and the field."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping")
    try:
        return schema.model_validate(entry).model_dump()
    except ValidationError as exc:
        errors = exc.errors()
    unknown = sorted(error["loc"][0] for error in errors if error["type"] == "extra_forbidden")
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}")
    name = errors[0]["loc"][0]
    if errors[0]["type"] == "missing":
        raise ValueError(f"{where}: missing field {name!r}")
    kind = "text" if schema.model_fields[name].annotation is str else "non-negative number"
    raise ValueError(f"{where}.{name}: expected a {kind}, got {entry[name]!r}")


def load_presets(path: str | Path | None = None) -> Presets:
    """presets/whatif.yaml, validated: errors name the file, the entry and the field."""
    path = Path(path) if path is not None else PRESETS_PATH
    label = path.name
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{label}: cannot read it ({exc})") from exc
    if not isinstance(data, dict) or set(data) != set(_SECTIONS):
        raise ValueError(f"{label}: the top level must be a mapping with exactly {', '.join(_SECTIONS)}")
    parsed = {section: tuple(cls(**_validated(schema, entry, f"{label}: {section}[{n}]"))
                             for n, entry in enumerate(data[section] or []))
              for section, (cls, schema) in _SECTIONS.items()}
    presets = Presets(**parsed)
    for d in presets.drafts:
        if d.kind not in ("lookup", "head", "model") or (d.kind == "model" and not (d.params_b and d.layers)):
            raise ValueError(f"{label}: draft {d.id!r}: kind must be lookup, head or model (a model needs params_b "
                             "and layers)")
    _check_references(presets, label)
    return presets


def _check_references(presets: Presets, label: str) -> None:
    """Every id a row names is a preset of its kind; the error names the file, the section and the row."""
    for section, fields in _REFERENCES.items():
        for n, row in enumerate(getattr(presets, section)):
            name = getattr(row, "method", None) or getattr(row, "id", None) or getattr(row, "system", "")
            for field_name, kind in fields.items():
                try:
                    presets.get(kind, getattr(row, field_name))
                except ValueError as exc:
                    where = "calibration" if section == "calibration" else f"{section}[{n}]"
                    raise ValueError(f"{label}: {where} {name}: {exc}") from exc


# ------------------------------------------------------------------------------------------ the cost model

@dataclass(frozen=True)
class CostModel:
    """Costs in plain decoding steps: v(rows) = verify_one + verify_per_row * (rows - 1); a draft forward costs
    draft_forward; a speculative round costs round_overhead beyond its forwards. plain_tokens_per_second: measured
    (this CPU), or a GPU class's plain rate at its batch (every sequence's tokens together)."""

    name: str
    verify_one: float
    verify_per_row: float
    draft_forward: float
    plain_tokens_per_second: float
    measured: bool
    assumptions: tuple[str, ...] = field(default=())
    round_overhead: float = 0.0

    def verify_cost(self, rows: int) -> float:
        return self.verify_one + self.verify_per_row * max(0, rows - 1)


def row_seconds(hardware: Hardware, target: Target) -> float:
    """One row's arithmetic in a target forward: 2 FLOPs a parameter at the tensor peak, in seconds."""
    return 2 * target.params_b * 1e9 / (hardware.tensor_tflops * 1e12)


def forward_seconds(hardware: Hardware, target: Target, rows: int, bytes_per_weight: float = BYTES_PER_PARAM,
                    overhead_s: float = 0.0, overlap: bool = False) -> float:
    """One target forward over `rows` rows (every sequence of the batch together), in seconds: the overhead, the
    weights read once, and the arithmetic of the rows after the first, added (module docstring). overlap=True takes
    the roofline's max of reading and arithmetic instead, kept so a test can show the batch rows rule it out."""
    weights = target.params_b * 1e9 * bytes_per_weight / (hardware.bandwidth_gb_s * 1e9)
    if overlap:
        return overhead_s + max(weights, rows * row_seconds(hardware, target))
    return overhead_s + weights + max(0, rows - 1) * row_seconds(hardware, target)


def draft_seconds(hardware: Hardware, target: Target, draft: Draft, batch: int, draft_rows: int,
                   bytes_per_weight: float, overhead_s: float) -> float:
    """One draft forward over `draft_rows` rows for each of `batch` sequences, in seconds: c one-row target
    forwards (its weights' share, or its layers' share when launch bound), plus its own arithmetic for the rest."""
    if draft.kind == "lookup":
        return 0.0
    one_row = draft.forward_cost(target) * forward_seconds(hardware, target, 1, bytes_per_weight, overhead_s)
    share = draft.params(target) / (target.params_b * 1e9)
    return one_row + max(0, batch * draft_rows - 1) * row_seconds(hardware, target) * share


def _gpu_notes(hardware: Hardware, target: Target, draft: Draft, batch: int, bytes_per_weight: float,
               stack: Stack | None, c: float) -> list[str]:
    weight_gb = target.params_b * bytes_per_weight
    weights_ms = weight_gb / hardware.bandwidth_gb_s * 1e3
    notes = [
        f"batch {batch}, {bytes_per_weight:g} byte{'' if bytes_per_weight == 1 else 's'} a weight ({weight_gb:.0f} "
        "GB): a forward reads every weight once "
        f"for all {batch} sequence{'s' if batch > 1 else ''}, then computes every row",
        f"each row beyond the first (all sequences' rows together) adds {row_seconds(hardware, target) * 1e3:.4f} "
        f"ms of arithmetic at {hardware.tensor_tflops:g} TFLOP/s to {weights_ms:.2f} ms of weights at "
        f"{hardware.bandwidth_gb_s:g} GB/s (added, no overlap)",
        f"a draft forward costs {c:.3f} of a plain step ({draft.label})",
    ]
    if stack is None:
        notes += ["plain tokens/s is the bandwidth ceiling; real runs reach part of it (the speedup does not depend "
                  "on which)", "prefill, sampling and Python overhead per round are left out"]
    else:
        notes += [f"{stack.label}: {stack.forward_overhead_ms:g} ms a forward and {stack.round_overhead_ms:g} ms a "
                  f"speculative round beyond the model's terms, calibrated on {stack.calibrated_on}",
                  "prefill is left out"]
    if batch > 1:
        notes.append("KV-cache reads (every sequence's context) are left out: plain and speculative forwards both "
                     "pay them")
    if weight_gb > hardware.memory_gb:
        notes.insert(0, f"{weight_gb:.0f} GB of weights do not fit one {hardware.memory_gb:g} GB card: several "
                        "cards in tensor parallel, whose communication is not modelled")
    return notes


def gpu_cost(hardware: Hardware, target: Target, draft: Draft, batch: int = 1,
             bytes_per_weight: float = BYTES_PER_PARAM, stack: Stack | None = None, draft_rows: int = 1) -> CostModel:
    """The GPU cost model of the module docstring at a batch size and a weight precision, in plain steps at that
    batch: datasheet and config figures, plus a serving stack's calibrated overheads when one is given."""
    if batch < 1 or draft_rows < 1 or bytes_per_weight <= 0:
        raise ValueError(f"need batch >= 1, draft_rows >= 1 and bytes_per_weight > 0, got {batch}, {draft_rows}, "
                         f"{bytes_per_weight}")
    overhead = stack.forward_overhead_ms / 1e3 if stack else 0.0
    step = forward_seconds(hardware, target, batch, bytes_per_weight, overhead)           # s, one plain step
    draft_s = draft_seconds(hardware, target, draft, batch, draft_rows, bytes_per_weight, overhead)
    round_s = stack.round_overhead_ms / 1e3 if stack else 0.0
    notes = _gpu_notes(hardware, target, draft, batch, bytes_per_weight, stack, draft_s / step)
    return CostModel(name=f"{hardware.label}, {target.label}", verify_one=1.0,
                     verify_per_row=batch * row_seconds(hardware, target) / step, draft_forward=draft_s / step,
                     plain_tokens_per_second=batch / step, measured=False, assumptions=tuple(notes),
                     round_overhead=round_s / step)


def measured_cost(rounds, plain_step_seconds: Sequence[float], label: str = "this CPU") -> CostModel | None:
    """This machine's costs from a run's (timed) rounds and its plain run's step times, in plain steps: the verify
    cost fitted against rows (least squares; flat when every round verified the same rows), the draft cost per
    drafted token. None without rounds or plain steps."""
    rounds = list(rounds)
    steps = [float(s) for s in plain_step_seconds if s > 0]
    if not rounds or not steps:
        return None
    step = sum(steps) / len(steps)
    rows = [len(r.drafted) + 1 for r in rounds]
    costs = [r.verify_seconds / step for r in rounds]
    mean_rows, mean_cost = sum(rows) / len(rows), sum(costs) / len(costs)
    spread = sum((x - mean_rows) ** 2 for x in rows)
    slope = max(0.0, sum((x - mean_rows) * (y - mean_cost) for x, y in zip(rows, costs)) / spread) if spread else 0.0
    one = max(0.0, mean_cost - slope * (mean_rows - 1))
    drafted = sum(draft_length(r) for r in rounds)
    draft = sum(r.draft_seconds for r in rounds) / step / drafted if drafted else 0.0
    fitted = (f"verify cost fitted over {len(rounds)} rounds of {min(rows)}-{max(rows)} rows" if spread else
              f"every round verified {rows[0]} rows: other row counts are given the same verify cost (not measured)")
    return CostModel(name=label, verify_one=one, verify_per_row=slope, draft_forward=draft,
                     plain_tokens_per_second=1.0 / step, measured=True,
                     assumptions=("measured on this machine, from this run's rounds, in its plain decoding step "
                                  f"({step * 1000:.1f} ms)", fitted,
                                  "draft cost per drafted token (a tree: per level); every round drafts all k"))


@dataclass(frozen=True)
class Projection:
    tokens_per_forward: float     # E
    verify_rows: int
    draft_forwards: int
    verify_cost: float            # v(rows), plain steps
    draft_cost: float             # c * draft_forwards, plain steps
    speedup: float
    plain_tokens_per_second: float
    tokens_per_second: float
    cost: CostModel
    overhead_cost: float = 0.0    # the round's own overhead, plain steps

    @property
    def round_cost(self) -> float:
        return self.verify_cost + self.draft_cost + self.overhead_cost

    def formula(self) -> str:
        if self.overhead_cost:
            return (f"speedup = E / (v(rows) + c · forwards + round overhead) = {self.tokens_per_forward:.2f} / "
                    f"({self.verify_cost:.3f} + {self.draft_cost:.3f} + {self.overhead_cost:.3f}) = "
                    f"{self.speedup:.2f}x")
        return (f"speedup = E / (v(rows) + c · forwards) = {self.tokens_per_forward:.2f} / ({self.verify_cost:.3f} + "
                f"{self.draft_cost:.3f}) = {self.speedup:.2f}x")


def project(tokens_per_forward: float, cost: CostModel, verify_rows: int, draft_forwards: int) -> Projection:
    """The projection for a round that verifies `verify_rows` rows after `draft_forwards` draft forwards and emits
    `tokens_per_forward` tokens on average."""
    if verify_rows < 1 or draft_forwards < 0 or tokens_per_forward < 1:
        raise ValueError(f"need verify_rows >= 1, draft_forwards >= 0 and tokens_per_forward >= 1, got "
                         f"{verify_rows}, {draft_forwards}, {tokens_per_forward}")
    verify = cost.verify_cost(verify_rows)
    draft = cost.draft_forward * draft_forwards
    total = verify + draft + cost.round_overhead
    speedup = tokens_per_forward / total if total > 0 else 0.0
    return Projection(tokens_per_forward=tokens_per_forward, verify_rows=verify_rows, draft_forwards=draft_forwards,
                      verify_cost=verify, draft_cost=draft, speedup=speedup,
                      plain_tokens_per_second=cost.plain_tokens_per_second,
                      tokens_per_second=cost.plain_tokens_per_second * speedup, cost=cost,
                      overhead_cost=cost.round_overhead)


def project_alphas(alphas: Sequence[float], cost: CostModel, draft: Draft | None = None,
                   tree_nodes: int = 0) -> Projection:
    """A chain of k = len(alphas) drafts (rows k + 1; k draft forwards, none for lookup), or a tree of `tree_nodes`
    nodes whose depth is k (rows tree_nodes + 1; one draft forward a level)."""
    k = len(alphas)
    if not 1 <= k <= MAX_POSITIONS:
        raise ValueError(f"acceptance by position needs 1 to {MAX_POSITIONS} positions, got {k}")
    if tree_nodes and tree_nodes < k:
        raise ValueError(f"a tree {k} deep has at least {k} nodes, got {tree_nodes}")
    rows = (tree_nodes or k) + 1
    forwards = 0 if draft is not None and draft.kind == "lookup" else k
    return project(expected_tokens(alphas), cost, rows, forwards)


def calibration(presets: Presets | None = None) -> list[tuple[CalibrationRow, Projection]]:
    """Each published row's projection from its own reported tokens per forward and its method's draft shape."""
    presets = presets or load_presets()
    out = []
    for row in presets.calibration:
        draft = presets.get("drafts", row.draft)
        cost = gpu_cost(presets.get("hardware", row.hardware), presets.get("targets", row.target), draft)
        out.append((row, project(row.tokens_per_forward, cost, row.verify_rows, row.draft_forwards)))
    return out


# ------------------------------------------------------------------------------------------ batch and precision rows

def stack_cost(presets: Presets, stack_id: str, target_id: str, draft_id: str, batch: int = 1,
               precision_id: str = "bf16", draft_rows: int = 1) -> CostModel:
    """gpu_cost on a serving stack's own card, with its calibrated overheads."""
    stack = presets.get("stacks", stack_id)
    return gpu_cost(presets.get("hardware", stack.hardware), presets.get("targets", target_id),
                    presets.get("drafts", draft_id), batch, presets.get("precisions", precision_id).bytes_per_weight,
                    stack, draft_rows)


def batch_projection(row: BatchRow, presets: Presets) -> Projection:
    """A published batch row's projection from its tokens per forward and its run's draft shape."""
    cost = stack_cost(presets, row.stack, row.target, row.draft, row.batch, row.precision, row.draft_rows)
    return project(row.tokens_per_forward, cost, row.verify_rows, row.draft_forwards)


def batch_calibration(presets: Presets | None = None) -> list[tuple[BatchRow, Projection]]:
    presets = presets or load_presets()
    return [(row, batch_projection(row, presets)) for row in presets.batch_calibration]


def plain_rate(row: PrecisionRow, presets: Presets) -> float:
    """Projected plain decoding tokens/s at batch 1 for a precision row: 1 / t(1) on its stack's card."""
    return stack_cost(presets, row.stack, row.target, "lookup", 1, row.precision).plain_tokens_per_second


def precision_calibration(presets: Presets | None = None) -> list[tuple[PrecisionRow, float]]:
    presets = presets or load_presets()
    return [(row, plain_rate(row, presets)) for row in presets.precision_calibration]


def forward_overhead_ms(row: PrecisionRow, presets: Presets) -> float:
    """The forward overhead that makes plain decoding run at `row`'s published rate: 1 / rate less the weight read
    (batch 1: the one row's arithmetic hides under it). How each stack's forward_overhead_ms was calibrated."""
    stack = presets.get("stacks", row.stack)
    weights = forward_seconds(presets.get("hardware", stack.hardware), presets.get("targets", row.target), 1,
                              presets.get("precisions", row.precision).bytes_per_weight)
    return (1 / row.tokens_per_second - weights) * 1e3


def round_overhead_ms(row: BatchRow, presets: Presets) -> float:
    """The round overhead that makes `row`'s projection equal its published speedup, with its stack's forward
    overhead: E / speedup plain steps a round, less its verify and draft forwards. How round_overhead_ms was
    calibrated."""
    p = batch_projection(row, presets)
    step_ms = row.batch / p.plain_tokens_per_second * 1e3
    return (row.tokens_per_forward / row.speedup - p.verify_cost - p.draft_cost) * step_ms


def tokens_per_forward_for(row: BatchRow, presets: Presets) -> float:
    """The tokens per forward that makes `row`'s projection equal its published speedup: speedup x round cost. How
    a row with no published acceptance length got its tokens_per_forward."""
    return row.speedup * batch_projection(row, presets).round_cost
