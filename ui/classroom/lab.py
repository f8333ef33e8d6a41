"""The "Exactness lab" tab: N short continuations of one prompt, drawn with plain sampling and with speculative
sampling under every verification rule side by side (the exact ones, exact and strict; then typical, lossy, and the
deliberate mistakes), against the target's exact distribution.

All probabilities, distances and tests come from `spec_engine.classroom.lab`; this module validates the inputs, picks
the models (the toy pair of `spec_engine.classroom.toy` by default, or the main panel's target and draft), streams
progress, and hands the results to `lab_plots`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Callable

import gradio as gr
import pandas as pd
import torch

import spec_engine as se
from spec_engine.classroom import lab, toy

from ui.playground import compute as gpu_calls
from ui.playground import coalesce, handlers, limits, runner, validate
from ui.views import lab_plots
from ui.playground import registry as reg
from ui.playground import drafts
from ui.views.render import esc, show_text

# The defaults are a lesson that fits a class: N = 1000 with k = 4 took 81 s on two cores (every draw prefills
# both toy models and drafts k tokens for a 2-token continuation); N = 500 with k = 2 is about four times cheaper
# and still shows both wrong rules far beyond the exact rule's sampling noise.
MIN_N, MAX_N, DEFAULT_N, DEFAULT_K = 50, 5000, 500, 2
UPDATE_INTERVAL = 1.0            # seconds between streamed partial histograms
MODEL_CHOICES = [("Toy pair (fast): 10-word vocabulary", "toy"),
                 ("Main panel's target + draft (slower; real vocabulary)", "current")]
MODEL_VALUES = tuple(value for _, value in MODEL_CHOICES)
LEVEL_CHOICES = [("next token", "next"), ("whole continuation (depth tokens)", "whole")]
LEVEL_VALUES = tuple(value for _, value in LEVEL_CHOICES)
EXACT_SIDE = ["plain"] + [name for name in se.RULES if se.RULE_INFO[name].exact]        # plain, exact, strict
EXACT_TREE_SIDE = ["plain"] + [name for name in se.TREE_RULES if se.RULE_INFO[name].exact]        # plain, exact, strict
WRONG_SIDE = list(se.WRONG_RULES)                                   # typical, q_mismatch, topp_membership, no_residual
WRONG_TREE_SIDE = [name for name in se.TREE_RULES if not se.RULE_INFO[name].exact]     # typical, best sibling
SHAPE_CHOICES = [("chain: k drafts in a row", "chain"),
                 ("tree: the draft's top 2 tokens at every node, k nodes", "tree")]
SHAPE_VALUES = tuple(value for _, value in SHAPE_CHOICES)
TREE_WIDTH = 2
OUTPUTS = ("status", "exact_plot", "wrong_plot", "table", "run")

CAPTION = """**Why is speculative decoding lossless?** Draw *N* short continuations of the same prompt with plain
target sampling and with speculative sampling, and compare the counts with the target's exact distribution,
enumerated from the model. Every verification rule runs side by side. The exact rule and *strict* (vLLM's and
llama.cpp's: keep a draft only when the target's own draw equals it) leave only sampling noise (small
total-variation distance, the chi-square test does not reject), but strict keeps fewer drafts of a sampled draft.
Medusa's *typical* acceptance keeps more and drifts; so do the mistakes: *q before warping* (a bug transformers
shipped, nearly invisible at temperature 1: lower it to 0.7 to see it), *top-p membership* and *no residual*. With
a **tree**
draft the exact rule tries siblings in turn against the residual each refusal leaves; the wrong *best sibling* rule
judges every sibling against p itself, so extra siblings become extra free chances and the text drifts."""


@dataclass(frozen=True)
class LabSettings:
    n: int
    depth: int
    k: int
    sampling: se.SamplingParams
    seed: int
    wrong_rules: bool
    tree: bool = False          # draft trees (the tree rule; the wrong one is "tree_best_sibling")


def wrong_side(tree: bool) -> list[str]:
    """The rules that are not exact a lab run draws with: the chain's, or the tree's."""
    return WRONG_TREE_SIDE if tree else WRONG_SIDE


def exact_side(tree: bool) -> list[str]:
    """Plain sampling and the exact rules a lab run draws with: the chain's (exact, strict), or the tree's."""
    return EXACT_TREE_SIDE if tree else EXACT_SIDE


def samplers_of(settings: "LabSettings") -> list[str]:
    return exact_side(settings.tree) + (wrong_side(settings.tree) if settings.wrong_rules else [])


@dataclass
class LabSetup:
    """What the draws need: the target, a drafter factory, the prompt ids and how to label outcomes."""

    target_model: object
    make_drafter: Callable[[], se.Drafter]
    input_ids: object                    # LongTensor [1, T]
    label: Callable[[tuple], str]
    model_note: str
    prompt_note: str
    threads: int | None = None           # torch intra-op threads while drawing (None: as the process has them)


@contextmanager
def intra_op_threads(n: int | None):
    """torch's intra-op thread count set to `n` for the block, then restored. The toy pair's tensors are so small
    that a second thread only adds a barrier per op: on two shared cores one draw took 10x longer with two threads
    (plain 105 vs 10 ms, exact 216 vs 31 ms). The setting is process-wide: a run decoding at the same time (the
    server allows it only with --concurrency > 1) uses one thread until the draws end."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class LabRun:
    """One run of the lab, kept in the tab's gr.State so the histogram level can change without new draws.
    It holds results and labels only, never a model (a finished run keeps no model alive)."""

    label: Callable[[tuple], str]
    model_note: str
    prompt_note: str
    settings: LabSettings
    exact: dict
    draws: list
    seconds_exact: float


