"""bench/gpu_verify_cost.py's plumbing on the CPU (the GPU check runs it on a lent GPU machine, where a broken script
would cost minutes of a short lease): a tiny random-weight Llama through the engine's forward, the table's rows and
columns, and the What-if projection column computed from the ridge the arguments give. Never its timings."""
import json
from types import SimpleNamespace

import pytest

from bench import gpu_verify_cost
from spec_engine import bench


@pytest.fixture
def tiny_shape(monkeypatch):
    monkeypatch.setitem(bench.RANDOM_SIZES, "tiny", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                         num_attention_heads=4, num_key_value_heads=2,
                                                         tie_word_embeddings=True))
    monkeypatch.setattr(bench, "random_tokenizer", lambda: SimpleNamespace(bos_token_id=1, eos_token_id=2))


def test_the_table_has_a_row_per_token_count_and_the_roofline_beside_it(tiny_shape, tmp_path):
    out = tmp_path / "verify-cost"
    gpu_verify_cost.main(["--device", "cpu", "--models", "random-tiny:float32", "--tokens", "1", "3", "9",
                          "--context", "16", "--repeats", "2", "--bandwidth", "1000", "--tflops", "100",
                          "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["meta"]["ridge_rows"] == pytest.approx(100.0)            # 100e12 * 2 / (2 * 1000e9)
    (model,) = record["models"]
    assert model["model"] == "random-tiny" and model["dtype"] == "float32" and model["weights_gb"] > 0
    assert [row["tokens"] for row in model["rows"]] == [1, 3, 9]
    assert model["rows"][0]["vs_one"] == 1.0 and all(row["ms"] > 0 for row in model["rows"])
    table = out.with_suffix(".md").read_text().splitlines()
    assert table[0] == "| tokens per forward | random-tiny float32 | What-if projection |"
    assert [line.split("|")[-2].strip() for line in table[2:5]] == ["1.00", "1.02", "1.08"]   # 1 + (n - 1) / 100
    assert "What-if tab's v(n) = 1 + (n - 1) / 100" in out.with_suffix(".md").read_text()
