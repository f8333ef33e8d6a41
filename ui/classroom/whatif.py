"""The "What if: a GPU" tab: the latest run's acceptance by position (or sliders, with no model at all) projected
onto a GPU class, a target size, a batch size and a weight precision, or onto this CPU's measured costs. The math is
spec_engine.classroom.whatif; this module only reads the controls and renders its numbers.
"""
from __future__ import annotations

import gradio as gr
import pandas as pd

from spec_engine.classroom import whatif

from ui.playground.state import SessionState
from ui.views.render import esc

POSITIONS = 8                 # alpha sliders shown (a run deeper than this is cut to its first 8 positions)
CPU = "cpu"
PRIVATE = {"api_visibility": "private"}
DEFAULT_ALPHAS = (0.8, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4)
COMPARE_COLUMNS = ["where", "verify v(rows)", "draft c·forwards", "speedup", "tokens/s", "plain tokens/s"]
CPU_ROW = "this CPU (projected from measured costs)"
MAX_BATCH = 256               # sequences sharing one weight read
BYTES_RANGE = (0.25, 4.0)     # bytes per weight: below 2-bit, above fp32, refused by name
NO_STACK = "none"

CAPTION = """**Beyond the anchors: what would this be on a GPU?** Every speed figure elsewhere in this app is measured
on this CPU with a 135M target, where verifying k rows costs more than one plain step. On a GPU with a 7-70B target,
decoding is bound by reading the weights, so verifying a few rows costs about one step, and speculative decoding
gives 2-3x. Set the acceptance at each draft position (or take the latest run's) and a GPU class: the panel
**projects** tokens per second and the speedup from a cost model (not a measurement: its assumptions are listed
under the result; `docs/whatif.md` in the repository explains it). No model is needed.
**Batch size** shares one weight read across users and **bytes per weight** (quantization) shrinks it; both leave
speculation less to gain: its extra rows add arithmetic, which weighs more against a shared or a shorter read."""


def presets() -> whatif.Presets:
    return whatif.load_presets()


def hardware_choices() -> list[tuple[str, str]]:
    return [("This CPU (projected from costs measured in the latest run)", CPU)] + \
        [(h.label, h.id) for h in presets().hardware]


def stack_choices() -> list[tuple[str, str]]:
    return [("none: the datasheet ceiling", NO_STACK)] + \
        [(f"{s.label}'s overheads (calibrated)", s.id) for s in presets().stacks]


def latest_record(state: SessionState | None):
    """The newest finished run with rounds, or None."""
    if state is None or not state.history:
        return None
    return state.history[-1]


def cpu_cost(state: SessionState | None):
    """This CPU's cost model from the latest run (its timed rounds and its plain run), or None."""
    record = latest_record(state)
    if record is None or record.timing is None:
        return None
    baseline = state.baseline_for(record)
    if baseline is None:
        return None
    return whatif.measured_cost(record.timing.rounds, baseline.step_seconds)


def read_scale(batch, bytes_per_weight) -> tuple[int, float]:
    """The batch size and bytes per weight from their boxes; a ValueError names the field that is out of range."""
    try:
        batch_value = float(batch)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"batch size must be a whole number from 1 to {MAX_BATCH}, got {batch!r}") from None
    if not (1 <= batch_value <= MAX_BATCH and batch_value == int(batch_value)):
        raise ValueError(f"batch size must be a whole number from 1 to {MAX_BATCH}, got {batch_value:g}")
    low, high = BYTES_RANGE
    try:
        bytes_value = float(bytes_per_weight)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"bytes per weight must be a number from {low:g} to {high:g}, got {bytes_per_weight!r}") \
            from None
    if not low <= bytes_value <= high:          # NaN fails this too
        raise ValueError(f"bytes per weight must be a number from {low:g} to {high:g}, got {bytes_value:g}")
    return int(batch_value), bytes_value


