"""Loading models: packaged GGUF files (dequantized once, then cached as safetensors), local paths and Hub ids.

Two presets ship as GGUF files inside PyPI packages so the playground works with no network; transformers can
only read those by dequantizing the whole file (slow), so the first load writes a plain safetensors copy to a
cache directory and later loads read that instead. No kernel setup happens here: the optional speed layer
adopts a loaded model through the core's seam (spec_engine/core/speed.py).

This module keeps no in-process memo of loaded models: the caller decides how many models stay in memory.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


from spec_engine.core import speed
from spec_engine.paths import cache_root
from spec_engine.models import quantize
from spec_engine.models.presets import (BITSANDBYTES_QUANTIZATIONS, CACHE_MARKER, OFFLINE_HUB_REASON, QUANTIZATIONS,
                                        TORCH_QUANTIZATIONS, _DTYPES, _HUB_ID,
                                        _STALE_TEMP_SECONDS, ModelLoadError, ModelPreset, Progress, _find_spec,
                                        _package_dir, hub_cached, hub_offline_reason, hub_source, list_presets)

# On an accelerator, models of at most this many parameters load in float32 by default (see resolve_dtype).
FP32_MAX_PARAMETERS = 500_000_000

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

    ``quantization``: "bf16" (the whole model in bfloat16, as dtype="bfloat16"), "int8" or "int4" (weight-only, with
    torch's CPU kernels: models/quantize.py, applied after loading; the CPU speed layer's lean forward declines such
    a model, so transformers' modules run it), or bitsandbytes' "8bit" (LLM.int8) and "4bit" (NF4), applied by
    transformers while loading, on CUDA or the CPU.
    ``device_map="auto"`` (accelerate) spreads a directory or hub model that is larger than one GPU over
    the GPUs (then CPU memory); the packaged GGUF presets are small and ignore it.
    ``progress`` receives short stage messages so a UI can show what a slow first
    load is doing. Raises ModelLoadError (a ValueError) when the model is unavailable.
    """
    started = time.perf_counter()
    report = progress or (lambda message: None)
    device = resolve_device(device)
    if dtype is not None:
        dtype = resolve_dtype(dtype, device)
    check_quantization(quantization, device)
    if quantization == "bf16":
        if dtype not in (None, torch.bfloat16):
            raise ValueError(f"quantization='bf16' is the model in bfloat16; it contradicts dtype={dtype}")
        dtype = torch.bfloat16
    if device_map not in (None, "auto"):
        raise ValueError(f"device_map must be None or 'auto', got {device_map!r}")
    bitsandbytes = quantization if quantization in BITSANDBYTES_QUANTIZATIONS else None
    placement = {"quantization": bitsandbytes, "device_map": device_map}
    preset = _find_preset(name_or_path)
    if dtype is None:       # the default: on an accelerator it depends on the model's size (resolve_dtype)
        dtype = resolve_dtype(None, device, None if device.type == "cpu" else parameter_count(name_or_path, preset))
    if preset is not None and preset.kind == "gguf-package" and _packaged_or_offline(preset):
        model, tokenizer, source = _load_packaged(preset, device, dtype, bitsandbytes, report)
    elif preset is not None and preset.kind == "gguf-package":
        report(f"{preset.package} is not installed; loading {preset.hub_id} instead")
        model, tokenizer, source = _load_hub(preset.hub_id, device, dtype, placement, report, preset.gated)
    elif preset is not None:
        model, tokenizer, source = _load_hub(preset.hub_id, device, dtype, placement, report, preset.gated)
    else:
        model, tokenizer, source = _load_path_or_hub(name_or_path, device, dtype, placement, report)
    if quantization in ("int8", "int4"):
        quantize.quantize_(model, quantization)
        report(f"weights quantized to {quantization} (torch's CPU kernels): "
               f"{quantize.weight_bytes_per_token(model) / 2**20:.0f} MB read per token; transformers' modules run "
               "it (the CPU speed layer's lean forward takes nn.Linear layers only)")
    _freeze(model)
    note = speed.use_from_env().adopt(model)   # the environment's speed layer prepares it, if any (core/speed.py)
    if note:
        report(note)
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


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, parameters: int | None = None) -> torch.dtype:
    """`dtype` by name, or the default for `device` and a model of `parameters` parameters: float32 on the CPU (bf16
    products are no faster there without bf16 dot products); on an accelerator float32 for models of
    FP32_MAX_PARAMETERS or less, bfloat16 above (or when the size is not known).

    Why float32 for small models: a greedy speculative run must reproduce plain decoding token for token, the
    playground's lesson. In bf16, verifying k + 1 positions in one forward rounds differently from one-token steps,
    so a near-tie can flip the argmax and the texts part (the red "same text as plain: no"). A model of 0.5B
    parameters or less fits any GPU in float32 and is memory-bound there either way; above that bf16 halves the
    memory, and the UI says that near-ties may differ."""
    if dtype is None:
        if device.type == "cpu":
            return torch.float32
        small = parameters is not None and parameters <= FP32_MAX_PARAMETERS
        return torch.float32 if small else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in _DTYPES:
        return _DTYPES[dtype.strip().lower()]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {', '.join(_DTYPES)}")


