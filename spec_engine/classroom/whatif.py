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

This CPU: v_1, s and c come from the run's own rounds, in units of its own plain decoding step (`measured_cost`).

No constant here is fitted: the presets (presets/whatif.yaml) are datasheet figures and model configs; the
calibration rows there (Spec-Bench's RTX 3090 leaderboard) only check the model (tests/test_whatif.py).
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

    def forward_cost(self, target: Target) -> float:
        """c: one draft forward in target forwards (see the module docstring)."""
        if self.kind == "lookup":
            return 0.0
        if self.kind == "head":   # one decoder layer of the target's width, the 2h -> h projection, the LM head
            params = target.params_b * 1e9 / target.layers + 2 * target.hidden ** 2 + target.hidden * target.vocab
            return max(params / (target.params_b * 1e9), 1 / target.layers)
        return max(self.params_b / target.params_b, self.layers / target.layers)


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
class Presets:
    hardware: tuple[Hardware, ...]
    targets: tuple[Target, ...]
    drafts: tuple[Draft, ...]
    calibration: tuple[CalibrationRow, ...]

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


_SECTIONS = {"hardware": (Hardware, _HardwareEntry), "targets": (Target, _TargetEntry),
             "drafts": (Draft, _DraftEntry), "calibration": (CalibrationRow, _CalibrationEntry)}


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
    for row in presets.calibration:
        for kind, id_ in (("hardware", row.hardware), ("targets", row.target), ("drafts", row.draft)):
            try:
                presets.get(kind, id_)
            except ValueError as exc:
                raise ValueError(f"{label}: calibration {row.method}: {exc}") from exc
    return presets


# ------------------------------------------------------------------------------------------ the cost model

@dataclass(frozen=True)
class CostModel:
    """Costs in plain decoding steps: v(rows) = verify_one + verify_per_row * (rows - 1); a draft forward costs
    draft_forward. plain_tokens_per_second: measured (this CPU) or the bandwidth ceiling (a GPU class)."""

    name: str
    verify_one: float
    verify_per_row: float
    draft_forward: float
    plain_tokens_per_second: float
    measured: bool
    assumptions: tuple[str, ...] = field(default=())

    def verify_cost(self, rows: int) -> float:
        return self.verify_one + self.verify_per_row * max(0, rows - 1)


def gpu_cost(hardware: Hardware, target: Target, draft: Draft) -> CostModel:
    """The GPU cost model of the module docstring, from datasheet and config figures only."""
    ridge = hardware.ridge_rows
    notes = [
        f"batch 1, fp16 weights ({target.weight_gb:.0f} GB), memory-bound decode: a forward reads every weight once",
        f"each verify row beyond the first adds 1/{ridge:.0f} of a step (arithmetic at {hardware.tensor_tflops:g} "
        f"TFLOP/s against weights at {hardware.bandwidth_gb_s:g} GB/s, no overlap)",
        f"a draft forward costs {draft.forward_cost(target):.3f} of a target forward ({draft.label})",
        "plain tokens/s is the bandwidth ceiling; real runs reach part of it (the speedup does not depend on which)",
        "prefill, sampling and Python overhead per round are left out",
    ]
    if target.weight_gb > hardware.memory_gb:
        notes.insert(0, f"{target.weight_gb:.0f} GB of weights do not fit one {hardware.memory_gb:g} GB card: several "
                        "cards in tensor parallel, whose communication is not modelled")
    return CostModel(name=f"{hardware.label}, {target.label}", verify_one=1.0, verify_per_row=1.0 / ridge,
                     draft_forward=draft.forward_cost(target),
                     plain_tokens_per_second=hardware.bandwidth_gb_s / target.weight_gb, measured=False,
                     assumptions=tuple(notes))


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

    @property
    def round_cost(self) -> float:
        return self.verify_cost + self.draft_cost

    def formula(self) -> str:
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
    speedup = tokens_per_forward / (verify + draft) if verify + draft > 0 else 0.0
    return Projection(tokens_per_forward=tokens_per_forward, verify_rows=verify_rows, draft_forwards=draft_forwards,
                      verify_cost=verify, draft_cost=draft, speedup=speedup,
                      plain_tokens_per_second=cost.plain_tokens_per_second,
                      tokens_per_second=cost.plain_tokens_per_second * speedup, cost=cost)


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
