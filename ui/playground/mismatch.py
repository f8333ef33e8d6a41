"""The tokenizer-mismatch demo: one prompt, greedy, k=4, with a naive-id draft, a cross-tokenizer draft and
same-tokenizer drafts, side by side."""
from __future__ import annotations

from time import perf_counter

import gradio as gr
import pandas as pd

import spec_engine as se

from ui.playground import compute, handlers, runner, validate
from ui.playground import registry as reg
from ui.playground.handlers import compare_figure, fold, friendly_errors, history_frame, progress_line, relay
from ui.playground.state import RunSettings, SessionState
from ui.views import metrics, plots, render

MISMATCH_MAX_NEW_TOKENS = 40
MISMATCH_OUTPUTS = ("mm_status", "mm_table", "mm_plot", "mm_views", "mm_tokenization", "history", "compare_plot")
MISMATCH_COLUMNS = ["draft", "what the target receives", "acceptance", "tokens/forward", "tok/s", "rounds", "note"]
MISMATCH_WIDTHS = ["250px", "250px", "95px", "105px", "70px", "75px", "240px"]


def mismatch_drafts(target: str) -> list[tuple[str, str, str]]:
    """(draft value, label, what the target receives) for the tokenizer-mismatch demo; the different-tokenizer draft
    is the packaged Gemma where installed, else GPT-2 from the Hub (reg.mismatch_draft_model)."""
    draft = reg.mismatch_draft_model()
    them, us = reg.short_name(draft), reg.short_name(target)
    return [
        (f"{draft}:naive-ids", "(a) naive ids", f"{them}'s token ids, reused as {us} ids"),
        (f"{draft}:cross-tokenizer", "(b) cross-tokenizer", f"{them}'s text, re-tokenized by {us}"),
        ("prompt-lookup", "(c) same tokenizer", f"{us} ids copied from the context"),
        ("layer-skip", "(c') same tokenizer", f"{us} ids from the target minus some layers"),
    ]


def mismatch_demo(prompt, target, max_new_tokens, chat, state: SessionState):
    """Same prompt, greedy, k=4, with a naive-id draft, a cross-tokenizer draft and same-tokenizer drafts.

    Every model the demo needs loads first, saying which while it loads (the other-tokenizer draft's first load is
    the slow part of a cold start), so the time limit counts decoding only. Then the runs decode, the quick
    same-tokenizer drafts first, each with an equal share of the time still left: what a quick run leaves goes to
    the other-tokenizer runs, whose every round pays for k forwards of a larger draft."""
    clean, problems = validate.check_mismatch(prompt, target, max_new_tokens, chat)
    if problems:
        field = next(iter(problems))
        raise validate.InputError(field, problems[field])
    n_tokens = min(clean["max_new_tokens"], MISMATCH_MAX_NEW_TOKENS)
    state.stop_event.clear()
    budget = runner.Budget(state.stop_event)
    preps: dict[str, runner.Prepared] = {}
    done_runs: dict[str, tuple] = {}

    with friendly_errors():
        drafts = mismatch_drafts(clean["target"])
        try:
            if not (yield from prepare_runs(drafts, clean, n_tokens, state, preps)):
                return
            yield from decode_runs(drafts, preps, n_tokens, state, budget, done_runs)
        finally:
            for prep in preps.values():
                runner.release(prep, reg.REGISTRY)
        yield mismatch_results(drafts, preps, done_runs, budget, clean["target"], state)


def status_only(status) -> tuple:
    """The demo's outputs with only the status line changed."""
    return (status,) + (gr.skip(),) * (len(MISMATCH_OUTPUTS) - 1)


def prepare_runs(drafts: list, clean: dict, n_tokens: int, state: SessionState, preps: dict):
    """Generator: load every run's models (held until released) into `preps` by label, saying what loads;
    returns False when the visitor stopped first."""
    other = reg.mismatch_draft_model()
    if reg.REGISTRY.loaded(other) is None:
        yield status_only(f"Loading {reg.short_name(other)}, the draft with another tokenizer, before the four "
                          "runs: a first load reads and unpacks its weights, a minute or more on a small CPU; it "
                          "then stays loaded while in use.")
    for draft, label, receives in drafts:
        settings = RunSettings(target=clean["target"], draft=draft, k=4, temperature=0.0, top_p=1.0, top_k=0,
                               max_new_tokens=n_tokens, seed=0, rule="exact", chat=clean["chat"],
                               prompt=clean["prompt"])
        prep = yield from relay(runner.prepare(settings, state, reg.REGISTRY, hold=True),
                                lambda m: status_only(f"Before the runs: {m}"), state.stop_event)
        if prep is None:
            return False
        preps[label] = prep
    return True


