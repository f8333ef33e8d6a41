"""The code's shape, checked by reading the source: no function outside tests/ is longer than one screen and a half
(MAX_FUNCTION_LINES, counted from its `def` to its last line, docstring included). A longer function does several
jobs; split it into named steps (STYLE.md: one loop, one screen)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80
SKIPPED = {"tests", "mutants", "results", "node_modules", "build", "dist", "__pycache__"}   # not the project's code


def project_sources() -> list[Path]:
    return [path for path in ROOT.rglob("*.py")
            if not any(part in SKIPPED or part.startswith(".") for part in path.relative_to(ROOT).parts[:-1])]


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_the_length_check_finds_a_long_function_and_passes_a_short_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))     # def line + 80 lines: 81
    assert long_functions(f"def long():\n{body}") == [("long", 1, MAX_FUNCTION_LINES + 1)]
    nested = f"class A:\n    def method(self):\n        def inner():\n{body.replace('    ', '            ')}"
    assert [name for name, _, _ in long_functions(nested)] == ["method", "inner"]
    assert long_functions(f"def short():\n{body[body.index(chr(10)) + 1:]}") == []      # exactly 80 lines


def test_no_function_outside_tests_is_over_80_lines():
    sources = project_sources()
    assert any(path.name == "layout.py" for path in sources) and len(sources) > 50     # the walk reaches the code
    too_long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)" for path in sources
                for name, line, length in long_functions(path.read_text(encoding="utf-8"))]
    assert not too_long, "functions over 80 lines (split them into named steps):\n" + "\n".join(too_long)