def projection(alphas, hardware: str, target: str, draft: str, tree_nodes: int, state: SessionState | None,
               batch: int = 1, bytes_per_weight: float = 2.0, stack: str = NO_STACK):
    """(Projection, None) or (None, why not). Batch, bytes per weight and a stack's overheads apply to GPU classes;
    this CPU's costs are its run's own (batch 1, the run's weights)."""
    data = presets()
    draft_preset = data.get("drafts", draft)
    if hardware == CPU:
        cost = cpu_cost(state)
        if cost is None:
            return None, ("This CPU's costs come from a run with its speedup measured: press **Run** (with "
                          "\"Measure the speedup after each run\" ticked) first, or pick a GPU class.")
        draft_preset = None          # measured: the draft cost per drafted token is this run's own
    else:
        stack_preset = None if stack in (NO_STACK, "", None) else data.get("stacks", stack)
        cost = whatif.gpu_cost(data.get("hardware", hardware), data.get("targets", target), draft_preset, batch,
                               bytes_per_weight, stack_preset)
    return whatif.project_alphas(alphas, cost, draft_preset, tree_nodes), None


def rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:,.1f}" if tokens_per_second < 100 else f"{tokens_per_second:,.0f}"


def result_markdown(p: whatif.Projection, alphas, source_note: str) -> str:
    alphas_text = ", ".join(f"{a:.2f}" for a in alphas)
    kind = ("a projection from costs measured on this machine (its batch of 1, its run's weights), not a "
            "measurement of this acceptance" if p.cost.measured else
            "a projection from a cost model, not a measurement")
    lines = [
        f"### {p.speedup:.2f}x · {rate(p.tokens_per_second)} tokens/s (plain {rate(p.plain_tokens_per_second)})",
        f"*{p.cost.name}: {kind}.* {source_note}",
        "",
        f"- acceptance by position α = [{alphas_text}] → E = 1 + α₁ + α₁α₂ + … = **{p.tokens_per_forward:.2f}** "
        "tokens per target forward",
        f"- one round verifies {p.verify_rows} rows: v = {p.cost.verify_one:.3f} + {p.cost.verify_per_row:.4f} × "
        f"({p.verify_rows} − 1) = **{p.verify_cost:.3f}** plain steps; drafting: {p.draft_forwards} forwards × "
        f"{p.cost.draft_forward:.3f} = **{p.draft_cost:.3f}**",
        f"- `{p.formula()}`; tokens/s = plain × speedup" + (" (every sequence of the batch together)"
                                                            if not p.cost.measured else ""),
        "",
        "**Assumptions:** " + "; ".join(p.cost.assumptions) + ".",
    ]
    return "\n".join(lines)


def comparison(alphas, target: str, draft: str, tree_nodes: int, state: SessionState | None, batch: int = 1,
               bytes_per_weight: float = 2.0, stack: str = NO_STACK) -> pd.DataFrame:
    """The same acceptance on every hardware choice: where the speedup comes from is the cost of a round."""
    rows = []
    for _, hw in hardware_choices():
        p, _ = projection(alphas, hw, target, draft, tree_nodes, state, batch, bytes_per_weight, stack)
        if p is None:
            continue
        where = CPU_ROW if hw == CPU else presets().get("hardware", hw).label
        rows.append([where, round(p.verify_cost, 3), round(p.draft_cost, 3), f"{p.speedup:.2f}x",
                     rate(p.tokens_per_second), rate(p.plain_tokens_per_second)])
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def calibration_markdown() -> str:
    lines = ["**Calibration** (Spec-Bench leaderboard, one RTX 3090, Vicuna-7B, greedy, fp16): each method's "
             "reported tokens per forward through the cost model above, with that method's own draft shape.",
             "", "| method | tokens / forward | rows verified | draft forwards | reported | projected | off by |",
             "|---|---|---|---|---|---|---|"]
    for row, p in whatif.calibration(presets()):
        lines.append(f"| {row.method} | {row.tokens_per_forward:.2f} | {row.verify_rows} | {row.draft_forwards} | "
                     f"{row.speedup:.2f}x | {p.speedup:.2f}x | {100 * (p.speedup / row.speedup - 1):+.0f}% |")
    return "\n".join(lines + ["", batch_calibration_markdown(), "", precision_calibration_markdown()])


def off_by(projected: float, reported: float) -> str:
    """Signed whole percent, "+0%" for a row matched to rounding (never "-0%")."""
    return f"{round(100 * (projected / reported - 1)):+d}%"


def role(calibrates: str) -> str:
    return f"calibrated: sets {calibrates}" if calibrates else "predicted"


