"""The command line (`python -m spec_engine`): a JSON run on the offline default whose greedy output equals the
plain-decoding baseline it measures; bad input exits with status 2 and the reason."""
import json

from spec_engine import RoundEvent, acceptance_by_position
from spec_engine.cli import main, parse_args


def test_cli_json_run_equals_its_measured_baseline(smollm2, capsys):
    code = main(["--prompt", "Write a haiku about the sea.", "--draft", "eagle+lookup", "--k", "3",
                 "--max-new-tokens", "16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["tokens"] and out["tokens"] == out["baseline"]["tokens"]
    assert len(out["rounds"]) == out["stats"]["rounds"] and out["speedup_vs_plain"] > 0
    rounds = [RoundEvent.from_dict(r) for r in out["rounds"]]
    assert out["stats"]["acceptance_by_position"] == acceptance_by_position(rounds)
    assert [p["token"] for p in out["provenance"]] == out["tokens"]
    assert {p["kind"] for p in out["provenance"]} <= {"draft", "correction", "bonus"}


def test_cli_bad_k_exits_with_the_reason(smollm2, capsys):
    assert main(["--prompt", "hi", "--k", "99"]) == 2
    assert "k (draft tokens per round)" in capsys.readouterr().err


def test_device_and_dtype_come_from_the_environment_then_the_flags(monkeypatch):
    monkeypatch.delenv("SPEC_DEVICE", raising=False)
    monkeypatch.delenv("SPEC_DTYPE", raising=False)
    args = parse_args(["--prompt", "hi"])
    assert (args.device, args.dtype) == (None, None)              # load_model's defaults (fp32 up to 0.5B on a GPU)
    monkeypatch.setenv("SPEC_DEVICE", "cuda:1")
    monkeypatch.setenv("SPEC_DTYPE", "bfloat16")
    assert vars(parse_args(["--prompt", "hi"]))["device"] == "cuda:1"
    args = parse_args(["--prompt", "hi", "--device", "cpu", "--dtype", "float32"])
    assert (args.device, args.dtype) == ("cpu", "float32")


def test_cli_json_run_reports_where_it_ran(smollm2, capsys, monkeypatch):
    monkeypatch.setenv("SPEC_DTYPE", "float32")
    assert main(["--prompt", "Say hi.", "--max-new-tokens", "4", "--no-baseline", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["placement"] == {"device": "cpu", "dtype": "float32"}


def test_quantization_reaches_load_model_and_unknown_formats_are_refused(monkeypatch, capsys):
    import pytest
    from spec_engine import cli
    asked = {}

    def fake_load(*args, **kwargs):
        asked.update(kwargs)
        raise ValueError("stopped after load_model was asked")
    monkeypatch.setattr(cli, "load_model", fake_load)
    assert main(["--prompt", "hi", "--quantization", "int4"]) == 2
    assert asked["quantization"] == "int4" and "stopped after load_model" in capsys.readouterr().err
    assert parse_args(["--prompt", "hi"]).quantization is None
    with pytest.raises(SystemExit):
        parse_args(["--prompt", "hi", "--quantization", "int3"])
