"""Where the engine keeps what it computes once per machine (dequantized models, measured kernel plans)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$SPEC_ENGINE_CACHE, else $XDG_CACHE_HOME/spec_engine, else ~/.cache/spec_engine."""
    override = os.environ.get("SPEC_ENGINE_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "spec_engine"