def batch_calibration_markdown() -> str:
    lines = ["**Batch size** (EAGLE-3 on SGLang, one H100, Llama-3.1-8B, MT-bench): the published speedup at each "
             "batch, projected from its draft shape on SGLang's calibrated overheads. A row that set a constant "
             "matches by construction; the others are predictions.",
             "", "| method | batch | tokens / forward | rows verified | reported | projected | off by | role |",
             "|---|---|---|---|---|---|---|---|"]
    for row, p in whatif.batch_calibration(presets()):
        lines.append(f"| {row.method} | {row.batch} | {row.tokens_per_forward:.2f} | {row.verify_rows} | "
                     f"{row.speedup:.2f}x | {p.speedup:.2f}x | {off_by(p.speedup, row.speedup)} | "
                     f"{role(row.calibrates)} |")
    return "\n".join(lines)


def precision_calibration_markdown() -> str:
    data = presets()
    lines = ["**Bytes per weight** (plain decoding at batch 1): fewer bytes a weight, a shorter weight read.", "",
             "| system | target | weights | bytes / weight | reported tok/s | projected | off by | role |",
             "|---|---|---|---|---|---|---|---|"]
    for row, rate_ in whatif.precision_calibration(data):
        precision = data.get("precisions", row.precision)
        lines.append(f"| {row.system} | {data.get('targets', row.target).label} | {precision.label} | "
                     f"{precision.bytes_per_weight:g} | {row.tokens_per_second:g} | {rate_:.1f} | "
                     f"{off_by(rate_, row.tokens_per_second)} | {role(row.calibrates)} |")
    return "\n".join(lines)


def update(k, hardware, target, draft, tree_nodes, *rest):
    """Every control's change: the projection for the sliders' first k positions. Pure arithmetic, no model.
    rest: the POSITIONS α sliders, the session state, then batch size, bytes per weight and the stack (optional:
    batch 1, bf16's 2 bytes and no stack overheads when left out)."""
    alphas, state, scale = rest[:POSITIONS], rest[POSITIONS], list(rest[POSITIONS + 1:])
    batch, bytes_per_weight, stack = scale + [1, 2.0, NO_STACK][len(scale):]
    try:        # a raw call can send anything: clamp to the controls' ranges, refuse what is not a number by name
        k = min(max(int(k), 1), POSITIONS)
        alphas = [min(max(float(a), 0.0), 1.0) for a in alphas[:k]]
        tree_nodes = min(max(int(tree_nodes or 0), 0), 64)
    except (TypeError, ValueError, OverflowError):
        return "k, the tree's nodes and every α must be numbers.", None
    if tree_nodes and tree_nodes < k:
        tree_nodes = k
    try:
        batch, bytes_per_weight = read_scale(batch, bytes_per_weight)      # out of range: refused by name
        p, why = projection(alphas, hardware, target, draft, tree_nodes, state, batch, bytes_per_weight, stack)
    except ValueError as exc:                                   # an unknown preset id: the message names it
        return esc(str(exc)), None
    shape = f"a tree of {tree_nodes} nodes, {k} deep" if tree_nodes else f"a chain of k = {k} drafts, every round"
    if p is not None and p.cost.measured and (batch, bytes_per_weight, stack) != (1, 2.0, NO_STACK):
        shape += " Batch size, bytes per weight and a stack's overheads apply to the GPU classes only."
    text = why if p is None else result_markdown(p, alphas, f"Draft shape: {shape}.")
    return text, comparison(alphas, target, draft, tree_nodes, state, batch, bytes_per_weight, stack)


def draft_of_run(draft_name: str) -> str | None:
    name = draft_name.lower()
    if "eagle" in name:
        return "eagle-head"
    if "lookup" in name:
        return "lookup"
    return None