def max_n() -> int:
    """The largest N here: MAX_N, or less where the host's limits say so (ui.playground.limits)."""
    return min(MAX_N, limits.current().lab_max_n)


def compute() -> dict:
    """Event options shared with the other compute events: one model queue."""
    return {"concurrency_id": "compute", "concurrency_limit": limits.current().concurrency}


def check_lab_temperature(value) -> float:
    temperature = validate.check_temperature(value)
    if temperature == 0:
        raise validate.InputError("temperature", "The lab compares distributions, so it needs sampling: set "
                                  "temperature above 0 (greedy decoding has no distribution to compare).")
    return temperature


def check_model(value) -> str:
    if value not in MODEL_VALUES:
        raise validate.InputError("model", f"Models must be one of {', '.join(MODEL_VALUES)}, "
                                           f"got {validate.shown(value)}")
    return value


def check_shape(value) -> str:
    if value not in SHAPE_VALUES:
        raise validate.InputError("shape", f"Draft shape must be one of {', '.join(SHAPE_VALUES)}, "
                                           f"got {validate.shown(value)}")
    return value


def parse_lab(n, depth, k, temperature, top_p, top_k, seed, wrong_rules, shape="chain") -> LabSettings:
    """Widget or API values -> LabSettings, or gr.Error saying what to change (checks of ui.playground.validate)."""
    temperature = check_lab_temperature(temperature)
    return LabSettings(
        n=validate.check_lab_n(n, MIN_N, MAX_N, label="N (continuations per sampler)"),
        depth=validate.check_int("depth", depth, 1, lab.MAX_DEPTH, label="depth (tokens per continuation)"),
        k=validate.check_k(k),
        sampling=validate.check_sampling(temperature, validate.check_top_p(top_p), validate.check_top_k(top_k)),
        seed=validate.check_seed(seed), wrong_rules=validate.check_bool("wrong_rules", wrong_rules),
        tree=check_shape(shape) == "tree")


def check_level(level) -> str:
    if level not in LEVEL_VALUES:
        raise validate.InputError("level", f"Histogram of must be one of {', '.join(LEVEL_VALUES)}, "
                                           f"got {validate.shown(level)}")
    return level


def check_toy_prompt(text) -> torch.Tensor:
    try:
        return toy.toy_pair().encode(text if isinstance(text, str) else "")
    except ValueError as exc:
        raise validate.InputError("toy_prompt", f"Toy prompt: {exc}") from None


