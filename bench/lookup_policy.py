"""How long a prompt-lookup draft should be: the evidence behind `LookupOdds` and cost-aware sizing
(spec_engine/drafters/lookup.py, spec_engine/drafters/sizing.py).

Greedy answers of the offline default to chat, code and input-grounded prompts are generated once with plain
decoding. Because greedy speculative decoding reproduces them token for token, every lookup round can then be
replayed without the model: the drafter proposes from the committed ids, the accepted prefix is the part that
agrees with the answer, and the round commits one more token. The script reports

1. for each match length n, how often the first copied token is right and how long the right run is;
2. tokens per target forward and the predicted speedup vs plain decoding (tokens / summed verify cost, with the
   packed verify costs of bench/results/verify-cost-fp32.json; drafting and overhead left out) for our lookup
   sized by cost (the default), the same lookup at full length k, and transformers' own rule
   (`PromptLookupCandidateGenerator`, first match left to right, always k tokens; its cost uses the stock
   column, as `generate()` runs stock).

    python -m bench.lookup_policy --threads 1 --out bench/results/lookup-policy-fp32
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import yaml
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from spec_engine.bench import PROMPTS
from spec_engine.core.decoder import autoregressive_generate
from spec_engine.drafters import PROMPT_LOOKUP_MAX_NGRAM, PromptLookupDrafter, Proposal, longest_suffix_match
from spec_engine.models import DEFAULT_MODEL, load_model
from spec_engine.core.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
VERIFY_COST = ROOT / "bench" / "results" / "verify-cost-fp32.json"
GREEDY = SamplingParams(temperature=0.0)

# Grounded prompts written for this check (the answers copy from the input), beside the benchmark's four and
# the playground's presets.
GROUNDED = {
    "json": "Convert this list into a JSON array of objects with keys name and age, and output only the JSON:\n\n"
            "Alice, 31\nBob, 27\nCarol, 45\nDavid, 38\nEve, 29",
    "docstring": "Add a docstring to this function and return the whole function:\n\ndef clamp(value, low, high):\n"
                 "    if value < low:\n        return low\n    if value > high:\n        return high\n    return value",
    "formal": "Rewrite this email in a more formal tone, keeping all the details:\n\nHi Sam, thanks for sending the "
              "report on Friday. I read it over the weekend and I think the numbers in section two are wrong. Can we "
              "meet on Monday at 10 to go through them? Also please bring the sales figures from March and April.",
    "bullets": "Turn this paragraph into a bulleted list of facts, using the same words where possible:\n\nThe museum "
               "opens at nine in the morning and closes at six in the evening. Tickets cost twelve dollars for adults "
               "and six dollars for children. The museum is closed on Mondays. Guided tours start every hour from ten "
               "o'clock.",
    "typos": "Correct the typos in this paragraph and output the corrected paragraph:\n\nOur team will meet on "
             "Thursdday to reveiw the budget for next year. Please bring your notes and any questons you have about "
             "the new proccess. We will also discuss the schedule for the spring confrence.",
    "sql": "Rewrite this SQL query so the keywords are upper case and return only the query:\n\nselect name, email "
           "from users where age > 30 and country = 'France' order by name limit 10;",
}


def prompt_set() -> dict[str, str]:
    presets = yaml.safe_load((ROOT / "presets" / "scenarios.yaml").read_text(encoding="utf-8"))["prompts"]
    return (dict(PROMPTS) | {f"preset-{p['id']}": p["text"] for p in presets if p.get("chat", True)}
            | {f"grounded-{name}": text for name, text in GROUNDED.items()})


def saved_cost_curves() -> tuple[list[float], list[float]]:
    """Packed and stock cost of a forward over n = 1..17 tokens (index n), as bench.verify_cost saved them."""
    rows = json.loads(VERIFY_COST.read_text())["rows"]
    if [r["tokens"] for r in rows] != list(range(1, 18)):
        raise SystemExit(f"{VERIFY_COST} must list every row count 1..17: run python -m bench.verify_cost")
    return [math.nan] + [r["packed"] for r in rows], [math.nan] + [r["stock"] for r in rows]


class HFRule:
    """transformers' candidate rule behind the drafter protocol, for the replay."""

    def __init__(self, k: int):
        self.generator = PromptLookupCandidateGenerator(num_output_tokens=k, max_length=1 << 30,
                                                        max_matching_ngram_size=PROMPT_LOOKUP_MAX_NGRAM)

    def begin(self, prompt_ids):
        pass

    def propose(self, committed: list[int], k: int, params, generator) -> Proposal:
        ids = torch.tensor([committed])
        candidates, _ = self.generator.get_candidates(ids)
        return Proposal(candidates[0, ids.shape[1]:].tolist(), None)

    def rollback(self, committed):
        pass


