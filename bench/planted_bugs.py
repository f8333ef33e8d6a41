"""Plant the bugs of issues #29, #34, #37 and #63 one at a time in a copy and run the tests that must catch each.

Each bug is a small source edit (a string replacement that must find its original text exactly once, so this script
fails loudly when the code moves). The copy is the checkout's tracked and untracked, not ignored, files (so tests
not yet committed count), one fresh copy per bug. The tests run are each bug's files: for the bugs of core/ and the
display, the fast tier (`-m "not slow"`) of the deterministic files; for a drafter's sibling draws, the default tier
of the tree chi-square file (fixed seeds: `caught` means a test failed that fails on every run); with the
environment's speed layer (the compiled sampling searches on the CPU, as the app runs: csrc/sampling.cpp is
compiled again from the copy's source, its library named by the source's hash). A run of the unchanged copy comes
first and must pass.

    .venv/bin/python -m bench.planted_bugs --out bench/results/planted-bugs.md
    .venv/bin/python -m bench.planted_bugs --only greedy_bonus_off_by_one      # one bug, table on stdout
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The deterministic test files that reach the rule, the sampling, the loop and the display; nothing statistical.
TEST_FILES = ("tests/test_verify_enumeration.py", "tests/test_sampling.py", "tests/test_engine.py",
              "tests/test_ui_render.py")
STATISTICAL = ("tests/test_sampling.py::"
               "test_inverse_cdf_sampler_matches_the_distribution_and_never_draws_zero_probability",)

TOP_P_AFTER_TEMPERATURE = """    for (int64_t r = 0; r < rows; ++r) {
        softmax_row(logits + r * vocab, vocab, temperature, out + r * vocab);
        counts[r] = -1;
    }
    return top_p < 1.0f ? top_p_rows(out, rows, vocab, top_p, out, ids, cap, counts) : 0;
"""
TOP_P_BEFORE_TEMPERATURE = ("    // PLANTED: the top-p set is chosen at temperature 1, "
                            "the temperature applied to its members afterwards\n"
                            """    for (int64_t r = 0; r < rows; ++r) {
        softmax_row(logits + r * vocab, vocab, top_p < 1.0f ? 1.0f : temperature, out + r * vocab);
        counts[r] = -1;
    }
    if (!(top_p < 1.0f)) return 0;
    const int64_t status = top_p_rows(out, rows, vocab, top_p, out, ids, cap, counts);
    if (status != 0) return status;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits + r * vocab;
        float* out_row = out + r * vocab;
        const int32_t* members = ids + r * cap;
        float top = -INFINITY;
        for (int64_t j = 0; j < counts[r]; ++j) top = std::max(top, row[members[j]]);
        double sum = 0.0;
        for (int64_t j = 0; j < counts[r]; ++j) sum += std::exp((row[members[j]] - top) / temperature);
        for (int64_t j = 0; j < counts[r]; ++j)
            out_row[members[j]] = (float)(std::exp((row[members[j]] - top) / temperature) / sum);
    }
    return 0;