def lab_validator(model, toy_prompt, n, depth, k, temperature, top_p, top_k, seed, wrong_rules, level,
                  prompt, target, draft, chat, skip_layers, exit_after, state=None, shape="chain") -> list[dict]:
    """`validator=` of lab_exactness: every bad input is named before the request takes a queue place. The main
    panel's prompt, target and draft are checked only when the lab uses them."""
    current = model == "current"
    return validate.verdicts(
        lambda: check_model(model),
        None if current else (lambda: check_toy_prompt(toy_prompt)),
        lambda: validate.check_lab_n(n, MIN_N, MAX_N, label="N (continuations per sampler)"),
        lambda: validate.check_int("depth", depth, 1, lab.MAX_DEPTH, label="depth (tokens per continuation)"),
        lambda: validate.check_k(k),
        lambda: check_lab_temperature(temperature),
        lambda: validate.check_top_p(top_p), lambda: validate.check_top_k(top_k), lambda: validate.check_seed(seed),
        lambda: validate.check_bool("wrong_rules", wrong_rules), lambda: check_level(level),
        (lambda: validate.check_prompt(prompt)) if current else None,
        (lambda: validate.check_target(target)) if current else None,
        (lambda: validate.check_draft(draft, target)) if current else None,
        lambda: validate.check_bool("chat", chat), None, None, None, lambda: check_shape(shape))


def toy_setup(toy_prompt: str, tree: bool = False) -> LabSetup:
    pair = toy.toy_pair()
    input_ids = check_toy_prompt(toy_prompt)
    tokenizer = pair.target.tokenizer
    if tree:
        def make():
            return se.ModelTreeDrafter(pair.draft.model, width=TREE_WIDTH, name=f"{pair.draft.name}-tree")
    else:
        def make():
            return se.ModelDrafter(pair.draft.model, name=pair.draft.name)
    return LabSetup(pair.target.model, make, input_ids,
                    lambda seq: tokenizer.decode(seq), toy.DESCRIPTION, f'"{toy_prompt.strip()}"', threads=1)


@dataclass(frozen=True)
class Current:
    """The main panel's choice for the lab, checked: what the GPU function needs to build it again."""
    prompt: str
    target: str
    draft: str
    chat: bool
    skip_layers: str
    exit_after: int


def current_setup(prompt, target, draft, chat, skip_layers, exit_after, held: list[str]):
    """The main panel's target and draft, checked, loaded through the registry and held (their names are appended
    to `held`; the caller releases them). Yields progress messages; returns (Current, label, model note, prompt
    note): the GPU function builds the models' side from the Current (`current_models`)."""
    prompt, target = validate.check_prompt(prompt), validate.check_target(target)
    draft = validate.check_draft(draft, target)
    kind, spec = drafts.split_draft(draft)
    models = yield from runner.load([target] + ([spec.model] if spec.model else []), reg.REGISTRY, held)
    loaded = models[target]
    skip_layers, exit_after = validate.check_layers(skip_layers, exit_after, draft, loaded)
    labeler = reg.REGISTRY.labeler(loaded)
    short = prompt.strip().replace("\n", " ")
    return (Current(prompt, target, draft, bool(chat), skip_layers, exit_after),
            lambda seq: " ".join(show_text(labeler(t)) for t in seq), f"{reg.display_name(target)} with draft {draft}",
            f'the main panel\'s prompt "{short[:80]}{"…" if len(short) > 80 else ""}"')


def current_models(current: Current) -> LabSetup:
    """In the GPU function: the target, a drafter factory and the prompt's ids for a checked Current."""
    kind, spec = drafts.split_draft(current.draft)
    loaded = gpu_calls.loaded(current.target)
    draft = gpu_calls.loaded(spec.model) if spec.model else None
    options = drafts.DraftOptions(skip_layers=current.skip_layers, exit_after=current.exit_after)
    return LabSetup(loaded.model, lambda: drafts.build_drafter(spec, loaded, draft, options),
                    loaded.encode_prompt(current.prompt, chat=current.chat), None, "", "")