def parameter_count(name_or_path: str, preset: ModelPreset | None = None) -> int | None:
    """A model's parameter count before loading it: its preset's `params`, else counted from its config.json (a local
    directory, or the Hub: one small file) on the meta device; None when neither can tell."""
    preset = preset or _find_preset(name_or_path)
    if preset is not None and preset.parameter_count is not None:
        return preset.parameter_count
    source = preset.hub_id if preset is not None else name_or_path
    if not source:
        return None
    path = Path(source).expanduser()
    if path.is_dir():
        source = str(path)
    elif not _HUB_ID.fullmatch(source):
        return None
    local_only = hub_offline_reason() is not None
    if local_only and not path.is_dir() and not hub_cached(source):
        return None
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
        config = AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        return sum(p.numel() for p in model.parameters())
    except Exception:       # unreadable, unknown architecture, offline: no estimate, the caller picks bf16
        return None


def check_quantization(quantization: str | None, device: torch.device) -> None:
    """Refuse an unknown format, or one this device or environment cannot run, early and with what is missing."""
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None, {', '.join(map(repr, TORCH_QUANTIZATIONS))} (torch) or "
                         f"{', '.join(map(repr, BITSANDBYTES_QUANTIZATIONS))} (bitsandbytes), got {quantization!r}")
    if quantization in TORCH_QUANTIZATIONS:
        try:
            quantize.check_kernels(quantization, device)
        except ValueError as exc:
            raise ModelLoadError(f"quantization={quantization!r}: {exc}") from exc
    elif _find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"quantization={quantization!r} needs bitsandbytes, which is not installed: "
                             "pip install bitsandbytes")


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


def _load_hub(hub_id: str, device, dtype, placement: dict, report, gated: bool = False):
    """A Hub id: downloaded (or refreshed) while the Hub is reachable; offline, read from the local Hugging Face cache
    when it holds the model (source "hub-cache:<id>"), else refused with what would work."""
    reason = hub_offline_reason()
    from_cache = reason is not None and hub_cached(hub_id)
    if reason is not None and not from_cache:
        offline = ", ".join(p.name for p in list_presets() if p.offline)
        raise ModelLoadError(
            f"{hub_id} {OFFLINE_HUB_REASON}: {reason}, and the local Hugging Face cache does not hold it. "
            f"Offline presets: {offline}; or pass a local directory holding the model"
        )
    if from_cache:
        report(f"loading {hub_id} from the local Hugging Face cache (the Hub is offline here: {reason})")
    else:
        report(f"loading {hub_id} from the Hugging Face Hub")
    try:
        model, tokenizer = _from_pretrained(hub_id, device, dtype, **placement, use_safetensors=True,
                                            local_files_only=from_cache)
    except OSError as exc:
        hint = (f" ({hub_id} is gated on the Hub: it needs a token (HF_TOKEN) of an account that accepted its "
                "license)") if gated and not from_cache else ""
        where = "the local Hugging Face cache" if from_cache else "the Hugging Face Hub"
        raise ModelLoadError(f"could not load {hub_id} from {where}: {exc}{hint}") from exc
    return model, tokenizer, f"{'hub-cache' if from_cache else 'hub'}:{hub_id}"


