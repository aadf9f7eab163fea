"""The style checks of `make lint` (ruff's lint rules, ruff's formatter, mypy over the whole package; all
configured in pyproject.toml), run from pytest so that a plain pytest run and CI enforce them too. A
failure shows the tool's own report: the file, line and rule to fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The same three commands as the Makefile's `lint` target.
CHECKS = {
    "ruff check": ["ruff", "check", "."],
    "ruff format --check": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
}


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m <tool> ...` at the repository root (the tool reads pyproject.toml there)."""
    try:
        __import__(args[0])
    except ImportError:
        pytest.fail(f"{args[0]} is not installed: install the dev extra (pip install -e '.[dev]')")
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("name", list(CHECKS))
def test_style_check_passes(name):
    proc = _run(CHECKS[name])
    assert proc.returncode == 0, f"`{name}` failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"


def test_ruff_config_is_the_projects():
    """The checks above read pyproject.toml: a 121-character line, an unsorted import and a docstring ending
    without a period in a lit_rl file are reported with the rules chosen there (E501 at 120, I001, D415)."""
    source = '"""Module."""\n\nimport sys\nimport os\n\n\n'
    source += 'def f():\n    """Nothing"""\n    return os, sys\n\n\n'
    source += "X = '" + "x" * 115 + "'\n"  # 5 + 115 + 1 = 121 characters
    proc = _run(["ruff", "check", "--no-cache", "--stdin-filename", "lit_rl/_style_probe.py", "-"], source)
    found = {rule for rule in ("E501", "I001", "D415") if rule in proc.stdout}
    assert proc.returncode == 1 and found == {"E501", "I001", "D415"}, proc.stdout + proc.stderr


def test_mypy_config_checks_annotations(tmp_path):
    """mypy reports a wrong argument type, and reads the project's settings: an int compared with a str is an
    error only under its ``strict_equality``."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(x: int) -> bool:\n    return x == 'a'\n\n\nf('1')\n")
    proc = _run(["mypy", "--no-incremental", str(probe)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert 'Argument 1 to "f" has incompatible type "str"' in out, out
    assert "Non-overlapping equality check" in out, out