def status_text(run: LabRun, progress_note: str) -> str:
    s, sampling = run.settings, run.settings.sampling
    return (f"**Model:** {esc(run.model_note)}. **Prompt:** {esc(run.prompt_note)}.  \n"
            f"N = {s.n} continuations of {s.depth} token(s) per sampler, k = {s.k} "
            f"({'draft trees' if s.tree else 'chains'}), temperature "
            f"{sampling.temperature:g}, top-p {sampling.top_p:g}, top-k {sampling.top_k}, seeds {s.seed}…"
            f"{s.seed + s.n - 1}. Exact distribution: {len(run.exact)} outcomes enumerated in "
            f"{run.seconds_exact:.2f} s.  \n{esc(progress_note)}" + same_note(run))


def same_note(run: LabRun) -> str:
    """A line saying which samplers' draws coincide (lab.identical_draws), for the status; "" when none do."""
    note = lab_plots.same_figures_note(lab.identical_draws(run.draws))
    return f"  \n**Same figures:** {note}" if note else ""


def lab_view(run: LabRun, level: str, progress_note: str) -> tuple:
    """(status, exact-rule figure, wrong-rules figure, table, run) for the draws so far."""
    reports = [lab.report(run.exact, d) for d in run.draws if d.n]
    exact_plot, wrong_plot = lab_figures(run, level, reports)
    table = pd.DataFrame(lab_plots.lab_rows(reports), columns=lab_plots.LAB_COLUMNS)
    return status_text(run, progress_note), exact_plot, wrong_plot, table, run


def lab_figures(run: LabRun, level: str, reports=None) -> tuple:
    reports = [lab.report(run.exact, d) for d in run.draws if d.n] if reports is None else reports
    length = 1 if level == "next" else run.settings.depth
    hist = lab.histogram(run.exact, run.draws, length)
    labels = lab_plots.outcome_labels(hist.outcomes, run.label)
    what = "next token" if length == 1 else f"first {length} tokens"
    wrong, tree = wrong_side(run.settings.tree), "tree " if run.settings.tree else ""
    exact = exact_side(run.settings.tree)
    exact_plot = lab_plots.distribution_figure(
        hist, exact, labels, lab_plots.figure_title(f"Exact {tree}rule{'' if tree else 's'}, {what}: ", reports, exact,
                                                    length == 1))
    wrong_plot = lab_plots.distribution_figure(
        hist, wrong, labels, lab_plots.figure_title(f"{'Wrong tree rule' if tree else 'Lossy and wrong rules'}, "
                                                    f"{what}: ", reports, wrong, length == 1))
    return exact_plot, wrong_plot


def initial_outputs() -> dict:
    return {"status": "", "exact_plot": lab_plots.distribution_figure(None, [], [], "Exact rules"),
            "wrong_plot": lab_plots.distribution_figure(None, [], [], "Lossy and wrong rules"),
            "table": pd.DataFrame([], columns=lab_plots.LAB_COLUMNS)}


@dataclass(frozen=True)
class LabJob:
    """One lab run for `lab_job`: the toy pair with `toy_prompt`, or the main panel's `current` models."""
    settings: LabSettings
    toy_prompt: str
    current: Current | None
    seconds: float


@dataclass(frozen=True)
class Exact:
    """The target's exact distribution over continuations, and the seconds its enumeration took."""
    distribution: dict
    seconds: float


@gpu_calls.gpu(gpu_calls.job_seconds)
def lab_job(job: LabJob, stop: gpu_calls.Stop):
    """Yields Exact, then every sampler's SamplerDraws as they grow (at most every UPDATE_INTERVAL seconds, and at
    the sampler's end); ends early at Stop or at the job's deadline."""
    s = job.settings
    setup = toy_setup(job.toy_prompt, s.tree) if job.current is None else current_models(job.current)
    budget = runner.Budget(stop, job.seconds)
    budget.start()
    start = perf_counter()
    exact = lab.exact_distribution(setup.target_model, setup.input_ids[0].tolist(), s.depth, s.sampling)
    yield Exact(exact, perf_counter() - start)
    with intra_op_threads(setup.threads):
        for sampler in samplers_of(s):
            last, draws = perf_counter(), None
            for draws in lab.draw(setup.target_model, setup.make_drafter, setup.input_ids, s.depth, s.k, s.sampling,
                                  s.n, sampler, s.seed, should_stop=budget.should_stop):
                if perf_counter() - last >= UPDATE_INTERVAL:
                    last = perf_counter()
                    yield draws
            if draws is not None:
                yield draws
            if budget.should_stop():
                return


