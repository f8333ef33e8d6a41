"""The playground's draft catalogue: the engine's one registry of draft modes (`se.draft_modes()`), the draft the
page starts with, the choices a target offers, and `build_drafter` with the playground's options (a layer set typed
in, an exit depth). A draft choice value is a draft name as the engine spells it; adding a drafter touches the engine
only: its module and one registration."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import spec_engine as se

from ui.playground import registry as reg


def default_draft(target: str) -> tuple[str, int]:
    """(draft, k) the playground starts with: the measured best. When the trained EAGLE head drafts for this target,
    the draft and k recorded beside its weights (bench/results/, README); else prompt lookup."""
    if se.draft_modes()["eagle"].available(target)[0]:
        settings = se.eagle_recommended_settings()
        return str(settings.get("draft", "eagle")), int(settings.get("k", 2))
    return "prompt-lookup", 4


def default_skip_layers() -> list[int]:
    """The engine's layer-skip set (measured on the offline default by bench/choose_skip_layers.py)."""
    return list(se.DEFAULT_SKIP_LAYERS)


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """'3, 5-9' -> [3, 5, 6, 7, 8, 9]; ValueError with the reason otherwise. Each number is checked against the
    model's `n_layers` before a range is expanded, so '1-99999999' costs no more than '1-9'."""
    layers: set[int] = set()
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start, stop = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"layers to skip: {part[:20]!r} is not a layer number or a range like 5-9") from None
        if start > stop:
            raise ValueError(f"layers to skip: range {part[:20]!r} runs backwards")
        if not 0 < start <= stop < n_layers:
            bad = start if not 0 < start < n_layers else stop
            raise ValueError(f"layers to skip must lie in [1, {n_layers - 1}] (layer 0 always runs); "
                             f"got {str(bad)[:20]} in {part[:20]!r}")
        layers.update(range(start, stop + 1))
    if len(layers) >= n_layers - 1:
        raise ValueError(f"layers to skip: keep at least two of the {n_layers} layers")
    return sorted(layers)


@dataclass(frozen=True)
class DraftOptions:
    skip_layers: str = ""   # layer-skip: "" = the default set
    exit_after: int = 0     # early exit: 0 = the engine's default depth
    fixed_length: bool = False   # drafters that size their drafts by cost or confidence draft k every round


def build_drafter(spec, target, draft, options: DraftOptions, sizing=None) -> se.Drafter:
    """A fresh drafter for `spec` (the engine's make_drafter) with the playground's options: a layer set typed in
    (parsed against the target), an exit depth, fixed draft lengths; `sizing`: a run's earlier verify-cost curve."""
    if spec.mode == "early-exit" and options.exit_after:
        spec = dataclasses.replace(spec, arg=options.exit_after)
    layers = None
    if spec.mode in se.LAYER_SKIP_MODES and options.skip_layers.strip():
        layers = parse_layers(options.skip_layers, len(target.model.model.layers))
    return se.make_drafter(spec, target, draft, fixed_length=options.fixed_length, skip_layers=layers, sizing=sizing)


def draft_kinds() -> list[se.DraftMode]:
    """The engine's registered draft modes (se.draft_modes(): name, label, lesson, needs_model, available, tree), as
    the playground offers them. Draft values are spelled as the registry and presets/models.yaml spell them:
    "layer-skip", "early-exit[:N]", "prompt-lookup[:N]", "<preset>", "<preset>:cross-tokenizer",
    "<preset>:naive-ids"."""
    return list(se.draft_modes().values())


def kind_by_key(key: str) -> se.DraftMode | None:
    return se.draft_modes().get(key)


def split_draft(value: str):
    """A draft name -> (DraftMode, DraftSpec); ValueError for a malformed name or a mode the UI lacks."""
    spec = se.parse_draft(value)
    kind = kind_by_key(spec.mode)
    if kind is None:
        raise ValueError(f"draft mode {spec.mode!r} has no entry in the playground's draft list")
    return kind, spec


def check_draft_value(value: str) -> str | None:
    """None if `value` is a usable draft name, else the reason (for validating scenarios and inputs)."""
    try:
        _, spec = split_draft(value)
    except ValueError as exc:
        return str(exc)
    if spec.model is not None and spec.model not in reg.preset_names():
        return f"names an unknown model preset {spec.model!r} (known: {', '.join(reg.preset_names())})"
    return None


def draft_choices(target: str) -> list[tuple[str, str]]:
    """Self drafts the engine offers for this target, then the model drafts models.yaml pairs with it."""
    choices = []
    for kind in draft_kinds():
        if kind.needs_model:
            continue
        ok, reason = kind.available(target)
        if ok:
            choices.append((kind.label, kind.name))
    for pair in se.list_pairs():
        if pair.target != target or pair.draft_model is None:
            continue
        kind, spec = split_draft(pair.draft)
        ok, reason = reg.availability(spec.model)
        label = kind.label.format(draft=reg.display_name(spec.model))
        choices.append((label if ok else f"{label} — unavailable: {reason}", pair.draft))
    return choices
