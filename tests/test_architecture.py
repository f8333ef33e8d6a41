"""The floor plan, checked by reading the imports (module level and inside functions), so a later change cannot
quietly break it. docs/architecture.md explains the layers; this is the rule as code.

    spec_engine.core        only itself (torch, transformers, numpy and the standard library outside)
    spec_engine.accel       the core, itself and paths (its compiled code and plans are cached): the speed layer
                            plugs into the core's seam, never the reverse
    spec_engine.drafters    the core, itself and models (the EAGLE head reads the project's dtype names)
    spec_engine.models      the core's seam (a loaded model is offered to the speed layer), itself, paths
    spec_engine.classroom   the core, drafters, models and itself
    ui/, app.py             the public API (`spec_engine`) and spec_engine.classroom only: never the drafters,
                            the models, the core's modules or the speed layer
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ALLOWED = {
    "spec_engine.core": {"spec_engine.core"},
    "spec_engine.accel": {"spec_engine.core", "spec_engine.accel", "spec_engine.paths"},
    "spec_engine.drafters": {"spec_engine.core", "spec_engine.drafters", "spec_engine.models"},
    "spec_engine.models": {"spec_engine.core.speed", "spec_engine.models", "spec_engine.paths"},
    "spec_engine.classroom": {"spec_engine.core", "spec_engine.drafters", "spec_engine.models",
                              "spec_engine.classroom"},
    "ui": {"spec_engine", "spec_engine.classroom"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every spec_engine module `path` imports, resolved to dotted names (`from spec_engine import x` counts as
    spec_engine.x where x is a module, else as spec_engine)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (ROOT / Path(*candidate.split(".")) / "__init__.py").exists()
                found.add(candidate if is_module else base)
    return {name for name in found if name == "spec_engine" or name.startswith("spec_engine.")}


def layer_of(name: str) -> str | None:
    return next((layer for layer in sorted(ALLOWED, key=len, reverse=True)
                 if name == layer or name.startswith(layer + ".")), None)


def allowed(importer_layer: str, name: str) -> bool:
    if importer_layer == "ui":
        return name in ALLOWED["ui"] or any(name.startswith(p + ".") for p in ALLOWED["ui"] - {"spec_engine"})
    return any(name == p or name.startswith(p + ".") for p in ALLOWED[importer_layer])


SOURCES = sorted([*(ROOT / "spec_engine").rglob("*.py"), *(ROOT / "ui").rglob("*.py"), ROOT / "app.py"])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_layer_imports_only_what_its_rule_allows(path):
    layer = "ui" if path.name == "app.py" else layer_of(module_name(path))
    if layer is None:
        return          # spec_engine/__init__.py, the CLI, the benchmark harness and paths.py may import any layer
    broken = sorted(name for name in imported(path) if not allowed(layer, name))
    assert not broken, f"{path.relative_to(ROOT)} ({layer}) imports {broken}: see this file's docstring"


def test_the_rule_checker_sees_a_broken_rule(tmp_path):
    """The checker itself can fail: a core module importing the speed layer or a drafter is reported."""
    assert not allowed("spec_engine.core", "spec_engine.accel.lean_llama")
    assert not allowed("spec_engine.core", "spec_engine.drafters.base")
    assert not allowed("ui", "spec_engine.core.verify") and not allowed("ui", "spec_engine.accel")
    assert allowed("ui", "spec_engine") and allowed("spec_engine.accel", "spec_engine.core.speed")
    assert allowed("ui", "spec_engine.classroom.lab") and not allowed("ui", "spec_engine.drafters.sizing")
    assert not allowed("ui", "spec_engine.models") and not allowed("ui", "spec_engine.drafters")
    assert "spec_engine.accel.lean_llama" in imported(ROOT / "spec_engine" / "accel" / "__init__.py")
    assert "spec_engine.core.speed" in imported(ROOT / "spec_engine" / "core" / "cache.py")


def test_every_engine_folder_is_a_package_with_a_map():
    """Each layer says what it holds (its __init__ docstring), so a newcomer reads the tree."""
    for folder in ("core", "drafters", "models", "accel", "classroom"):
        init = ROOT / "spec_engine" / folder / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), folder


@pytest.mark.parametrize("path", sorted((ROOT / "ui" / "views").glob("*.py")), ids=lambda p: p.name)
def test_views_are_pure(path):
    """ui/views: functions of events and figures; no Gradio, nothing of the playground or the classroom tabs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {n for n in names if n.split(".")[0] == "gradio" or n.startswith(("ui.playground", "ui.classroom"))}