def run_lab(model, toy_prompt, n, depth, k, temperature, top_p, top_k, seed, wrong_rules, level,
            prompt, target, draft, chat, skip_layers, exit_after, state, shape="chain", progress=gr.Progress()):
    """'Run the exactness lab' / api_name="lab_exactness": streams partial histograms, then the final ones.
    The draws end early (and say so) on Stop or at the server's time limit (ui.playground.limits.max_run_seconds)."""
    settings = parse_lab(n, depth, k, temperature, top_p, top_k, seed, wrong_rules, shape)
    check_model(model)
    state.stop_event.clear()
    budget, held = runner.Budget(state.stop_event), []
    skip = (gr.skip(),) * (len(OUTPUTS) - 1)
    try:
        with handlers.friendly_errors():
            if model == "current":
                chosen = yield from handlers.relay(
                    current_setup(prompt, target, draft, chat, skip_layers, exit_after, held),
                    lambda m: (esc(m),) + skip, state.stop_event)
                if chosen is None:
                    return
                current, label, model_note, prompt_note = chosen
                settings = replace(settings, tree=drafts.split_draft(current.draft)[0].tree)   # the draft's own shape
            else:
                setup = toy_setup(toy_prompt, settings.tree)
                current, label, model_note, prompt_note = None, setup.label, setup.model_note, setup.prompt_note
            yield ("Enumerating the exact distribution…",) + skip
            samplers = len(samplers_of(settings))
            job = LabJob(settings, toy_prompt, current,
                         gpu_calls.call_seconds(budget, samplers * settings.n * (settings.depth + 1)))
            yield from draw_all(LabRun(label, model_note, prompt_note, settings, {}, [], 0.0), job, level, state,
                                progress)
    finally:
        budget.cancel.set()
        for name in held:
            reg.REGISTRY.release(name)


def draw_all(run: LabRun, job: LabJob, level: str, state, progress):
    """`lab_job`'s results into `run`, streaming a view for each (they come at most every UPDATE_INTERVAL s)."""
    s = run.settings
    samplers = samplers_of(s)
    total = s.n * len(samplers)
    for item in gpu_calls.pull(lab_job(job, gpu_calls.Stop(state.stop_event)), state.stop_event, gated=True):
        if isinstance(item, coalesce.Waiting):
            yield lab_view(run, level, item.text("Waiting for the model"))
            continue
        if isinstance(item, Exact):
            run.exact, run.seconds_exact = item.distribution, item.seconds
            continue
        if run.draws and run.draws[-1].sampler == item.sampler:
            run.draws[-1] = item             # the same sampler's draws, grown (a copy when it crossed processes)
        else:
            run.draws.append(item)
        name = lab_plots.SAMPLER_NAMES[item.sampler]
        progress((samplers.index(item.sampler) * s.n + item.n) / total, desc=f"{name}: {item.n}/{s.n}")
        yield lab_view(run, level, f"Drawing: {name}, {item.n} of {s.n}…")
    if len(run.draws) < len(samplers) or any(d.n < s.n for d in run.draws):
        why = "Stopped" if state.stop_event.is_set() else f"Time limit ({job.seconds:g} s) reached"
        yield lab_view(run, level, f"{why}: the numbers above use the draws made so far.")
        return
    yield lab_view(run, level, f"Done: {total} continuations in {sum(d.seconds for d in run.draws):.1f} s.")


def relevel(level, run):
    """The histogram level radio: redraw from the stored run (no new draws)."""
    if run is None:
        return gr.skip(), gr.skip()
    return lab_figures(run, level)


def copy_main(k, temperature, top_p, top_k, seed):
    return k, temperature, top_p, top_k, seed