""")


@dataclass(frozen=True)
class Bug:
    name: str
    what: str                 # the words
    path: str
    old: str
    new: str
    tests: tuple = TEST_FILES             # the files run against it
    tier: str = "fast"                    # "fast": -m "not slow" (core/ bugs must be caught there); "default": all


BUGS = (
    Bug("accept_q_over_p", "accept with min(1, q/p)", "spec_engine/core/verify.py",
        "return min(1.0, target_p / draft_q) if draft_q > 0 else 0.0",
        "return min(1.0, draft_q / target_p) if target_p > 0 else 0.0"),
    Bug("correction_from_p_in_verify_sampled",
        "correction drawn from p inside `verify_sampled`, changing only the sampled token (the verdict's display "
        "still shows the residual)", "spec_engine/core/verify.py",
        "    point = unit_draw(generator, target_probs.device)\n"
        "    return settle(rule, drafted_ids, draft_probs, target_probs, target_p, draft_q, uniform_list, point, "
        "members)\n",
        "    point = unit_draw(generator, target_probs.device)\n"
        "    verdict = settle(rule, drafted_ids, draft_probs, target_probs, target_p, draft_q, uniform_list, point, "
        "members)\n"
        "    if verdict.accepted < n:\n"
        "        import dataclasses\n"
        "        verdict = dataclasses.replace(verdict, next_token=sample_at(target_probs[verdict.accepted], point))\n"
        "    return verdict\n"),
    Bug("correction_from_p_in_settle",
        "correction drawn from p in `settle` (the rule `verify_sampled` and `verify_with_draws` share), changing only "
        "the sampled token", "spec_engine/core/verify.py",
        "    next_token = sample_at(next_dist, point, support)\n",
        "    next_token = sample_at(next_dist if accepted == n else target_probs[accepted], point, support)\n"),
    Bug("bonus_from_wrong_row", "bonus token sampled from the wrong row (row k - 1 instead of k)",
        "spec_engine/core/verify.py",
        "        next_dist = target_probs[n]\n",
        "        next_dist = target_probs[n - 1] if n else target_probs[n]\n"),
    Bug("bonus_from_wrong_row_in_verify_sampled",
        "bonus token sampled from the wrong row inside `verify_sampled` only (its token, not its display)",
        "spec_engine/core/verify.py",
        "    point = unit_draw(generator, target_probs.device)\n"
        "    return settle(rule, drafted_ids, draft_probs, target_probs, target_p, draft_q, uniform_list, point, "
        "members)\n",
        "    point = unit_draw(generator, target_probs.device)\n"
        "    verdict = settle(rule, drafted_ids, draft_probs, target_probs, target_p, draft_q, uniform_list, point, "
        "members)\n"
        "    if verdict.accepted == n and n:\n"
        "        import dataclasses\n"
        "        verdict = dataclasses.replace(verdict, next_token=sample_at(target_probs[n - 1], point))\n"
        "    return verdict\n"),
    Bug("top_p_before_temperature",
        "top-p applied before temperature in the compiled `warp_rows` (csrc/sampling.cpp, the default CPU path)",
        "spec_engine/accel/csrc/sampling.cpp", TOP_P_AFTER_TEMPERATURE, TOP_P_BEFORE_TEMPERATURE),
    Bug("greedy_bonus_off_by_one", "greedy bonus off by one (the argmax of row k - 1 instead of row k)",
        "spec_engine/core/verify.py",
        "    next_token = argmax[accepted]\n",
        "    next_token = argmax[min(accepted, n - 1)]\n"),
    Bug("cache_trimmed_one_short", "cache trimmed one position short", "spec_engine/core/decoder.py",
        "        trim_cache(state.target_cache, len(committed) - 1)\n        self.drafter.rollback(committed, None if",
        "        trim_cache(state.target_cache, min(len(committed), cache_len(state.target_cache)))\n"
        "        self.drafter.rollback(committed, None if"),
    Bug("correction_rendered_as_accepted", "a correction rendered as accepted", "ui/views/render.py",
        'for kind, token in (("correction", ev.correction), ("bonus", ev.bonus)):',
        'for kind, token in (("accepted", ev.correction), ("bonus", ev.bonus)):'),
    # issue #34: the tree gaps
    Bug("tree_siblings_drawn_with_replacement_labelled_without",
        'a tree drafter draws its siblings with replacement but labels them "without" (TV 0.011-0.034)',
        "spec_engine/drafters/tree.py",
        '        if drawn == "without_replacement":\n            left = without(left, token)\n    return picked',
        "    return picked",
        ("tests/test_tree_statistical.py::test_a_tree_drafter_draws_its_siblings_the_way_it_labels_them",), "default"),
    Bug("tree_view_bolds_every_child_of_a_kept_node", "the tree view draws every child of a kept node in bold",
        "ui/views/tree.py", "bold = i in path or (i == n and (parent < 0 or parent in path))",
        "bold = i in path or parent in path or (i == n and parent < 0)", ("tests/test_tree_view.py",)),
    Bug("eagle_tree_expansion_position_off_by_one", "the EAGLE tree expands its frontier one position late",
        "spec_engine/drafters/eagle_tree.py", "positions = torch.tensor([committed_len - 2 + d for d in depths]",
        "positions = torch.tensor([committed_len - 1 + d for d in depths]", ("tests/test_eagle_tree.py",)),
    Bug("verify_tree_uniforms_reversed", "`verify_tree` hands node i the uniform drawn for node n - 1 - i",
        "spec_engine/core/verify.py", "                     uniforms, point, rule)\n",
        "                     uniforms[::-1], point, rule)\n",
        ("tests/test_tree_rule.py", "tests/test_tree_engine.py")),
    Bug("tree_residual_not_updated_between_siblings",
        "the tree rule judges a later sibling against p instead of the residual the earlier ones left",
        "spec_engine/core/tree_rule.py",
        "left = residual(p_row, q_j) if rule in WRONG_TREE else residual(left, q_j)",
        "left = residual(p_row, q_j) if rule in WRONG_TREE else left", ("tests/test_tree_rule.py",)),
    # issue #37: the rules engines ship, each planted wrong
    Bug("strict_checks_the_argmax", "strict compares each draft with the target's argmax instead of its own draw",
        "spec_engine/core/verify.py", "        own = sample_at(target_probs[i], uniforms[i], support)\n",
        "        own = int(target_probs[i].argmax())\n", ("tests/test_verify_enumeration.py", "tests/test_rules.py")),
    Bug("typical_threshold_without_entropy", "typical's threshold is epsilon alone (Medusa's entropy term dropped)",
        "spec_engine/core/rule.py", "    return min(epsilon, delta * math.exp(-entropy))\n",
        "    return epsilon\n", ("tests/test_verify_enumeration.py", "tests/test_rules.py")),
    Bug("q_mismatch_reads_the_warped_q", "q_mismatch reads the warped q (the shipped bug silently fixed: no drift)",
        "spec_engine/core/verify.py", "    return unwarped.to(draft_probs.dtype)\n", "    return draft_probs\n",
        ("tests/test_verify_enumeration.py", "tests/test_rules.py")),
    Bug("strict_tree_reads_q", "strict on a tree tries siblings as drawn from q (it is then the exact rule)",
        "spec_engine/core/tree_rule.py",
        '        drawn = "deterministic" if rule == STRICT else tree.drawn[node + 1]\n',
        "        drawn = tree.drawn[node + 1]\n", ("tests/test_tree_rule.py",)),
    Bug("typical_tree_keeps_the_first_passing_node", "typical on a tree keeps the first passing node's path, not the "
        "deepest", "spec_engine/core/tree_rule.py",
        "deepest = max((i for i in range(n) if passed[i]), key=lambda i: (depth[i], -i), default=-1)",
        "deepest = max((i for i in range(n) if passed[i]), key=lambda i: -i, default=-1)",
        ("tests/test_tree_rule.py",)),
    # issue #63: slips in the newer parts, each invisible to identity tests (sizes, figures and keys, not the text)
    Bug("suffix_min_match_to_the_fallback", "suffix decoding: a match exactly at the minimum length handed to the "
        "fallback (off by one)", "spec_engine/drafters/suffix.py",
        "and self.suffix.last_match >= self.min_match", "and self.suffix.last_match > self.min_match",
        ("tests/test_suffix_scores.py",)),
    Bug("suffix_deeper_levels_first_odds", "suffix decoding: deeper levels scored with the first level's odds",
        "spec_engine/drafters/suffix.py",
        "heapq.heappush(heap, (negative * share * later, order, child, me, next_token))",
        "heapq.heappush(heap, (negative * share * first, order, child, me, next_token))",
        ("tests/test_suffix_scores.py",)),
    Bug("suffix_correction_counted_as_copy", "suffix decoding: the correction or bonus counted as an accepted copy "
        "in the learned odds", "spec_engine/drafters/suffix.py",
        "accepted = len(committed) - start - 1", "accepted = len(committed) - start", ("tests/test_suffix_scores.py",)),
    Bug("whatif_tree_chain_rows", "What-if: a tree projected with a chain's k + 1 verify rows",
        "spec_engine/classroom/whatif.py", "rows = (tree_nodes or k) + 1", "rows = k + 1",
        ("tests/test_whatif_projection.py",)),
    Bug("whatif_tree_draft_cost_per_node", "What-if: a tree's draft cost divided by nodes instead of levels",
        "spec_engine/classroom/whatif.py", "drafted = sum(draft_length(r) for r in rounds)",
        "drafted = sum(len(r.drafted) for r in rounds)", ("tests/test_whatif_projection.py",)),
    Bug("whatif_batch_verifies_rows_once", "What-if: at batch B a verify adds one sequence's rows, not B x rows",
        "spec_engine/classroom/whatif.py", "verify_per_row=batch * row_seconds(hardware, target) / step",
        "verify_per_row=row_seconds(hardware, target) / step", ("tests/test_whatif_batch.py",)),
    Bug("whatif_bytes_per_weight_ignored", "What-if: every weight read at 2 bytes whatever the precision",
        "spec_engine/classroom/whatif.py", "weights = target.params_b * 1e9 * bytes_per_weight",
        "weights = target.params_b * 1e9 * BYTES_PER_PARAM", ("tests/test_whatif_batch.py",)),
    Bug("sharing_key_ignores_speed_switch", "sharing: the sharing key ignores the speed-measurement switch",
        "ui/playground/handlers.py", "coalesce.COALESCER.join((settings, prep.prompt_ids, auto_baseline), id(state))",
        "coalesce.COALESCER.join((settings, prep.prompt_ids), id(state))", ("tests/test_sharing_keys.py",)),
    Bug("baseline_reused_whenever_busy", "sharing: another session's baseline reused whenever the gate is busy, not "
        "only while others wait", "ui/playground/coalesce.py",
        "return BASELINES.fresh(key, session) if GATE.wait_line() else None",
        "return BASELINES.fresh(key, session) if GATE.busy else None", ("tests/test_sharing_keys.py",)),
    Bug("sampled_baseline_key_ignores_temperature", "sharing: a sampled baseline key ignores the temperature",
        "ui/playground/state.py",
        "return (self.target, prompt_ids, self.temperature, self.top_k, self.top_p, self.seed, self.max_new_tokens)",
        "return (self.target, prompt_ids, 1.0, self.top_k, self.top_p, self.seed, self.max_new_tokens)",
        ("tests/test_sharing_keys.py",)),
    Bug("scenario_link_keeps_page_rule", "a `?scenario=` link keeps the page's rule (strict, typical and wrong-rule "
        "scenarios open as \"exact\")", "ui/playground/share.py", "seed=s.seed, rule=s.rule, chat=s.chat)",
        "seed=s.seed, chat=s.chat)", ("tests/test_scenario_links.py",)),
    Bug("lookup_cost_view_not_reset", "prompt lookup's cost view not reset between runs (its paused rounds carried "
        "over)", "spec_engine/drafters/lookup.py",
        "        self.odds, self.pending = LookupOdds(), None\n        reset_view(self.costs)\n",
        "        self.odds, self.pending = LookupOdds(), None\n", ("tests/test_cost_views.py",)),
    Bug("build_ignores_the_runs_sizing", "a decoder built outside its pinned costs: the build drops the run's sizing "
        "(\"measure again\" sizes by the corrected curve)", "ui/playground/compute.py",
        "drafter = drafts.build_drafter(spec, target, draft, options, sizing=sizing)",
        "drafter = drafts.build_drafter(spec, target, draft, options)", ("tests/test_build_sizing.py",)),
    Bug("make_drafter_pins_nothing", "a decoder built outside its pinned costs: make_drafter pins no sizing",
        "spec_engine/drafters/registry.py", "    pin_sizing(drafter, sizing)\n", "    pin_sizing(drafter, None)\n",
        ("tests/test_cost_views.py",)),
    Bug("measure_again_without_the_records_sizing", "a decoder built outside its pinned costs: \"measure again\" "
        "builds without the record's sizing", "ui/playground/handlers.py",
        "measurement_job(record.settings, prep.prompt_ids, budget, sizing=record.sizing)",
        "measurement_job(record.settings, prep.prompt_ids, budget)",
        ("tests/test_build_sizing.py",)),
)


def copy_checkout(into: Path) -> None:
    """The checkout's tracked and untracked (not ignored) files, as they are on disk, into `into`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def plant(copy: Path, bug: Bug) -> None:
    path = copy / bug.path
    text = path.read_text()
    found = text.count(bug.old)
    if found != 1:
        raise SystemExit(f"{bug.name}: its original text occurs {found} times in {bug.path} (the code moved: "
                         f"update bench/planted_bugs.py)")
    path.write_text(text.replace(bug.old, bug.new))


