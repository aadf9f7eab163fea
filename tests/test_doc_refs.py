"""Every ``docs/architecture.md "Section"`` reference in the package names a heading of that file (a quoted
text that starts a heading: ``"Data flow"`` names "Data flow of one RL iteration"), so a renamed or removed
section fails here instead of leaving docstrings that point nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the file name, then optional punctuation / whitespace (a reference may wrap), then the quoted section
REF = re.compile(r'architecture\.md[\s,:(]*"([^"\n]+)"')


def headings(text: str) -> list[str]:
    """Markdown headings, outside fenced code blocks (where ``# ...`` is a shell comment)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def references(root: Path) -> list[tuple[str, int, str]]:
    """(file relative to ``root``, line, quoted section) of every reference in the Python files below."""
    out = []
    for f in sorted(root.rglob("*.py")):
        text = f.read_text()
        for m in REF.finditer(text):
            out.append((str(f.relative_to(root)), text.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return out


def missing(refs: list[tuple[str, int, str]], heads: list[str]) -> list[str]:
    return [
        f"{f}:{n}: docs/architecture.md has no heading {s!r}"
        for f, n, s in refs
        if not any(h.startswith(s) for h in heads)
    ]


def test_the_checker_finds_a_missing_heading_and_accepts_a_prefix(tmp_path):
    doc = '"""See docs/architecture.md "Data flow" and\ndocs/architecture.md, "Nope"."""\n'
    (tmp_path / "m.py").write_text(doc)
    heads = headings("# Title\n\n## Data flow of one RL iteration\n```bash\n# Nope\n```\n### Contracts\n")
    assert heads == ["Title", "Data flow of one RL iteration", "Contracts"]
    refs = references(tmp_path)
    assert refs == [("m.py", 1, "Data flow"), ("m.py", 2, "Nope")]
    assert missing(refs, heads) == ["m.py:2: docs/architecture.md has no heading 'Nope'"]


def test_every_architecture_reference_in_the_package_names_a_heading():
    refs = references(ROOT / "lit_rl")
    assert len(refs) >= 10  # non-vacuous: the package cites the document in many places
    assert missing(refs, headings((ROOT / "docs" / "architecture.md").read_text())) == []


# README.md and the pages under docs/ as the package, the scripts and the recipes cite them: README "Your data",
# docs/guides/scaling-out.md "No padding at all" (a section that moved to another page must be cited there)
PAGE_REF = re.compile(r'\b(README|docs/[\w/-]+\.md)[\s,:(]*"([^"\n]+)"')
CITING = ("lit_rl/**/*.py", "scripts/*.py", "scripts/*.sh", "configs/**/*.yaml", "callbacks/*.yaml")


def page_references(root: Path, patterns=CITING) -> list[tuple[str, int, str, str]]:
    """(file, line, page, quoted section) of every README / docs page reference in the files ``patterns`` match."""
    out = []
    for pattern in patterns:
        for f in sorted(root.glob(pattern)):
            text = f.read_text()
            for m in PAGE_REF.finditer(text):
                page = "README.md" if m.group(1) == "README" else m.group(1)
                out.append((str(f.relative_to(root)), text.count("\n", 0, m.start(2)) + 1, page, m.group(2)))
    return out


def missing_pages(refs: list[tuple[str, int, str, str]], root: Path) -> list[str]:
    out = []
    for f, n, page, s in refs:
        path = root / page
        if not path.exists():
            out.append(f"{f}:{n}: {page} does not exist")
        elif not any(h.startswith(s) for h in headings(path.read_text())):
            out.append(f"{f}:{n}: {page} has no heading {s!r}")
    return out


def test_the_page_checker_finds_a_moved_section(tmp_path):
    (tmp_path / "docs/guides").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# T\n\n## Your data and your reward\n")
    (tmp_path / "docs/guides/scaling-out.md").write_text("# Scaling out\n\n## No padding at all\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/a.py").write_text(
        '"""README "Your data"; README "No padding at all";\ndocs/guides/scaling-out.md "No padding";'
        ' docs/guides/gone.md "X"."""\n'
    )
    refs = page_references(tmp_path, ("scripts/*.py",))
    assert [(n, p, s) for _, n, p, s in refs] == [
        (1, "README.md", "Your data"),
        (1, "README.md", "No padding at all"),
        (2, "docs/guides/scaling-out.md", "No padding"),
        (2, "docs/guides/gone.md", "X"),
    ]
    assert missing_pages(refs, tmp_path) == [
        "scripts/a.py:1: README.md has no heading 'No padding at all'",
        "scripts/a.py:2: docs/guides/gone.md does not exist",
    ]


def test_every_readme_and_docs_page_reference_names_a_heading():
    refs = page_references(ROOT)
    assert len(refs) >= 10  # non-vacuous
    assert missing_pages(refs, ROOT) == []