def build_tab(c: dict, state, resize_js: str | None = None) -> list:
    """The "Exactness lab" tab (call inside a gr.Tabs). Returns the events the Stop button should cancel."""
    with gr.Tab("Exactness lab", elem_id="lab-tab") as tab:
        gr.Markdown(CAPTION)
        w: dict = {}
        with gr.Row():
            w["model"] = gr.Radio(MODEL_CHOICES, value="toy", label="Models", elem_id="lab-model",
                                  info=f"Toy: {toy.DESCRIPTION}. Main panel: its prompt, target and draft; about a "
                                       "second per speculative continuation on a CPU, and depth 2-3 needs top-k.")
            w["toy_prompt"] = gr.Textbox(toy.DEFAULT_PROMPT, label="Toy prompt",
                                         info=f"Words: {' '.join(toy.WORDS)}", elem_id="lab-toy-prompt")
        with gr.Row():
            w["n"] = gr.Slider(MIN_N, max_n(), value=min(DEFAULT_N, max_n()), step=50,
                               label="N: continuations per sampler", elem_id="lab-n")
            w["depth"] = gr.Slider(1, lab.MAX_DEPTH, value=2, step=1, label="depth: tokens per continuation",
                                   elem_id="lab-depth")
            w["k"] = gr.Slider(1, se.MAX_K, value=DEFAULT_K, step=1, label="k: draft tokens per round")
        with gr.Row():
            w["temperature"] = gr.Slider(0, 2, value=1.0, step=0.05, label="temperature (> 0)")
            w["top_p"] = gr.Slider(0.05, 1, value=0.8, step=0.01, label="top-p")
            w["top_k"] = gr.Number(0, precision=0, minimum=0, label="top-k (0 = off)")
            w["seed"] = gr.Number(0, precision=0, minimum=0, label="first seed")
        with gr.Row():
            w["shape"] = gr.Radio(SHAPE_CHOICES, value="chain", label="Draft shape", elem_id="lab-shape",
                                  info="Toy pair: its draft drafts a chain or a tree. Main panel: its draft's own "
                                       "shape (lookup-tree, layer-skip-tree are trees).")
            w["wrong_rules"] = gr.Checkbox(True, label="Also run the lossy and wrong rules", elem_id="lab-wrong")
            copy_btn = gr.Button("Use the main panel's k, temperature, top-p, top-k, seed", size="sm")
            run_btn = gr.Button("Run the exactness lab", variant="primary", elem_id="lab-run")
        init = initial_outputs()
        out = {"status": gr.Markdown("", elem_id="lab-status")}
        level = gr.Radio(LEVEL_CHOICES, value="next", label="Histogram of", elem_id="lab-level")
        with gr.Row():
            out["exact_plot"] = gr.Plot(init["exact_plot"], show_label=False, elem_id="lab-plot-exact")
            out["wrong_plot"] = gr.Plot(init["wrong_plot"], show_label=False, elem_id="lab-plot-wrong")
        out["table"] = gr.Dataframe(init["table"], headers=lab_plots.LAB_COLUMNS, interactive=False, wrap=True,
                                    column_widths=lab_plots.LAB_WIDTHS, label="Against the exact distribution",
                                    elem_id="lab-table")
        out["run"] = gr.State(None, time_to_live=limits.current().session_ttl_seconds)
    inputs = [w[name] for name in ("model", "toy_prompt", "n", "depth", "k", "temperature", "top_p", "top_k", "seed",
                                   "wrong_rules")]
    inputs += [level] + [c[name] for name in ("prompt", "target", "draft", "chat", "skip_layers", "exit_after")]
    event = run_btn.click(run_lab, inputs + [state, w["shape"]], [out[name] for name in OUTPUTS],
                          api_name="lab_exactness", preprocess=False, validator=lab_validator, **compute())
    private = {"api_visibility": "private"}
    level.change(relevel, [level, out["run"]], [out["exact_plot"], out["wrong_plot"]], **private)
    copy_btn.click(copy_main, [c[name] for name in ("k", "temperature", "top_p", "top_k", "seed")],
                   [w[name] for name in ("k", "temperature", "top_p", "top_k", "seed")], **private)
    if resize_js:
        tab.select(None, None, None, js=resize_js, **private)
    return [event]
