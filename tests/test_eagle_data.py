"""The EAGLE head's training prompts: the template set splits by topic, and the prompts the target writes for
itself (`generate --self-prompts`) never mention a held-out topic or a benchmark prompt's subject, so held-out
and benchmark results stay outside the training data. Pure functions plus the offline default's chat template."""
import json

import pytest
import torch

from bench.eagle_prompts import PATH, build, excluded_phrases, held_out_topics
from bench.train_eagle import keep_query, query_prefix
from spec_engine.bench import PROMPTS


def test_shipped_prompt_file_is_the_build_output():
    assert json.loads(PATH.read_text()) == json.loads(json.dumps(build()))


def test_no_training_prompt_mentions_a_held_out_topic():
    topics = held_out_topics()
    assert len(topics) >= 12
    for item in build()["train"]:
        assert not any(t in item["text"] for t in topics), item


def test_every_held_out_and_benchmark_prompt_would_be_excluded():
    excluded = excluded_phrases()
    texts = [p["text"] for p in build()["held_out"]] + [PROMPTS["chat"], PROMPTS["code"]]
    for text in texts:
        assert any(e in text.lower() for e in excluded), text


@pytest.mark.parametrize("text, ended, n_tokens, keep", [
    ("Can you suggest a recipe for a quick vegan dinner?", True, 12, True),
    ("Can you suggest a recipe for a quick vegan dinner?", False, 64, False),       # cut off: not a finished turn
    ("Hi there.", True, 3, False),                                                   # too short
    ("How do I keep my watercolors from bleeding?", True, 11, False),                # held-out topic
    ("Write a function to merge two dictionaries.", True, 9, False),                 # the benchmark's code subject
])
def test_keep_query(text, ended, n_tokens, keep):
    assert keep_query(text, ended, n_tokens, excluded_phrases(), seen=set()) is keep


def test_keep_query_drops_repeats_whatever_their_spacing_and_case():
    seen = {"can you suggest a recipe for a quick vegan dinner?"}
    assert not keep_query("Can you suggest a recipe  for a quick Vegan dinner?", True, 12, [], seen)


def test_query_prefix_ends_where_the_user_turn_begins(smollm2):
    tok = smollm2.tokenizer
    prefix = query_prefix(tok)
    full = smollm2.encode_prompt("Hello there, how are you?")[0].tolist()
    assert full[:len(prefix)] == prefix
    assert tok.decode(prefix).endswith("<|im_start|>user\n")


def test_choose_vocab_keeps_special_ids_then_the_most_frequent_then_fills_by_id():
    from bench.train_eagle import choose_vocab
    samples = [{"tokens": [5, 5, 5, 7, 7, 9], "prompt_len": 2}, {"tokens": [7, 9, 9, 9, 9], "prompt_len": 1}]
    # counts: 9 x5, 7 x3, 5 x3 (a tie, broken by id); 2 is always kept; 0, 1 fill the rest by id
    assert choose_vocab(samples, 4, always=[2], vocab_total=12).tolist() == [2, 5, 7, 9]
    assert choose_vocab(samples, 3, always=[2], vocab_total=12).tolist() == [2, 5, 9]
    assert choose_vocab(samples, 6, always=[2], vocab_total=12).tolist() == [0, 1, 2, 5, 7, 9]


@pytest.mark.parametrize("command", ["generate", "extract", "relayer", "train"])
def test_bad_feature_layers_stop_before_any_compute(command, tmp_path, capsys):
    from bench.train_eagle import main
    extra = {"generate": ["--out", str(tmp_path)], "extract": ["--out", str(tmp_path)],
             "relayer": ["--data", str(tmp_path), "--out", str(tmp_path)], "train": ["--data", str(tmp_path)]}[command]
    with pytest.raises(SystemExit):
        main([command, *extra, "--layers", "15", "2", "-1"])
    assert "feature_layers must be increasing" in capsys.readouterr().err