def decode_runs(drafts: list, preps: dict, n_tokens: int, state: SessionState, budget, done_runs: dict):
    """Generator: decode the prepared runs, same-tokenizer drafts first, each with an equal share of the time
    left; notes each finished run's (receives, share) in `done_runs` by label."""
    runs = sorted(drafts, key=lambda d: ":" in d[0])      # same-tokenizer drafts first (a stable sort)
    for n, (draft, label, receives) in enumerate(runs):
        if state.stop_event.is_set() or budget.timed_out:
            return
        prep, share = preps[label], budget.remaining / (len(runs) - n)
        yield status_only(f"{label}: decoding {n_tokens} tokens…")
        job = compute.RunJob(prep.settings, prep.prompt_ids, compute.call_seconds(budget, n_tokens, share))
        last = 0.0
        for item in fold(prep, state, job, budget):
            now = perf_counter()
            if isinstance(item, se.RoundEvent) and (item.finished or now - last >= handlers.RENDER_INTERVAL):
                last = now
                yield status_only(progress_line(prep, item, label))
            else:
                yield status_only(gr.skip())
        runner.release(prep, reg.REGISTRY)
        if prep.record is None:
            return
        runner.keep_live_timing(prep.record, state)         # nothing was drawn while it ran
        state.finish(prep.record)
        done_runs[label] = (receives, share)


def mismatch_results(drafts: list, preps: dict, done_runs: dict, budget, target: str, state: SessionState) -> tuple:
    """The demo's final outputs: the table, the plot and the token views of the finished runs."""
    results, views = [], []
    for draft, label, receives in drafts:                         # shown in the lesson's order
        if label not in done_runs:
            continue
        prep, share = preps[label], done_runs[label][1]
        summary = state.summary(prep.record)
        notes = sorted({r.note for r in prep.record.rounds if r.note})
        if prep.record.stop_reason == runner.TIME_LIMIT:
            notes.append(f"stopped at its share of the time limit ({share:.0f} s)")
        low, high = metrics.acceptance_interval(prep.record.rounds)
        results.append(dict(summary, label=label, receives=receives, note="; ".join(notes), low=low, high=high,
                            pair=":" in draft))
        views.append((label, receives, summary, prep))
    table = pd.DataFrame([[r["label"] + ": " + r["draft"], r["receives"], round(r["acceptance_rate"], 3),
                           round(r["tokens_per_forward"], 2), round(r["tokens_per_second"], 1), r["rounds"],
                           r["note"]] for r in results], columns=MISMATCH_COLUMNS)
    done = "Done: hover the tokens to see why each draft was accepted or rejected."
    if budget.timed_out:
        done = f"Stopped at this server's time limit ({budget.seconds:g} s). " + done
    return (done, table, plots.mismatch_figure(results, reg.short_name(reg.mismatch_draft_model())),
            mismatch_views_html(views), tokenization_demo(views, target), history_frame(state),
            compare_figure(state))


def mismatch_views_html(views) -> str:
    parts = []
    for label, receives, summary, prep in views:
        head = (f'<div class="mm-head"><b>{render.esc(label)}</b>: {render.esc(receives)} · acceptance '
                f'{summary["acceptance_rate"]:.0%} · {summary["tokens_per_forward"]:.2f} tokens per target '
                'forward</div>')
        parts.append(head + f'<div class="mm-box">{render.view_html(prep.record.fragments, legend=False)}</div>')
    return "".join(parts)


def tokenization_demo(views, target: str) -> str:
    """The same generated text cut by both tokenizers: different boundaries, and different ids for a piece."""
    same = next((prep for label, _, _, prep in views if "same" in label), None)
    if same is None:
        return ""
    text = same.labeler.text(same.record.tokens[:14])
    rows = []
    drafts = [prep.record.settings.draft.partition(":")[0] for _, _, _, prep in views
              if ":" in prep.record.settings.draft]
    for name in (target, *drafts[:1]):
        loaded = reg.REGISTRY.loaded(name)
        if loaded is None:
            continue
        ids = loaded.tokenizer.encode(text, add_special_tokens=False)
        labeler = reg.REGISTRY.labeler(loaded)
        rows.append((reg.display_name(name), [(i, labeler(i)) for i in ids]))
    return render.tokenization_html(text, rows)
