"""The public app's limits, read once at start-up: from SPEC_* environment variables, then app.py's flags.

The app faces anonymous visitors (a Space) and classrooms (one laptop). Every handler call has a wall-clock
cap and every run a token cap; prompts have a size cap; the model queue has a size; one computation decodes at a
time unless the host allows more (runs that arrive meanwhile decode together in one batch: batching.py); only a
bounded number of models besides the default stay loaded; and only the preset models load unless the host allows
Hub ids. `current()` is what handlers read (at call time, so tests can change it); `configure()` is called by
app.py before the demo is built.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

ENGINE_MAX_NEW_TOKENS = 2048     # spec_engine.MAX_NEW_TOKENS (not imported: importing this module stays cheap)


@dataclass(frozen=True)
class Limits:
    max_run_seconds: float = 120.0      # decoding time of one handler call (a run, its baseline, a sweep)
    max_new_tokens: int = 1024          # tokens one run may ask for
    max_prompt_chars: int = 20_000      # checked before tokenizing; tokens are checked against the context too
    max_extra_models: int = 2           # models kept loaded besides the default target (least recently used go)
    allow_custom_models: bool = False   # Hub ids beyond the presets (never local paths, never remote code)
    queue_size: int = 64                # events waiting in Gradio's queue before "queue is full"
    concurrency: int = 1                # runs decoding at once; more share the CPU and blur the timings
    lab_max_n: int = 10_000             # the largest sample count N a lab tab may ask for
    session_ttl_seconds: float = 3600.0  # a session's state (runs, step-through caches, exports) after its last use
    idle_unload_seconds: float = 300.0  # a model besides the default is unloaded once idle this long
    threads: int = 0                    # torch's intra-op threads (0: torch's default, one per core); see app.py

    def __post_init__(self):
        problems = []
        for name in ("max_run_seconds", "session_ttl_seconds", "idle_unload_seconds"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.max_new_tokens <= ENGINE_MAX_NEW_TOKENS:
            problems.append(f"max_new_tokens must be in [1, {ENGINE_MAX_NEW_TOKENS}], got {self.max_new_tokens}")
        for name in ("max_prompt_chars", "queue_size", "concurrency", "lab_max_n"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads < 0:
            problems.append(f"threads must be >= 0, got {self.threads}")
        if self.max_extra_models < 0:
            problems.append(f"max_extra_models must be >= 0, got {self.max_extra_models}")
        if problems:
            raise ValueError("; ".join(problems))


ENV = {
    "max_run_seconds": "SPEC_MAX_RUN_SECONDS",
    "max_new_tokens": "SPEC_MAX_NEW_TOKENS",
    "max_prompt_chars": "SPEC_MAX_PROMPT_CHARS",
    "max_extra_models": "SPEC_MAX_EXTRA_MODELS",
    "allow_custom_models": "SPEC_ALLOW_CUSTOM_MODELS",
    "queue_size": "SPEC_QUEUE_SIZE",
    "concurrency": "SPEC_CONCURRENCY",
    "lab_max_n": "SPEC_LAB_MAX_N",
    "session_ttl_seconds": "SPEC_SESSION_TTL",
    "idle_unload_seconds": "SPEC_IDLE_UNLOAD",
    "threads": "SPEC_THREADS",
}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def parse_value(field: str, text: str):
    """An environment string -> the field's type; ValueError naming the variable otherwise."""
    kind = type(getattr(Limits(), field))
    word = text.strip().lower()
    try:
        if kind is bool:
            if word not in TRUE | FALSE:
                raise ValueError
            return word in TRUE
        return kind(float(word)) if kind is float else int(word)
    except ValueError:
        expected = {bool: "1 or 0", int: "a whole number", float: "a number"}[kind]
        raise ValueError(f"{ENV[field]} must be {expected}, got {text!r}") from None


def from_env(environ: Mapping[str, str] | None = None, **overrides) -> Limits:
    """Defaults, then SPEC_* variables, then `overrides` (app.py's flags; None means "not given")."""
    environ = os.environ if environ is None else environ
    values = {field: parse_value(field, environ[var]) for field, var in ENV.items() if var in environ}
    values.update({field: value for field, value in overrides.items() if value is not None})
    return Limits(**values)


# Where models load (not a limit, read the same way): SPEC_DEVICE / SPEC_DTYPE, then app.py's --device / --dtype.
PLACEMENT_ENV = {"device": "SPEC_DEVICE", "dtype": "SPEC_DTYPE"}


def placement_from_env(environ: Mapping[str, str] | None = None, **overrides) -> dict[str, str | None]:
    """{"device": ..., "dtype": ...}: SPEC_DEVICE / SPEC_DTYPE, then `overrides` (app.py's flags; None means "not
    given"). None values keep load_model's defaults: CUDA when present, float32 on the CPU and for models of 0.5B
    parameters or less, bfloat16 above. The model registry checks the values (`ModelRegistry.place`)."""
    environ = os.environ if environ is None else environ
    values = {field: environ[var].strip() or None for field, var in PLACEMENT_ENV.items() if var in environ}
    values.update({field: value for field, value in overrides.items() if value is not None})
    unknown = set(values) - set(PLACEMENT_ENV)
    if unknown:
        raise ValueError(f"unknown placement settings {sorted(unknown)}")
    return {field: values.get(field) for field in PLACEMENT_ENV}


_current = from_env()


def current() -> Limits:
    return _current


def configure(limits: Limits | None = None, **changes) -> Limits:
    """Set the process's limits (at start-up, before serving); returns the previous ones so tests can restore."""
    global _current
    previous = _current
    _current = dataclasses.replace(limits or _current, **changes)
    return previous
