r"""JSON Lines that any text survives: the rollout files and ``metrics.jsonl`` (written by ``RolloutInspector``,
read by ``lit_rl.report``), prompt files and preference files.

Three rules, each because of a crash a user met (issue 53):

* **Lines end at ``\n`` only.** ``str.splitlines`` also ends a line at U+2028, U+2029, U+0085 (NEL), ``\x0b``,
  ``\x0c`` and ``\x1c``-``\x1e``; JSON allows the first three raw inside a string, so a prompt holding U+2028
  was cut in two and the report died on a ``JSONDecodeError``. Files are read as bytes split on ``b"\n"``.
* **Written lines are single lines for every reader.** ``dumps_line`` keeps non-ASCII text readable
  (``ensure_ascii=False``) but escapes U+2028, U+2029 and U+0085 (JSON already escapes every control character
  below U+0020), so a user's own ``read_text().splitlines()`` reads the file right too.
* **Text that has no UTF-8 form becomes U+FFFD where it enters.** A lone surrogate (U+D800-U+DFFF) comes from a
  ``"\udc80"`` escape in a JSON file, or from bytes decoded with ``errors="surrogateescape"`` (``os.fsdecode``
  of a file name that is not UTF-8, a subprocess's output); a tokenizer refuses it and no UTF-8 file can hold it.
  Bytes that are not UTF-8 are likewise read as U+FFFD. Readers report which lines they changed
  (``JsonLine.replaced``), so data loaders can say so.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a surrogate can only enter a decoded line as an escape
# the characters str.splitlines breaks at that json.dumps(ensure_ascii=False) leaves raw
_RAW_BREAKS = re.compile("[\x85\u2028\u2029]")


def clean_text(s: str) -> str:
    """``s`` with every lone surrogate replaced by U+FFFD (a Python str holds no valid surrogate: a pair read
    from JSON is already one code point)."""
    return _SURROGATE.sub("\ufffd", s)


def clean(obj: Any) -> Any:
    """``obj`` with ``clean_text`` applied to every string in it (dict keys too; lists, tuples and dicts are
    rebuilt, anything else is returned as it is)."""
    if isinstance(obj, str):
        return clean_text(obj)
    if isinstance(obj, dict):
        return {clean(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    """What ``dumps_line`` writes for ``obj``: strings cleaned, non-finite floats as null (strict JSON, and the
    report's own rule), dict keys as strings, anything JSON has no type for as its ``str`` (a reward's
    ``log_extra`` values are the user's: any type)."""
    if isinstance(obj, str):
        return clean_text(obj)
    if obj is None or isinstance(obj, (bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {clean_text(k if isinstance(k, str) else str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return clean_text(str(obj))


def dumps_line(obj: Any) -> str:
    r"""One JSON line (with its ``\n``) of ``obj`` that every line reader and every UTF-8 file takes (module
    doc). Inside JSON text U+2028 / U+2029 / U+0085 can only stand in a string, so escaping them keeps the
    value."""
    text = json.dumps(_jsonable(obj), ensure_ascii=False, allow_nan=False)
    return _RAW_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


@dataclass
class JsonLine:
    """One non-blank line of a JSON Lines file: its number (from 1), the parsed value (or ``error``: why it
    is not JSON), and whether text in it was replaced by U+FFFD (bytes that are not UTF-8, lone surrogates)."""

    lineno: int
    value: Any = None
    error: str | None = None
    replaced: bool = False


def read_jsonl(path: str | Path) -> Iterator[JsonLine]:
    r"""The non-blank lines of ``path``, split at ``\n`` only (module doc), each parsed and cleaned."""
    with open(path, "rb") as f:  # binary: a line ends at b"\n" and nowhere else
        for n, raw in enumerate(f, 1):
            raw = raw[:-1] if raw.endswith(b"\n") else raw  # the line's end is not part of its JSON
            try:
                text, replaced = raw.decode("utf-8"), False
            except UnicodeDecodeError:
                text, replaced = raw.decode("utf-8", errors="replace"), True
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                yield JsonLine(n, error=str(e), replaced=replaced)
                continue
            if _SURROGATE_ESCAPE.search(text):
                cleaned = clean(value)
                replaced = replaced or cleaned != value
                value = cleaned
            yield JsonLine(n, value, replaced=replaced)


def lines_note(path: str | Path, linenos: list[int], limit: int = 10) -> str:
    """The warning a loader gives for the lines ``read_jsonl`` replaced text in."""
    shown = ", ".join(map(str, linenos[:limit])) + (
        f" and {len(linenos) - limit} more" if len(linenos) > limit else ""
    )
    return (
        f"{path}: line(s) {shown} held text that is not valid Unicode (bytes that are not UTF-8, or a lone "
        "surrogate escape such as \\udc80); it was read as U+FFFD (the replacement character)"
    )
