"""How a completion becomes a program (the code-extraction rule), in one place.

The rule, applied to Markdown-style fences (a line starting with three or more backticks, up to three
spaces of indent; the opening line's first word is the block's language tag):

1. No fence line at all: the whole completion is the program (unless ``require_block``: then ``fail``,
   reason ``no_block``).
2. A fence that is opened and never closed: ``fail``, reason ``unclosed_fence`` (a cut-off completion; the
   partial block is not guessed at).
3. Otherwise the **last** block whose tag is one of ``languages`` (default ``python``, ``py``, ``python3``,
   case-insensitive) is the program.
4. Fenced blocks exist but none carries such a tag (bare fences, or only other languages): ``fail``, reason
   ``ambiguous`` -- an untagged block may be the program, an example input or expected output, and
   picking one would reward a guess.

Every ``fail`` is scored 0 (not masked: the completion's own form caused it) and counted in the reward's
``info`` (``no_code`` and ``extract_<reason>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PYTHON_TAGS = ("python", "py", "python3")
REASONS = ("fenced", "whole_text", "no_block", "unclosed_fence", "ambiguous")
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,})[ \t]*([^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Extraction:
    """``code`` is the program (None on failure); ``reason`` is one of ``REASONS``."""

    code: str | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.code is not None


def extract_program(
    completion: str, require_block: bool = False, languages: tuple[str, ...] = PYTHON_TAGS
) -> Extraction:
    """Apply the rule above to ``completion``."""
    tags = {t.lower() for t in languages}
    lines = completion.split("\n")
    blocks: list[tuple[str, str]] = []  # (tag, body) of each closed block, in order
    open_at, open_tag, fence_len, saw_fence = None, "", 0, False
    for i, line in enumerate(lines):
        m = _FENCE_LINE.match(line)
        if not m:
            continue
        saw_fence = True
        if open_at is None:
            open_at, open_tag, fence_len = i, m.group(2).lower(), len(m.group(1))
        elif not m.group(2) and len(m.group(1)) >= fence_len:  # a closing fence carries no tag
            blocks.append((open_tag, "\n".join(lines[open_at + 1 : i]) + "\n"))
            open_at = None
    if not saw_fence:
        return Extraction(None, "no_block") if require_block else Extraction(completion, "whole_text")
    if open_at is not None:
        return Extraction(None, "unclosed_fence")
    tagged = [body for tag, body in blocks if tag in tags]
    if not tagged:
        return Extraction(None, "ambiguous")
    return Extraction(tagged[-1], "fenced")


def extract_code(completion: str, require_block: bool = False) -> str | None:
    """The program of ``completion`` under the rule above, or None when the rule says ``fail``."""
    return extract_program(completion, require_block).code
