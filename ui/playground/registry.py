"""Process-wide model registry: which models are loaded, their memory, availability and warm-up (the draft
catalogue is drafts.py).

Models are loaded once per process (one entry per name, loading in a background thread so a handler can
stream progress, one load at a time; on ZeroGPU all of them at start-up on the main thread, see `preload`) and
then shared read-only by every session: runs never write to a model,
and each run builds its own drafter (drafters hold one run's caches). This is the only process-wide state of
the UI.

Memory is bounded: besides the pinned default target, at most `Limits.max_extra_models` models stay loaded;
the least recently used idle one is dropped to make room. A run holds the models it uses (`acquire` /
`release`), and a held model is never dropped, so a switch of model in one session never pulls a model from
under another session's generation. Before a load, the free memory is compared with an estimate of the
model's size (its parameter count), and a clear error replaces an out-of-memory crash.
 A draft choice value is
a draft name as the engine spells it. Adding a drafter touches the engine only: its module and one registration.
"""
from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import spec_engine as se

from ui.playground import limits
from ui.views.tokens import TokenLabeler

log = logging.getLogger("ui.playground.registry")

PRELOAD_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
MEMORY_HEADROOM = 512 * 2**20     # bytes left free after a load (activations, caches, the OS)
MEMORY_FACTOR = 1.5               # peak while loading / weights (GGUF dequantizing, temporary copies)


class ModelCapacityError(ValueError):
    """Every slot for an extra model is taken by a model in use: try again when a run ends."""


class ModelMemoryError(ValueError):
    """Not enough free memory to load a model (checked before loading, instead of crashing)."""


def preset_names() -> list[str]:
    return [p.name for p in se.list_presets()]


def check_target_name(name: str) -> str | None:
    return None if name in preset_names() else f"must be a model preset ({', '.join(preset_names())}), got {name!r}"


def display_name(name: str) -> str:
    try:
        return se.resolve_preset(name).display_name
    except ValueError:
        return name


def tokenizer_family(name: str) -> str | None:
    """The preset's tokenizer family (presets of one family share token ids); None for custom models."""
    try:
        return se.resolve_preset(name).tokenizer_family
    except ValueError:
        return None


def short_name(name: str) -> str:
    """A preset's display name without its parenthesis: 'Gemma 3 270M', 'SmolLM2 135M Instruct'."""
    return display_name(name).split(" (")[0]


def availability(name: str) -> tuple[bool, str]:
    """Whether `name` loads here, and why: the engine's answer (spec_engine.se.load_source), which agrees with
    its loader; custom Hub ids only where the server allows them."""
    if REGISTRY.loaded(name) is not None:        # in memory: nothing to install or download
        return True, "loaded"
    if REGISTRY.closed:
        return False, "this server serves only the models it loaded at start-up"
    if name not in preset_names():
        if not limits.current().allow_custom_models:
            return False, "not a preset, and custom models are switched off on this server"
        source, why = se.hub_source(name)
        if source is None:
            return False, f"{se.OFFLINE_HUB_REASON}: {se.hub_offline_reason()}"
        return True, why
    try:
        return se.is_offline_available(name)
    except ValueError as exc:
        return False, str(exc)


# The tokenizer-mismatch demo's different-tokenizer draft, in order of preference: Gemma 3 where its package (or the
# Hugging Face cache) has it, else GPT-2, which is not gated on the Hub (a Space installs no model package and
# usually has no HF_TOKEN).
MISMATCH_DRAFT_MODELS = ("gemma-3-270m", "gpt2")


def mismatch_draft_model() -> str:
    """The first of MISMATCH_DRAFT_MODELS that loads without a download, else the first a download gives (not gated
    first), else the first (its load then says what is missing)."""
    sources = {name: se.load_source(name)[0] for name in MISMATCH_DRAFT_MODELS}
    local = [name for name in MISMATCH_DRAFT_MODELS if sources[name] in ("package", "hub-cache")]
    download = sorted((name for name in MISMATCH_DRAFT_MODELS if sources[name] == "hub"),
                      key=lambda name: se.resolve_preset(name).gated)
    return (local or download or list(MISMATCH_DRAFT_MODELS))[0]


# ----------------------------------------------------------------------------------------- memory

def parse_params(text: str) -> int | None:
    """'135M' -> 135_000_000, '1.7B' -> 1_700_000_000; None when the preset does not say."""
    return se.parse_parameter_count(text)


