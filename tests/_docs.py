"""Where the documentation's commands live: README.md and the pages under docs/ (the same files the docs site
builds). Tests that run a document's commands or read one of its sections take them from here, so a section
that moves between files moves in one place."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The pages a user types commands from, in the order a newcomer reads them: tests/test_readme.py runs their
# commands in this order, in one working directory (the quickstart first; the guides build on its run).
DOCS = (
    "README.md",
    "docs/guides/runs.md",
    "docs/guides/data-and-rewards.md",
    "docs/guides/seeing-what-the-model-does.md",
    "docs/guides/coming-from-trl.md",
    "docs/guides/agents.md",
    "docs/guides/scaling-out.md",
    "docs/guides/rollout-servers.md",
    "docs/guides/real-checkpoint.md",
    "docs/experiments/smollm2-addition.md",
    "docs/experiments/speed-and-memory.md",
    "docs/experiments/experts-to-student.md",
)


def text(rel: str) -> str:
    return (ROOT / rel).read_text()


def markdown_files() -> list[str]:
    """README.md and every page under docs/, relative to the repository root."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def section(rel: str, heading: str) -> str:
    """The body of the section ``heading`` (a whole heading line, e.g. ``"## Agents"``) of the file ``rel``: up to
    the next heading of the same or a higher level outside code blocks, or the end of the file."""
    level = len(heading) - len(heading.lstrip("#"))
    whole = "\n" + text(rel)
    start = whole.index(f"\n{heading}\n") + len(heading) + 2
    body = whole[start:]
    end = re.search(rf"^#{{1,{level}}} ", _unfenced(body), re.MULTILINE)
    return body[: end.start()] if end else body


def _unfenced(body: str) -> str:
    """``body`` with the lines of fenced code blocks blanked (same length), so a shell ``# comment`` is no
    heading."""
    out, fenced = [], False
    for line in body.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
            out.append(line)
        else:
            out.append(re.sub(r"[^\n]", " ", line) if fenced else line)
    return "".join(out)


def bash_commands(markdown: str) -> list[str]:
    """Commands of a page's bash blocks: comments dropped, continuation lines joined, `a && b` kept whole unless
    it starts with `make install` (the install step, then the command)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("make install && "):
                out += ["make install", line[len("make install && ") :]]
            else:
                out.append(re.sub(r"\s+", " ", line))
    return out


def doc_commands() -> list[str]:
    """Every command of the pages in ``DOCS``, in reading order, each once."""
    return list(dict.fromkeys(c for rel in DOCS for c in bash_commands(text(rel))))