def run_tests(copy: Path, timeout: int, files: tuple = TEST_FILES, tier: str = "fast") -> dict:
    """pytest over `files` in `copy` (their fast tier's tests, or their default tier's); -> counts, the failed tests'
    ids and the seconds it took."""
    report = copy / "report.xml"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    check = subprocess.run([sys.executable, "-c", "import spec_engine, ui; print(spec_engine.__file__, ui.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True, check=True).stdout
    assert all(Path(p).resolve().is_relative_to(copy.resolve()) for p in check.split()), (
        f"imports outside the copy: {check}")
    tier_options = ["-m", "not slow"] if tier == "fast" else []
    command = [sys.executable, "-m", "pytest", *files, *tier_options, "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", *(f"--deselect={test}" for test in STATISTICAL)]
    start = time.perf_counter()
    try:
        subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"tests": 0, "failed": [], "skipped": 0, "seconds": time.perf_counter() - start, "timeout": True}
    seconds = time.perf_counter() - start
    suite = ET.parse(report).getroot()
    failed, total, skipped = [], 0, 0
    for case in suite.iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f'{case.get("classname").rsplit(".", 1)[-1]}::{case.get("name")}')
        elif case.find("skipped") is not None:
            skipped += 1
    return {"tests": total, "failed": failed, "skipped": skipped, "seconds": seconds, "timeout": False}


