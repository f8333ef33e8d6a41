"""The EAGLE head's training prompts: the template set splits by topic, and the prompts the target writes for
itself (`generate --self-prompts`) never mention a held-out topic or a benchmark prompt's subject, so held-out
and benchmark results stay outside the training data. Pure functions plus the offline default's chat template."""
import json

import pytest

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
