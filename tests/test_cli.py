"""The command line (`python -m spec_engine`): a JSON run on the offline default whose greedy output equals the
plain-decoding baseline it measures; bad input exits with status 2 and the reason."""
import json

from spec_engine.cli import main


def test_cli_json_run_equals_its_measured_baseline(smollm2, capsys):
    code = main(["--prompt", "Write a haiku about the sea.", "--draft", "eagle+lookup", "--k", "3",
                 "--max-new-tokens", "16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["tokens"] and out["tokens"] == out["baseline"]["tokens"]
    assert len(out["rounds"]) == out["stats"]["rounds"] and out["speedup_vs_plain"] > 0


def test_cli_bad_k_exits_with_the_reason(smollm2, capsys):
    assert main(["--prompt", "hi", "--k", "99"]) == 2
    assert "k (draft tokens per round)" in capsys.readouterr().err