def row(label: str, where: str, result: dict, against: str = "") -> str:
    if result["timeout"]:
        return f"| {label} | `{where}` | {against} | timed out | | {result['seconds']:.0f} s | |"
    failed = result["failed"]
    caught = f"**yes** ({len(failed)} failed)" if failed else "**no**"
    names = "; ".join(f"`{name}`" for name in failed[:3]) + (f"; … {len(failed) - 3} more" if len(failed) > 3 else "")
    return (f"| {label} | `{where}` | {against} | {caught} | "
            f"{result['tests'] - len(failed) - result['skipped']} passed, "
            f"{result['skipped']} skipped | {result['seconds']:.0f} s | {names} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="bug names (default: all)")
    parser.add_argument("--out", type=Path, help="write the Markdown here too")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per test run")
    args = parser.parse_args()
    bugs = [bug for bug in BUGS if not args.only or bug.name in args.only]
    assert bugs, f"no bug named {args.only}; known: {[bug.name for bug in BUGS]}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    lines = [
        "# Planted bugs (issues #29, #34, #37 and #63), each against the tests that must catch it",
        "",
        "```bash",
        "nice -n 10 " + " ".join(["python", "-m", "bench.planted_bugs", *sys.argv[1:]]),
        "```",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}{' + uncommitted changes' if dirty else ''}, "
        f"Python {sys.version.split()[0]}, SPEC_ENGINE_ACCEL={os.environ.get('SPEC_ENGINE_ACCEL', '1 (default)')}. "
        "Tests: each row's files, in the fast tier (`-m \"not slow\"`) or the default tier (`pytest`), less the one "
        "chi-square test of test_sampling.py; seeded tests have fixed seeds, so a failure here fails on every run. "
        "Each bug is planted alone in a fresh copy; the unchanged copy runs the fast tier of the first four files.",
        "",
        "| planted bug | edited | tests run | caught? | the other tests | time | failing tests (first 3) |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="planted-") as scratch:
        def run(label: str, bug: Bug | None) -> dict:
            copy = Path(scratch) / (bug.name if bug else "unchanged")
            copy_checkout(copy)
            if bug:
                plant(copy, bug)
            files, tier = (bug.tests, bug.tier) if bug else (TEST_FILES, "fast")
            result = run_tests(copy, args.timeout, files, tier)
            against = f"{tier} tier of " + ", ".join(f"`{Path(f).name}`" for f in files)
            lines.append(row(label, bug.path if bug else "nothing", result, against))
            print(lines[-1], flush=True)
            shutil.rmtree(copy, ignore_errors=True)
            return result
        control = run("none (the unchanged copy)", None)
        if control["failed"] or control["timeout"]:
            lines.append("")
            lines.append("**The unchanged copy does not pass: the rows below say nothing.**")
        for bug in bugs:
            run(bug.what, bug)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