def _from_pretrained(source: str, device, dtype, quantization=None, device_map=None,
                     use_safetensors: bool | None = None, local_files_only: bool = False):
    """Load with from_pretrained; hub downloads insist on safetensors so no pickle is ever unpickled.
    `local_files_only`: read the Hugging Face cache, never the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": False, "use_safetensors": use_safetensors,
                              "local_files_only": local_files_only}
    if quantization:
        kwargs.update(quantization_config=_bnb_config(quantization, dtype))
    if quantization or device_map:
        kwargs["device_map"] = device_map or {"": device}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not (quantization or device_map):
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=local_files_only)
    return model, tokenizer


def _bnb_config(quantization: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


# ------------------------------------------------------------- packaged GGUF


def _packaged_or_offline(preset: ModelPreset) -> bool:
    """Use the packaged GGUF when it is installed; without it, the same model loads from its hub id when the local
    Hugging Face cache holds it or the Hub is reachable (a Space), and otherwise locate_gguf says what to install.
    The same decision as presets.load_source, which the UI's availability reads."""
    installed = all(_find_spec(module) is not None for module in preset.modules)
    return installed or not preset.hub_id or hub_source(preset.hub_id, preset.gated)[0] is None


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
        instead = f" (its hub id cannot replace it here: {hub_source(preset.hub_id, preset.gated)[1]})" \
            if preset.hub_id else ""
        raise ModelLoadError(
            f"model {preset.name!r} needs the Python package {missing[0]}, which is not installed. "
            f"Install it with: {preset.install_command}{instead}"
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

    # Measured on two shared cores, the file parsed once (_one_parse_per_file): 0.15 s per MB of GGUF on a busy
    # host (SmolLM2's 105 MB in 16 s, Gemma's 253 MB in 38 s; 19 s and 66 s when transformers parsed it three
    # times); a range, since a busier machine takes the longer end.
    megabytes = gguf.stat().st_size / 1e6
    low, high = (max(10, round(megabytes * rate / 5) * 5) for rate in (0.12, 0.25))
    report(f"dequantizing GGUF {gguf.name} (first start only, {low}-{high} s on two cores; later starts read a cache)")
    with _one_parse_per_file():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    return model, tokenizer


_PARSE_LOCK = threading.Lock()


@contextmanager
def _one_parse_per_file():
    """Within: every `gguf.GGUFReader(path)` for the same file returns one reader, parsed once.

    Why: transformers parses the whole file (`gguf.GGUFReader`, pure Python over every metadata entry) each time it
    reads a config, a tokenizer or the tensors: three times per model here. Gemma-3-270M's 262k-token vocabulary
    makes one parse cost 12-16 s on two cores (42 s of a 66 s first load, measured). Neither library offers a
    shared reader, so this seam hands transformers the same one; the reader is read-only (a memory map), and the
    loaded model is checked equal to its cached copy (tests/test_models.py). Dequantizations run one at a time.
    The swap reaches transformers only through how it imports the reader, so gguf and transformers are pinned
    exactly (tests/test_pins.py)."""
    try:
        import gguf as gguf_package
    except ImportError:         # transformers then says what to install
        yield
        return
    with _PARSE_LOCK:
        real, readers = gguf_package.GGUFReader, {}

        def shared_reader(path, *args, **kwargs):
            key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
            if key not in readers:
                readers[key] = real(path, *args, **kwargs)
            return readers[key]

        gguf_package.GGUFReader = shared_reader
        try:
            yield
        finally:
            gguf_package.GGUFReader = real


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