@functools.lru_cache(maxsize=64)
def parameter_count(name: str) -> int | None:
    """From the preset's `params`; for a custom Hub id, from its safetensors header (best effort)."""
    try:
        return parse_params(se.resolve_preset(name).params)
    except ValueError:
        pass
    try:
        from huggingface_hub import get_safetensors_metadata
        return int(sum(get_safetensors_metadata(name).parameter_count.values()))
    except Exception:   # offline, gated, no safetensors: no estimate, the load itself still guards
        return None


def free_memory_bytes(device) -> int | None:
    """Free memory where the weights will live: the GPU's (`device` is a CUDA device), else the system's available
    RAM. The registry passes the device it loads to, resolved (None there means CUDA when present)."""
    import torch
    if device is not None and torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GB"


def target_choices() -> list[tuple[str, str]]:
    """Every preset; those that cannot load here say why in their label (picking one warns and reverts)."""
    choices = []
    for preset in se.list_presets():
        ok, reason = availability(preset.name)
        choices.append((preset.display_name if ok else f"{preset.display_name} — unavailable: {reason}", preset.name))
    return choices


@dataclass
class _Loading:
    thread: threading.Thread | None
    done: threading.Event
    message: str = "queued"
    started: float = 0.0
    result: object = None
    error: BaseException | None = None
    holds: int = 0              # runs using the model now: never dropped while > 0
    last_used: float = 0.0      # time.monotonic() of the latest use, for least-recently-used eviction

    @property
    def ready(self) -> bool:
        return self.done.is_set() and self.error is None and self.result is not None


