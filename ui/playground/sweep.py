"""Sweep k: the current settings for several k, one plain-decoding baseline for all, into the history."""
from __future__ import annotations

import dataclasses

from ui.playground import compute, runner
from ui.playground import registry as reg
from ui.playground.handlers import (SKIP_RUN, fold, friendly_errors, measurement_job, message_view, parse_settings,
                                   relay, run_view)
from ui.playground.state import SessionState

SWEEP_K = (1, 2, 3, 4, 6, 8, 12)

SWEEP_PHASES = {"live": "a first pass, not drawn", "timed": "decoding again without drawing, timed",
                "plain": "measuring plain decoding once for the sweep"}


def sweep_k(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
            exit_after, auto_baseline, show_spaces, state: SessionState):
    """Run the current settings for several k into the history. The runs share one time budget. Each point is
    measured as Run measures its speed (handlers.measurement_job): a first pass, not drawn, then the timed pass by
    `decoder.generate` in a worker thread, nothing built for a view, while the handler only wakes every
    runner.BASELINE_POLL s. Plain decoding is measured once for the sweep, back to back with its first point (k does
    not change it), and every point sizes its drafts by the verify-cost curve the first point was sized by, so the
    points differ by k alone. Issue #36: driving each timed point's rounds through the handler (one yield to Gradio
    per round) made the speculative side 5-10 times slower than Run's measurement of the same settings."""
    base = parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                          skip_layers, exit_after)
    state.stop_event.clear()
    budget = runner.Budget(state.stop_event)
    sizing = None

    with friendly_errors():
        for n, k_value in enumerate(SWEEP_K):
            if state.stop_event.is_set() or budget.timed_out:
                break
            settings = dataclasses.replace(base, k=k_value)
            label = f"Sweep {n + 1}/{len(SWEEP_K)}: k = {k_value}"
            preparing = runner.prepare(settings, state, reg.REGISTRY, bool(show_spaces), hold=True)
            prep = yield from relay(preparing, lambda m: message_view(f"{label}: {m}"), state.stop_event)
            if prep is None:
                return
            try:
                job = measurement_job(settings, prep.prompt_ids, budget, sizing=sizing, plain=n == 0, first_pass=True)
                doing = SWEEP_PHASES["live"]
                yield message_view(f"{label}: {doing}…")
                for item in fold(prep, state, job, budget):
                    if isinstance(item, compute.Built):
                        state.active = prep
                        yield SKIP_RUN
                    elif isinstance(item, compute.Phase):
                        doing = SWEEP_PHASES[item.name]
                        yield message_view(f"{label}: {doing}…")
                    elif isinstance(item, str):
                        yield message_view(f"{label}: {doing}… {item}")
                    else:
                        yield SKIP_RUN
                if prep.record is None or prep.record.recorded:
                    return
                sizing = sizing if sizing is not None else prep.record.sizing
                runner.end_rounds(prep, state, budget.timed_out)
                state.finish(prep.record)
                yield run_view(prep, state, status=f"{label} done", final=True)
            finally:
                runner.release(prep, reg.REGISTRY)
        if budget.timed_out:
            yield message_view(f"Sweep stopped at this server's time limit ({budget.seconds:g} s); "
                               "the finished runs are in the history.")
