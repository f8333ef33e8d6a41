"""bench/gpu_static.py's plumbing on the CPU (the GPU check runs it on a lent GPU machine, where a broken script
would cost minutes of a short lease): a tiny random-weight Llama, eager and on the static path's fixed-shape
forwards (the CPU's fallback for captured graphs), the verify rows, both drafts, the tables. Never its timings."""
import json

from test_gpu_verify_cost import tiny_shape  # noqa: F401  (the fixture: a tiny random-weight Llama shape)

from bench import gpu_static


def test_every_measurement_has_its_row_and_the_paths_agree_in_fp32(tiny_shape, tmp_path):
    out = tmp_path / "static"
    gpu_static.main(["--device", "cpu", "--models", "random-tiny:float32", "--tokens", "6", "--rows", "1", "3",
                     "--context", "16", "--repeats", "1", "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())
    (model,) = record["models"]
    assert model["model"] == "random-tiny" and model["dtype"] == "float32" and model["weights_gb"] > 0
    assert model["same_tokens"] is True                              # fp32: the fixed-shape path is exact
    assert set(model["plain"]) == {"eager", "captured"}
    assert all(p["tok_s"] > 0 and p["gb_s"] > 0 for p in model["plain"].values())
    assert [v["rows"] for v in model["verify"]] == [1, 3] and model["verify"][0]["vs_one"] == 1.0
    assert set(model["drafts"]) == {"prompt-lookup", "eagle (random head)"}
    assert model["drafts"]["prompt-lookup"]["tokens_per_forward"] >= 1
    text = out.with_suffix(".md").read_text()
    assert "| captured |" in text and "| prompt-lookup |" in text and "random-tiny float32" in text
