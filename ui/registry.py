"""Process-wide model registry and the draft catalogue.

Models are loaded once per process (one lock per name, loading in a background thread so a handler can
stream progress) and then shared read-only by every session: runs never write to a model, and each run
builds its own drafter (drafters hold one run's caches). This is the only process-wide state of the UI.

Drafts are data: `DRAFT_KINDS` lists what can draft, and a draft choice value is "<kind>" or
"<kind>:<preset>". Adding a draft source (e.g. a trained EAGLE-style head) is one more `DraftKind`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import spec_engine as se

from .tokens import TokenLabeler

log = logging.getLogger("ui.registry")

PRELOAD_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def default_skip_layers() -> list[int]:
    """The engine's layer-skip set (measured on the offline default by bench/choose_skip_layers.py)."""
    return list(se.DEFAULT_SKIP_LAYERS)


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """'3, 5-9' -> [3, 5, 6, 7, 8, 9]; ValueError with the reason otherwise."""
    layers: set[int] = set()
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start, stop = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"layers to skip: {part!r} is not a layer number or a range like 5-9") from None
        if start > stop:
            raise ValueError(f"layers to skip: range {part!r} runs backwards")
        layers.update(range(start, stop + 1))
    bad = sorted(i for i in layers if not 0 < i < n_layers)
    if bad:
        raise ValueError(f"layers to skip must lie in [1, {n_layers - 1}] (layer 0 always runs); got {bad}")
    if len(layers) >= n_layers - 1:
        raise ValueError(f"layers to skip: keep at least two of the {n_layers} layers")
    return sorted(layers)


@dataclass(frozen=True)
class DraftOptions:
    skip_layers: str = ""   # layer-skip: "" = the default set
    exit_after: int = 0     # early exit: 0 = the engine's default depth


@dataclass(frozen=True)
class DraftKind:
    key: str                                     # the draft mode of spec_engine.factory (MODES)
    label: str                                   # shown in the draft dropdown ({draft} = draft display name)
    lesson: str                                  # one sentence: what this draft teaches
    build: Callable[..., se.Drafter]             # build(spec, target, draft_or_None, options) -> Drafter
    needs_model: bool = False                    # the draft name names a draft preset
    available: Callable[[str], tuple[bool, str]] = lambda target: (True, "")   # for self drafts: by target name


def build_layer_skip(spec, target, _draft, options: DraftOptions):
    if not options.skip_layers.strip():
        return se.make_drafter(spec, target)
    return se.LayerSkipDrafter(target.model, parse_layers(options.skip_layers, len(target.model.model.layers)))


def build_early_exit(spec, target, _draft, options: DraftOptions):
    n_layers = len(target.model.model.layers)
    exit_after = options.exit_after or spec.arg
    if exit_after and not 1 <= exit_after < n_layers:
        raise ValueError(f"early exit: exit after 1 to {n_layers - 1} of the target's {n_layers} layers, got {exit_after}")
    return se.make_drafter(se.DraftSpec("early-exit", None, exit_after or None), target)


def build_from_factory(spec, target, draft, _options):
    return se.make_drafter(spec, target, draft)


def eagle_available(target: str) -> tuple[bool, str]:
    """The shipped EAGLE head drafts for the model it was trained on (its JSON record names it)."""
    import json
    try:
        from spec_engine import eagle
        record = json.loads(eagle.DEFAULT_WEIGHTS.with_suffix(".json").read_text(encoding="utf-8"))
    except (ImportError, AttributeError, OSError, ValueError):
        return False, "no trained EAGLE head ships with this version"
    trained_for = record.get("target")
    if trained_for != target:
        return False, f"the shipped head was trained for {trained_for}"
    return True, ""


# Draft values are spelled as spec_engine.factory and presets/models.yaml spell them: "layer-skip",
# "early-exit[:N]", "prompt-lookup[:N]", "<preset>", "<preset>:cross-tokenizer", "<preset>:naive-ids".
DRAFT_KINDS: list[DraftKind] = [
    DraftKind("layer-skip", "Layer-skip self-draft (the target minus some layers)",
              "The target drafts for itself with some layers skipped: no second model, shared weights.",
              build_layer_skip),
    DraftKind("early-exit", "Early-exit self-draft (first layers + the LM head)",
              "The lesson: the final LM head reads mid-network features poorly, so without a trained exit head "
              "acceptance collapses.", build_early_exit),
    DraftKind("prompt-lookup", "Prompt lookup (copy n-grams from the context)",
              "No model at all: propose what followed the last n tokens earlier in the text; shines when the "
              "answer copies the prompt.", build_from_factory),
    DraftKind("eagle", "EAGLE head (trained on the target's features)",
              "A one-layer head trained to predict the target's next features from its own last layer: cheap "
              "drafts that read the target's hidden state.", build_from_factory, available=eagle_available),
    DraftKind("same-tokenizer", "Separate draft model: {draft}",
              "A smaller model with the same tokenizer drafts; the classic pairing.", build_from_factory,
              needs_model=True),
    DraftKind("cross-tokenizer", "Cross-tokenizer draft: {draft}",
              "A draft with another tokenizer: its text is decoded and re-encoded with the target's tokenizer.",
              build_from_factory, needs_model=True),
    DraftKind("naive-ids", "Naive-id draft (tokenizer mismatch): {draft}",
              "The mistake: another tokenizer's ids passed to the target as if they were its own.",
              build_from_factory, needs_model=True),
]
KINDS_BY_KEY = {kind.key: kind for kind in DRAFT_KINDS}