def test_held_out_prompts_by_kind_are_the_first_of_each_kind_in_file_order():
    from spec_engine.bench import held_out_prompts, prompt_group
    items = build()["held_out"]
    by_kind = held_out_prompts(3, ["chat", "code"])
    assert list(by_kind) == ["held-out-chat-0", "held-out-chat-1", "held-out-chat-2",
                             "held-out-code-0", "held-out-code-1", "held-out-code-2"]
    assert [by_kind[f"held-out-code-{i}"] for i in range(3)] == [p["text"] for p in items if p["kind"] == "code"][:3]
    assert list(held_out_prompts(2).values()) == [p["text"] for p in items[:2]]       # without kinds: file order
    assert held_out_prompts(0, ["chat"]) == {}
    with pytest.raises(ValueError, match="no held-out prompts of kind poetry"):
        held_out_prompts(2, ["chat", "poetry"])
    assert [prompt_group(p) for p in ("held-out-chat-12", "held-out-3", "chat", "summarise")] == \
        ["held-out-chat", "held-out", "chat", "summarise"]


def test_bench_group_summary_gives_the_geometric_mean_of_each_kind():
    from spec_engine.bench import Row, group_summary
    def row(prompt, speedup, acceptance):
        return Row(draft="eagle", temperature=0.0, top_p=1.0, k=3, prompt=prompt, acceptance=acceptance,
                   judged_acceptance=acceptance, accepted_per_round=1.0, tokens_per_forward=2.0, draft_share=0.1,
                   verify_share=0.8, overhead_share=0.1, spec_tok_s=1.0, plain_tok_s=1.0, hf_tok_s=None,
                   speedup_vs_plain=speedup, speedup_vs_hf=None, new_tokens=8, c_target_ms=1.0, c_draft=0.1,
                   c_verify=1.0, predicted_speedup=speedup, realised_over_predicted=1.0)
    rows = [row("chat", 1.5, 0.6), row("held-out-chat-0", 1.0, 0.4), row("held-out-chat-1", 4.0, 0.8),
            row("held-out-code-0", 2.0, 0.5)]
    lines = group_summary(rows).splitlines()
    assert len(lines) == 3                   # header, rule, and held-out-chat only: the others have one prompt each
    assert lines[2] == "| eagle | 0 / 1 | 3 | held-out-chat (2) | 0.60 | 2.00 | **2.00x** | 1.00-4.00x |"
    assert group_summary(rows[:1]) == ""


def test_step_one_hits_count_the_committed_token_against_each_top_j_and_skip_positions_never_reached():
    from bench.eagle_topk import step_one_hits
    sequence = [5, 6, 7, 8]
    step_one = [(1, [6, 9, 10, 11]),        # top-1 hit
                (2, [9, 7, 10, 11]),        # top-2 hit
                (3, [9, 10, 11, 12]),       # miss
                (4, [1, 2, 3, 4])]          # past the end (the run stopped): not counted
    assert step_one_hits(step_one, sequence) == [[True, True, True, True], [False, True, True, True],
                                                 [False, False, False, False]]


def test_round_matches_count_each_rounds_matching_drafts_for_the_chain_and_the_better_branch():
    from bench.eagle_topk import matched, round_matches
    sequence = [1, 2, 3, 4, 5, 6]
    assert matched([3, 4, 9], sequence, 2) == 2 and matched([9], sequence, 2) == 0 and matched([6, 7], sequence, 5) == 1
    branches = [(1, [2, 3, 4], [7, 3, 4]),     # the chain matches all three
                (2, [9, 4, 5], [3, 4, 9]),     # the chain misses at once, the second branch matches two
                (4, [5], [8]),                 # both one draft long
                (6, [7], [7])]                 # past the end (the run stopped): not counted
    assert round_matches(branches, sequence) == [(3, 3), (0, 2), (1, 1)]


def test_self_prompts_also_drop_the_stems_generate_exclude_names(smollm2):
    """`generate --exclude sky` keeps a self-written prompt about the app's default subject out of training, beside
    what `excluded_phrases` drops; without it, the same turn is kept."""
    from bench.train_eagle import self_prompts
    tok = smollm2.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    turns = ["Why is the sky blue in the afternoon?", "How do I bake a simple loaf at home?"]

    class Writer:                  # the target's `generate`, replaced by two finished user turns, over and over
        def generate(self, input_ids, **_):
            rows = [tok.encode(turns[i % 2], add_special_tokens=False) + [end] for i in range(input_ids.shape[0])]
            width = max(map(len, rows))
            return torch.tensor([[*input_ids[0].tolist(), *r, *[end] * (width - len(r))] for r in rows])

    assert self_prompts(Writer(), tok, 2, seed=0, batch=4) == turns
    assert self_prompts(Writer(), tok, 1, seed=0, batch=4, also_excluded=("Sky",)) == turns[1:]
