"""Building the engine's small C++ sources (spec_engine/accel/csrc) with the machine's compiler, on first use.

A library is compiled once per source and flags into the cache folder (paths.cache_root), named by the hash of
both, and loaded with ctypes; a later process finds it there. Callers treat any failure (no compiler, a compile
error, a load error) as "unavailable" and keep a torch or numpy path: see blocked_gemm.py and sampling.py.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from spec_engine.paths import cache_root

CSRC = Path(__file__).parent / "csrc"
BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC"]
BUILD_TIMEOUT_S = 120
ERRORS = (OSError, subprocess.SubprocessError, RuntimeError, AttributeError)   # what "unavailable" catches
ISA_FLAGS = {"avx512": ["-mavx512f", "-mfma"], "avx2": ["-mavx2", "-mfma"]}


def cpu_isa() -> str | None:
    """The widest vector instruction set of ISA_FLAGS this CPU has, by torch's own CPU detection; None elsewhere."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return "avx512" if capability.startswith("AVX512") else "avx2" if capability == "AVX2" else None


def isa_flags() -> list[str]:
    """The compiler flags for cpu_isa() (none off x86 or below AVX2: the compiler's baseline then)."""
    return list(ISA_FLAGS.get(cpu_isa(), []))


def compile_library(source: Path, stem: str, flags: list[str], includes: tuple[Path, ...] = ()) -> Path:
    """Compile `source` with `flags` into the cache folder as `stem`-<hash>.so, unless that exact build is there
    already; returns the library's path. `includes`: the sources it #includes, hashed with it (a change to either
    builds again). Concurrent builders each write their own temporary file and rename it into place. OSError without
    a compiler (set CXX to choose one), RuntimeError with the compiler's message."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise OSError("no C++ compiler (set CXX, or install g++)")
    text = b"".join(Path(path).read_bytes() for path in (source, *includes))
    digest = hashlib.sha256(text + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    path = cache_root() / "kernels" / f"{stem}-{digest}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    result = subprocess.run([compiler, *flags, str(source), "-o", str(temporary)], capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S)
    if result.returncode != 0:
        temporary.unlink(missing_ok=True)
        raise RuntimeError(f"{Path(compiler).name} failed: {result.stderr.strip()[-400:]}")
    os.replace(temporary, path)
    return path


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