class ModelRegistry:
    """Loads each model once per process and hands the same read-only LoadedModel to every session.

    `pinned` models (the default target, and models handed in with `put`) are never dropped; at most
    `max_extra` others stay loaded (None: `limits.current().max_extra_models`, read at each load).
    `free_memory(device)` and `estimate(name)` (bytes) are injectable for tests.
    """

    def __init__(self, loader=None, device=None, dtype=None, pinned=None, max_extra: int | None = None,
                 free_memory: Callable | None = None, estimate: Callable[[str], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._loader = loader or se.load_model
        self._device, self._dtype = device, dtype       # None: load_model's defaults (see `place`)
        self._lock = threading.Lock()
        self._load_gate = threading.Lock()          # one load at a time: memory is measured between loads
        self._loading: dict[str, _Loading] = {}
        self._labelers: dict[str, TokenLabeler] = {}
        self._pinned = set(pinned if pinned is not None else [se.default_model_name()])
        self._max_extra = max_extra
        self._free_memory = free_memory or free_memory_bytes
        self._estimate = estimate or self.estimate_bytes
        self._closed = False                        # after `preload`: nothing more is loaded
        self._clock = clock                         # last_used and idle unloading read it
        self._reaper: threading.Thread | None = None

    # ---- placement

    def place(self, device: str | None = None, dtype: str | None = None) -> None:
        """Where and in what dtype models load (app.py's --device / --dtype, SPEC_DEVICE / SPEC_DTYPE), before the
        first load. None keeps load_model's default: CUDA when present, else the CPU; float32 on the CPU and for
        models of 0.5B parameters or less, bfloat16 above. Both are checked here, so a typo fails at start-up."""
        device_checked = se.resolve_device(device)
        if dtype is not None:
            se.resolve_dtype(dtype, device_checked)
        self._device, self._dtype = device, dtype

    def load_device(self):
        """The torch.device models load to (the configured one, else CUDA when present, else the CPU)."""
        return se.resolve_device(self._device)

    # ---- loading

    def start(self, name: str) -> _Loading:
        """Begin loading `name` in the background (no-op if it is loading or loaded). Raises
        ModelCapacityError when every slot for an extra model is held by a running generation."""
        with self._lock:
            entry = self._loading.get(name)
            if (entry is None or entry.error is not None) and self._closed:
                raise ModelCapacityError(f"This server serves only the models it loaded at start-up "
                                         f"({', '.join(map(display_name, self.loaded_names()))}); "
                                         f"{display_name(name)} is not one of them.")
            if entry is None or entry.error is not None:
                if name not in self._pinned:
                    self._make_room(name)
                done = threading.Event()
                entry = _Loading(threading.Thread(target=self._load, args=(name,), daemon=True,
                                                  name=f"load-{name}"), done, started=time.perf_counter())
                self._loading[name] = entry
                entry.thread.start()
                if name not in self._pinned:
                    self._start_reaper()
            entry.last_used = self._clock()
            return entry

    def preload(self, names: list[str]) -> None:
        """Load `names` now, in the calling thread, pinned; then load nothing more (`start` refuses other models).
        For ZeroGPU (compute.py): its emulation of CUDA on the main process works on the main thread only, so the
        models must be loaded there at start-up (app.py), never in the registry's background thread; nothing is
        computed on that process, so there is no memory check on a GPU it does not hold and no warm-up."""
        for name in names:
            self._pinned.add(name)
            self._loading[name] = _Loading(None, threading.Event(), started=time.perf_counter())
            self._load(name, startup=True)
            if self._loading[name].error is not None:
                raise self._loading[name].error
        self._closed = True

    @property
    def closed(self) -> bool:
        """True once `preload` has run: no other model will load."""
        return self._closed

    def _load(self, name: str, startup: bool = False) -> None:
        entry = self._loading[name]

        warms = not startup          # the loader's last word is "ready in N s", but a warm-up follows it

        def progress(message: str) -> None:
            if warms and message.startswith("ready in "):
                message = f"weights loaded in {message.removeprefix('ready in ')}; warming up next (not ready yet)"
            entry.message = message
            log.info("%s: %s", name, message)

        try:
            if Path(name).expanduser().exists() and name not in self._pinned and not _is_preset(name):
                raise ValueError(f"{name!r} is not a preset; the app does not load models from local paths")
            entry.message = "waiting for another model to finish loading"
            with self._load_gate:
                if not startup:
                    self._check_memory(name)
                loaded = self._loader(name, device=self._device, dtype=self._dtype, progress=progress)
                warm_started = time.perf_counter()
                if not startup:
                    warm_up(loaded, prepack=name in self._pinned, progress=progress)
                if name in self._pinned and hasattr(loaded, "encode_prompt") and not startup:
                    warm_up_default_run(loaded, progress)
                warm_seconds = time.perf_counter() - warm_started
            entry.result = loaded
            took = f"loaded in {loaded.load_seconds:.1f} s" + (f", warmed up in {warm_seconds:.1f} s" if warms else "")
            entry.message = f"ready ({loaded.device}, {str(loaded.dtype).removeprefix('torch.')}; {took})"
            log.info("%s: %s, %.1f s after it started loading", name, entry.message,
                     time.perf_counter() - entry.started)
        except BaseException as exc:   # reported to whoever waits; the next call retries
            entry.error = exc
            entry.message = f"failed: {exc}"
            log.warning("loading %s failed: %s", name, exc)
        finally:
            entry.done.set()

    def put(self, loaded, pin: bool = True) -> None:
        """Register an already loaded model under its name (tests share their session's model this way)."""
        done = threading.Event()
        done.set()
        with self._lock:
            if pin:
                self._pinned.add(loaded.name)
            self._loading[loaded.name] = _Loading(None, done, message=f"ready ({loaded.device}, preloaded)",
                                                  started=time.perf_counter(), result=loaded,
                                                  last_used=self._clock())

    def loaded(self, name: str):
        entry = self._loading.get(name)
        return entry.result if entry is not None and entry.done.is_set() else None

    def status(self, name: str) -> str:
        entry = self._loading.get(name)
        if entry is None:
            return "not loaded"
        if not entry.done.is_set():
            return f"loading: {entry.message} ({time.perf_counter() - entry.started:.0f} s)"
        return entry.message

    def wait(self, name: str, poll: float = 0.5) -> Iterator[str]:
        """Yield progress messages while `name` loads; the loaded model is the generator's return value.
        Raises what the loader raised. The model is not held: see `acquire`."""
        entry = self.start(name)
        while not entry.done.wait(poll):
            yield f"Loading {display_name(name)}: {entry.message} ({time.perf_counter() - entry.started:.0f} s)"
        if entry.error is not None:
            raise entry.error
        return entry.result

    def acquire(self, name: str, poll: float = 0.5) -> Iterator[str]:
        """Like `wait`, and the model is held (never dropped) until `release(name)`."""
        while True:
            result = yield from self.wait(name, poll)
            with self._lock:
                entry = self._loading.get(name)
                if entry is not None and entry.result is result and entry.ready:
                    entry.holds += 1
                    entry.last_used = self._clock()
                    return result
            # dropped between loading and holding (another session needed the room): load it again

    def release(self, name: str) -> None:
        with self._lock:
            entry = self._loading.get(name)
            if entry is not None and entry.holds > 0:
                entry.holds -= 1
                entry.last_used = self._clock()

    def holds(self, name: str) -> int:
        entry = self._loading.get(name)
        return 0 if entry is None else entry.holds

    def loaded_names(self) -> list[str]:
        return [name for name, entry in list(self._loading.items()) if entry.ready]

    def get(self, name: str):
        """Blocking load (for scripts and tests)."""
        gen = self.wait(name)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def labeler(self, loaded) -> TokenLabeler:
        with self._lock:
            labeler = self._labelers.get(loaded.name)
            if labeler is None or labeler.tokenizer is not loaded.tokenizer:
                labeler = self._labelers[loaded.name] = TokenLabeler(loaded.tokenizer)
            return labeler

    # ---- bounds

    @property
    def max_extra(self) -> int:
        return limits.current().max_extra_models if self._max_extra is None else self._max_extra

    def _extras(self) -> list[str]:
        return [n for n, e in self._loading.items() if n not in self._pinned and e.error is None]

    def _idle_extra(self, keep: str) -> str | None:
        """The least recently used extra model that is loaded and not held (None if there is none)."""
        idle = [(e.last_used, n) for n, e in self._loading.items()
                if n != keep and n not in self._pinned and e.ready and e.holds == 0]
        return min(idle)[1] if idle else None

    def _make_room(self, name: str) -> None:
        """Under the lock: drop idle extras until one more fits within max_extra, or say why it cannot."""
        while len(self._extras()) >= self.max_extra:
            victim = self._idle_extra(keep=name)
            if victim is None:
                if self.max_extra == 0:
                    raise ModelCapacityError(f"This server serves only its default model; {display_name(name)} "
                                             "cannot be loaded here (SPEC_MAX_EXTRA_MODELS=0).")
                busy = ", ".join(display_name(n) for n in self._extras())
                raise ModelCapacityError(
                    f"Busy: this server keeps at most {self.max_extra} extra model(s) loaded and all are in use by "
                    f"running generations ({busy}). Try {display_name(name)} again when they finish.")
            self._evict(victim, "to make room for " + name)

    def drop_idle(self) -> list[str]:
        """Unload every model besides the pinned ones that no run holds and none has used for
        limits.idle_unload_seconds (issue #36: a teacher's whole lesson left 5.7 GB of RSS, 2.6 GB after start);
        returns their names."""
        idle = limits.current().idle_unload_seconds
        with self._lock:
            now = self._clock()
            names = [n for n, e in self._loading.items()
                     if n not in self._pinned and e.ready and e.holds == 0 and now - e.last_used >= idle]
            for name in names:
                self._evict(name, f"idle for {idle:g} s")
        return names

    def _start_reaper(self) -> None:
        """Under the lock: a daemon thread that calls drop_idle a few times per idle period, while extras exist."""
        if self._reaper is not None and self._reaper.is_alive():
            return

        def reap():
            while self._extras():
                time.sleep(max(1.0, limits.current().idle_unload_seconds / 4))
                self.drop_idle()
        self._reaper = threading.Thread(target=reap, daemon=True, name="unload-idle-models")
        self._reaper.start()

    def _check_memory(self, name: str) -> None:
        """In the loading thread, under the load gate: drop idle extras while memory is short; raise if still."""
        needed = self._estimate(name)
        if needed is None:
            return
        device = self.load_device()         # the memory the weights will take: the GPU's when loading to CUDA
        while True:
            free = self._free_memory(device)
            if free is None or free - MEMORY_HEADROOM >= needed:
                return
            with self._lock:
                victim = self._idle_extra(keep=name)
                if victim is None:
                    loaded = ", ".join(display_name(n) for n in self.loaded_names()) or "none"
                    raise ModelMemoryError(
                        f"Not enough memory to load {display_name(name)}: it needs about {gib(needed)} and "
                        f"{gib(max(free, 0))} is free. Try again later, or use a model that is already loaded "
                        f"({loaded}).")
                self._evict(victim, f"memory is short for {name}")

    def _evict(self, name: str, why: str) -> None:
        """Under the lock. The registry lets go of the model; sessions still holding a reference keep it
        alive until they finish (so nothing in use is freed), then Python frees it."""
        entry = self._loading.pop(name)
        self._labelers.pop(name, None)
        entry.result = None
        log.info("dropped %s (least recently used, idle): %s", name, why)
        gc.collect()
        trim_heap()
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def estimate_bytes(self, name: str) -> int | None:
        """Memory a load of `name` needs: parameters x bytes per parameter (of the dtype it will load in) x
        MEMORY_FACTOR."""
        params = parameter_count(name)
        if params is None:
            return None
        dtype = se.resolve_dtype(self._dtype, self.load_device(), params)
        return int(params * dtype.itemsize * MEMORY_FACTOR)


def trim_heap() -> None:
    """Give freed heap pages back to the system (glibc's malloc_trim), so that RSS falls once a model is
    dropped; nothing elsewhere."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _is_preset(name: str) -> bool:
    return name in preset_names()


WARM_UP_PROMPT = "Warm-up: one two three, one two three, one two"
WARM_UP_TOKENS = 12


def warm_up(loaded, prepack: bool = False, progress: Callable[[str], None] = lambda message: None) -> None:
    """One short forward so the first measured run does not pay for lazy initialisation; with `prepack` (the
    pinned default target, which verifies every run) also the packed CPU weights of batched verification, the
    costs of forwards over many sequences (batches of students' runs) and the verify-cost curve that sizes every
    cost-sized draft (a few seconds each, measured once).

    The curve is measured last. A visitor's browser on this machine loads the page while the app warms up (about
    a core for 4 s: the page and its scripts), and a curve measured then read dearer: 8 rows at 1.21-1.26 one-row
    forwards against 1.04 once the page has loaded, and the first runs drafted smaller trees (34-35 rounds for the
    default prompt against 31)."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([PRELOAD_PROMPT], dtype=torch.long, device=loaded.device)
        loaded.model(input_ids=ids)
    if not (prepack and isinstance(loaded.model, torch.nn.Module)):
        return
    progress("warming up (once): packing weights")
    se.prepare(loaded.model, curve=False)
    from ui.playground import batching          # it builds on this module
    if batching.enabled():
        progress("warming up (once): timing forwards of many sequences at once, for batches of students' runs")
        batching.batch_costs(loaded.model)
    progress("warming up (once): measuring the verify-cost curve")
    se.prepare(loaded.model)
    sizing = se.startup_sizing(loaded.model)
    if sizing is not None:         # what sizes every draft until timed rounds correct it: worth a line in the log
        log.info("%s: verify cost by rows 1-%d, in one-row forwards: %s (%s)", getattr(loaded, "name", "the target"),
                 len(sizing.costs) - 1, " ".join(f"{c:.2f}" for c in sizing.costs[1:]), sizing.source)


def warm_up_default_run(loaded, progress: Callable[[str], None] = lambda message: None) -> None:
    """The default draft's whole path once, greedy and sampled, and plain decoding: whatever is made lazily on
    first use (packed weights, compiled kernels and searches, the draft's own packing) is made here, at load."""
    from ui.playground import drafts          # the draft catalogue reads this module (availability, presets)
    draft, k = drafts.default_draft(loaded.name)
    kind, spec = drafts.split_draft(draft)
    if kind.needs_model:
        return
    progress(f"warming up (once): a short {draft} run and plain decoding")
    prompt = loaded.encode_prompt(WARM_UP_PROMPT, chat=False)
    for sampling in (se.SamplingParams(temperature=0.0), se.SamplingParams(temperature=0.7, top_p=0.9)):
        decoder = se.SpeculativeDecoder(loaded.model, drafts.build_drafter(spec, loaded, None, drafts.DraftOptions()))
        with se.not_observed(loaded.model):     # first uses: their times would skew the verify-cost curve
            decoder.generate(prompt, k=k, max_new_tokens=WARM_UP_TOKENS, sampling=sampling)
            se.autoregressive_generate(loaded.model, prompt, max_new_tokens=4, sampling=sampling)
    progress("warmed up")


def eos_ids(loaded):
    """The ids that end generation: the generation config's (chat models end turns with their own token)."""
    config = getattr(loaded.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return eos


REGISTRY = ModelRegistry()
