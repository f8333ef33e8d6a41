"""What the repository itself must hold: binaries under LFS patterns and the front matter's Python version (what a
Hugging Face Space needs, issue #24), and code that passes the linter configured in pyproject.toml."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.decode().split("\0") if name]


def is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def test_every_binary_tracked_file_matches_an_lfs_pattern():
    binaries = [name for name in tracked_files() if (ROOT / name).is_file() and is_binary(ROOT / name)]
    assert binaries, "the repository ships binaries (the EAGLE head, screenshots): the check would be empty"
    out = subprocess.run(["git", "check-attr", "filter", "--", *binaries], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    outside = [line.split(":")[0] for line in out.splitlines() if not line.endswith(": filter: lfs")]
    assert not outside, f"binary files a Space push would refuse (add a pattern to .gitattributes): {outside}"


def test_the_space_front_matter_pins_the_tested_python():
    front = (ROOT / "README.md").read_text(encoding="utf-8").split("---")[1]
    assert 'python_version: "3.11"' in front and "app_file: app.py" in front


def test_ruff_check_passes():
    """`ruff check .` with pyproject.toml's rules (pyflakes, syntax errors and the 120-column line length): run here so
    that the README's test command, which CI runs, lints too."""
    try:
        import ruff  # noqa: F401  (installed by requirements-test.txt)
    except ImportError:
        pytest.fail("ruff is not installed: bash scripts/install.sh --test installs it (requirements-test.txt)")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_every_benchmark_result_is_indexed_and_cited():
    """bench/results/README.md names every result with the command that made it, and each is cited outside the
    folder (README, docs/, a bench script or the engine): an uncited result is a superseded one (issue #35)."""
    results = ROOT / "bench" / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    files = [f for f in tracked_files() if f.startswith("bench/results/") and not f.endswith("README.md")]
    assert files
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.py"),
               *(ROOT / "spec_engine").rglob("*.py"), *(ROOT / "spec_engine").rglob("*.json")]
    text = "\n".join(path.read_text(encoding="utf-8", errors="ignore") for path in sources)
    for name in files:
        stem = Path(name).stem if name.endswith((".json", ".md")) else Path(name).name
        assert f"`{Path(name).name}`" in index, f"{name} is not in bench/results/README.md"
        assert stem in text, f"{name} is cited nowhere outside bench/results (remove it, or cite it)"