def lookup(sizing: str, costs) -> PromptLookupDrafter:
    drafter = PromptLookupDrafter(sizing=sizing)
    drafter.costs = costs if sizing == "cost" else None
    return drafter


def replay(answers: dict, make_drafter, k: int, cost: list[float]) -> tuple[float, float]:
    """(tokens per target forward, predicted speedup) of greedy rounds with a fresh drafter per answer."""
    tokens = forwards = spent = 0
    for prompt_ids, answer in answers.values():
        drafter, done = make_drafter(), 0
        drafter.begin(prompt_ids)
        while done < len(answer):
            committed = prompt_ids + answer[:done]
            room = min(k, len(answer) - done - 1)                 # as the engine: a round emits at most room + 1
            draft = drafter.propose(committed, room, GREEDY, None).tokens[:room]
            accepted = next((i for i, t in enumerate(draft) if t != answer[done + i]), len(draft))
            done += min(accepted + 1, len(answer) - done)
            drafter.rollback(prompt_ids + answer[:done])
            forwards += 1
            spent += cost[len(draft) + 1]
        tokens += len(answer)
    return tokens / forwards, tokens / spent


def match_table(answers: dict) -> list[str]:
    runs: dict[int, list[int]] = {}
    for prompt_ids, answer in answers.values():
        for done in range(len(answer)):
            committed = prompt_ids + answer[:done]
            n, begin = longest_suffix_match(committed, 64)
            if n == 0:
                continue
            copy, truth = committed[begin:begin + 16], answer[done:done + 16]
            run = next((i for i, (a, b) in enumerate(zip(copy, truth)) if a != b), min(len(copy), len(truth)))
            runs.setdefault(min(n, 8), []).append(run)
    lines = ["| match length n | positions | first copied token right | next one right, given the one before "
             "| mean right run (of up to 16) |", "|---|---|---|---|---|"]
    for n, values in sorted(runs.items()):
        label = f"{n}+" if n == 8 else str(n)
        right = sum(v > 0 for v in values) / len(values)
        after_first = [v for v in values if v > 0]
        next_right = sum(v - 1 for v in after_first) / max(1, sum(v - 1 + (v < 16) for v in after_first))
        lines.append(f"| {label} | {len(values)} | {right:.2f} | {next_right:.2f} | {sum(values) / len(values):.2f} |")
    return lines


def greedy_answers(tokens: int) -> dict[str, tuple[list[int], list[int]]]:
    target = load_model(DEFAULT_MODEL)
    answers = {}
    for name, text in prompt_set().items():
        prompt_ids = target.encode_prompt(text)[0].tolist()
        result = autoregressive_generate(target.model, torch.tensor([prompt_ids]), tokens, GREEDY,
                                         eos_token_id=target.tokenizer.eos_token_id)
        answers[name] = (prompt_ids, result.tokens)
    return answers


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup_policy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--k", type=int, nargs="*", default=[2, 4, 6, 8])
    parser.add_argument("--answers", default=None,
                        help="JSON file of the greedy answers: read if it exists, else written")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.answers and Path(args.answers).exists():
        answers = {name: tuple(pair) for name, pair in json.loads(Path(args.answers).read_text()).items()}
    else:
        answers = greedy_answers(args.tokens)
        if args.answers:
            Path(args.answers).write_text(json.dumps(answers))
    packed, stock = saved_cost_curves()
    groups = {"grounded": [n for n in answers if n in ("summarise", "edit") or n.startswith("grounded-")
                           or n in ("preset-edit-typos", "preset-code-rename", "preset-summarise")]}
    groups["chat and code"] = [n for n in answers if n not in groups["grounded"]]
    lines = [f"Greedy answers of {DEFAULT_MODEL} (up to {args.tokens} tokens) to {len(answers)} prompts: "
             + ", ".join(answers), "", *match_table(answers), "",
             "| prompts | k | lookup sized by cost: tokens/forward | predicted | full-k lookup | predicted "
             "| transformers' rule | predicted (stock) |", "|---|---|---|---|---|---|---|---|"]
    for group, names in groups.items():
        subset = {n: answers[n] for n in names}
        for k in args.k:
            graded = replay(subset, lambda: lookup("cost", packed), k, packed)
            full = replay(subset, lambda: lookup("full", None), k, packed)
            hf = replay(subset, lambda: HFRule(k), k, stock)
            lines.append(f"| {group} | {k} | {graded[0]:.2f} | {graded[1]:.2f}x | {full[0]:.2f} | {full[1]:.2f}x "
                         f"| {hf[0]:.2f} | {hf[1]:.2f}x |")
    meta = {"model": DEFAULT_MODEL, "threads": args.threads, "torch": torch.__version__,
            "command": "python -m bench.lookup_policy " + " ".join(argv or [])}
    text = "\n".join(lines) + f"\n\n{json.dumps(meta)}\n"
    print(text)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