def from_run(state: SessionState | None):
    """"Use the latest run": its k, acceptance by position and draft kind into the controls."""
    record = latest_record(state)
    if record is None:
        gr.Info("No finished run yet: press Run first (or set the sliders by hand).")
        return (gr.skip(),) * (3 + POSITIONS) + ("No finished run in this session yet.",)
    alphas = whatif.run_acceptance_by_position(None, record.rounds)[:POSITIONS] or [0.0]
    trees = [len(r.drafted) for r in record.rounds if r.is_tree]
    nodes = round(sum(trees) / len(trees)) if trees else 0
    draft = draft_of_run(record.settings.draft)
    sliders = [gr.update(value=round(a, 3)) for a in alphas] + [gr.skip()] * (POSITIONS - len(alphas))
    n = len(record.rounds)
    measured = sum(len(r.emitted) for r in record.rounds) / n
    offered = sum(whatif.draft_length(r) for r in record.rounds) / n
    note = (f"Run {record.run_id} ({esc(record.draft_label)}, k = {record.settings.k}): acceptance by position "
            f"over {n} rounds; it measured {measured:.2f} tokens per forward with {offered:.1f} drafts a round on "
            f"average, where the projection drafts all {len(alphas)} positions every round. Positions no round "
            "reached are left at their values.")
    return (len(alphas), gr.skip() if draft is None else draft, max(nodes, len(alphas)) if nodes else 0,
            *sliders, note)


def build_tab(state) -> None:
    """The tab (call inside a gr.Tabs)."""
    data = presets()
    with gr.Tab("What if: a GPU", elem_id="whatif-tab"):
        gr.Markdown(CAPTION)
        with gr.Row():
            with gr.Column(scale=2):
                with gr.Row():
                    hardware = gr.Dropdown(hardware_choices(), value="rtx-3090", label="Hardware",
                                           elem_id="whatif-hardware", min_width=220)
                    target = gr.Dropdown([(t.label, t.id) for t in data.targets], value="vicuna-7b",
                                         label="Target model (GPU classes)", elem_id="whatif-target", min_width=220)
                    draft = gr.Dropdown([(d.label, d.id) for d in data.drafts], value="eagle-head",
                                        label="Draft (its cost on a GPU)", elem_id="whatif-draft", min_width=220)
                with gr.Row():
                    batch = gr.Number(1, label=f"Batch size (1-{MAX_BATCH} sequences per weight read)",
                                      elem_id="whatif-batch", min_width=160)
                    bytes_per_weight = gr.Number(2.0, label="Bytes per weight", elem_id="whatif-bytes",
                                                 info="bf16 2 · int8 1 · int4 0.5 + scales (0.625 at groups of 32)",
                                                 min_width=160)
                    stack = gr.Dropdown(stack_choices(), value=NO_STACK, label="Serving overheads",
                                        elem_id="whatif-stack", min_width=220)
                with gr.Row():
                    k = gr.Slider(1, POSITIONS, value=4, step=1, label="k: draft positions", elem_id="whatif-k")
                    tree = gr.Slider(0, 64, value=0, step=1, label="Tree nodes (0 = a chain)",
                                     info="a tree k deep verifies its nodes + 1 rows", elem_id="whatif-tree")
                use_run = gr.Button("Use the latest run's acceptance by position", size="sm",
                                    elem_id="whatif-from-run")
                run_note = gr.Markdown("", elem_id="whatif-run-note")
            with gr.Column(scale=3):
                alphas = []
                for row in range(0, POSITIONS, 4):
                    with gr.Row():
                        for i in range(row, row + 4):
                            alphas.append(gr.Slider(0, 1, value=DEFAULT_ALPHAS[i], step=0.01,
                                                    label=f"α{i + 1}: accepted at position {i + 1}",
                                                    elem_id=f"whatif-alpha-{i + 1}"))
        first, first_table = update(4, "rtx-3090", "vicuna-7b", "eagle-head", 0, *DEFAULT_ALPHAS, None)
        result = gr.Markdown(first, elem_id="whatif-result")
        table = gr.Dataframe(first_table, headers=COMPARE_COLUMNS, interactive=False, elem_id="whatif-compare",
                             label="The same acceptance everywhere (this CPU once a run has measured it)")
        gr.Markdown(calibration_markdown(), elem_id="whatif-calibration")
    inputs = [k, hardware, target, draft, tree, *alphas, state, batch, bytes_per_weight, stack]
    for control in (k, hardware, target, draft, tree, *alphas, batch, bytes_per_weight, stack):
        control.change(update, inputs, [result, table], concurrency_limit=None, show_progress="hidden", **PRIVATE)
    use_run.click(from_run, [state], [k, draft, tree, *alphas, run_note], concurrency_limit=None, **PRIVATE)
