"""The project stands alone: no code, test, recipe or doc points into the steering folder beside the clone
(its design card is not shipped; docs/architecture.md is the project's own record)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built from pieces so this file does not match itself.
FORBIDDEN = ("../" + "shared", "DESIGN" + " §", "DESIGN" + ".md")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg"}


def _project_files():
    for top in ("lit_rl", "tests", "docs", "configs", "callbacks", "scripts", ".ci"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and (p.suffix in SUFFIXES or p.parent.name == ".ci"):
                yield p
    for name in ("README.md", "Makefile", "pyproject.toml"):
        yield ROOT / name


def test_no_file_points_into_the_steering_folder():
    hits = []
    for p in _project_files():
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if any(f in line for f in FORBIDDEN):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
