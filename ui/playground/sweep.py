"""Sweep k: the current settings for several k, one plain-decoding baseline for all, into the history."""
from __future__ import annotations

import dataclasses

from ui.playground import compute, runner
from ui.playground import registry as reg
from ui.playground.handlers import SKIP_RUN, fold, friendly_errors, message_view, parse_settings, relay, run_view
from ui.playground.state import SessionState

SWEEP_K = (1, 2, 3, 4, 6, 8, 12)

SWEEP_PHASES = {"timed": "decoding without drawing", "plain": "measuring plain decoding once for the sweep"}


def sweep_k(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat, skip_layers,
            exit_after, auto_baseline, show_spaces, state: SessionState):
    """Run the current settings for several k (one plain-decoding baseline serves all) into the history. The
    runs share one time budget. Each point is measured as Run measures its speed: decoded by `decoder.generate` in
    a worker thread while the handler only wakes every runner.BASELINE_POLL s (compute.run_job's timed pass), with
    no live pass. Issue #36: driving each point's rounds through the handler (one yield to Gradio per round) made
    the speculative side 5-10 times slower than Run's measurement of the same settings on two busy cores."""
    base = parse_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                          skip_layers, exit_after)
    state.stop_event.clear()
    budget = runner.Budget(state.stop_event)

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
                plain = settings.baseline_key(prep.prompt_ids) not in state.baselines
                job = compute.RunJob(settings, prep.prompt_ids,
                                     compute.call_seconds(budget, (1 + plain) * settings.max_new_tokens), live=False,
                                     timed=True, plain=plain, show_timed=True)
                doing = "decoding without drawing"
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
                runner.end_rounds(prep, state, budget.timed_out)
                state.finish(prep.record)
                yield run_view(prep, state, status=f"{label} done", final=True)
            finally:
                runner.release(prep, reg.REGISTRY)
        if budget.timed_out:
            yield message_view(f"Sweep stopped at this server's time limit ({budget.seconds:g} s); "
                               "the finished runs are in the history.")