def split_draft(value: str):
    """A draft name -> (DraftKind, DraftSpec); ValueError for a malformed name or a mode the UI lacks."""
    spec = se.parse_draft(value)
    kind = KINDS_BY_KEY.get(spec.mode) if spec.mode in engine_modes() else None
    if kind is None:
        raise ValueError(f"draft mode {spec.mode!r} has no entry in the playground's draft list")
    return kind, spec


def preset_names() -> list[str]:
    return [p.name for p in se.list_presets()]


def check_draft_value(value: str) -> str | None:
    """None if `value` is a usable draft name, else the reason (for validating scenarios and inputs)."""
    try:
        _, spec = split_draft(value)
    except ValueError as exc:
        return str(exc)
    if spec.model is not None and spec.model not in preset_names():
        return f"names an unknown model preset {spec.model!r} (known: {', '.join(preset_names())})"
    return None


def check_target_name(name: str) -> str | None:
    return None if name in preset_names() else f"must be a model preset ({', '.join(preset_names())}), got {name!r}"


def display_name(name: str) -> str:
    try:
        return se.resolve_preset(name).display_name
    except ValueError:
        return name


def availability(name: str) -> tuple[bool, str]:
    from spec_engine import models
    try:
        return models.is_offline_available(name)
    except ValueError as exc:
        return False, str(exc)


def target_choices() -> list[tuple[str, str]]:
    """Every preset; those that cannot load here say why in their label (picking one warns and reverts)."""
    choices = []
    for preset in se.list_presets():
        ok, reason = availability(preset.name)
        choices.append((preset.display_name if ok else f"{preset.display_name} — unavailable: {reason}", preset.name))
    return choices


def engine_modes() -> tuple[str, ...]:
    from spec_engine import factory
    return tuple(factory.MODES)


def draft_choices(target: str) -> list[tuple[str, str]]:
    """Self drafts the engine offers for this target, then the model drafts models.yaml pairs with it."""
    choices = []
    for kind in DRAFT_KINDS:
        if kind.needs_model or kind.key not in engine_modes():
            continue
        ok, reason = kind.available(target)
        if ok:
            choices.append((kind.label, kind.key))
    for pair in se.list_pairs():
        if pair.target != target or pair.draft_model is None:
            continue
        kind, spec = split_draft(pair.draft)
        ok, reason = availability(spec.model)
        label = kind.label.format(draft=display_name(spec.model))
        choices.append((label if ok else f"{label} — unavailable: {reason}", pair.draft))
    return choices


def draft_label(value: str) -> str:
    """A short name for tables and plots."""
    return value


@dataclass
class _Loading:
    thread: threading.Thread | None
    done: threading.Event
    message: str = "queued"
    started: float = 0.0
    result: object = None
    error: BaseException | None = None


class ModelRegistry:
    """Loads each model once per process and hands the same read-only LoadedModel to every session."""

    def __init__(self, loader=None, device=None, dtype=None):
        self._loader = loader or se.load_model
        self._device, self._dtype = device, dtype
        self._lock = threading.Lock()
        self._loading: dict[str, _Loading] = {}
        self._labelers: dict[str, TokenLabeler] = {}

    def start(self, name: str) -> _Loading:
        """Begin loading `name` in the background (no-op if it is loading or loaded)."""
        with self._lock:
            entry = self._loading.get(name)
            if entry is None or entry.error is not None:
                done = threading.Event()
                entry = _Loading(threading.Thread(target=self._load, args=(name,), daemon=True,
                                                  name=f"load-{name}"), done, started=time.perf_counter())
                self._loading[name] = entry
                entry.thread.start()
            return entry

    def _load(self, name: str) -> None:
        entry = self._loading[name]

        def progress(message: str) -> None:
            entry.message = message
            log.info("%s: %s", name, message)

        try:
            loaded = self._loader(name, device=self._device, dtype=self._dtype, progress=progress)
            warm_up(loaded)
            entry.result = loaded
            entry.message = f"ready ({loaded.device}, {str(loaded.dtype).removeprefix('torch.')}, {loaded.load_seconds:.1f} s)"
        except BaseException as exc:   # reported to whoever waits; the next call retries
            entry.error = exc
            entry.message = f"failed: {exc}"
            log.warning("loading %s failed: %s", name, exc)
        finally:
            entry.done.set()

    def put(self, loaded) -> None:
        """Register an already loaded model under its name (tests share their session's model this way)."""
        done = threading.Event()
        done.set()
        with self._lock:
            self._loading[loaded.name] = _Loading(None, done, message=f"ready ({loaded.device}, preloaded)",
                                                  started=time.perf_counter(), result=loaded)

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
        Raises what the loader raised."""
        entry = self.start(name)
        while not entry.done.wait(poll):
            yield f"Loading {display_name(name)}: {entry.message} ({time.perf_counter() - entry.started:.0f} s)"
        if entry.error is not None:
            raise entry.error
        return entry.result

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
            if labeler is None:
                labeler = self._labelers[loaded.name] = TokenLabeler(loaded.tokenizer)
            return labeler


def warm_up(loaded) -> None:
    """One short forward so the first measured run does not pay for lazy initialisation."""
    import torch
    with torch.inference_mode():
        ids = torch.tensor([PRELOAD_PROMPT], dtype=torch.long, device=loaded.device)
        loaded.model(input_ids=ids)


def eos_ids(loaded):
    """The ids that end generation: the generation config's (chat models end turns with their own token)."""
    config = getattr(loaded.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return eos


REGISTRY = ModelRegistry()
