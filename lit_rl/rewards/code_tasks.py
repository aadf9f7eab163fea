"""Load code-RL tasks from JSONL into ``Prompt`` records whose ``metadata["tests"]`` ``CodeTestsReward`` runs.

One JSON object per line, in any of these shapes (detected per record by its keys):

* **native**: ``{"prompt": str, "tests": [<call|stdio|asserts|check test>, ...]}``;
* **check** (HumanEval-like): ``{"prompt": str, "test": "def check(candidate): ...", "entry_point": "f"}``;
* **asserts** (MBPP-like): ``{"text" | "prompt": str, "test_list": ["assert f(1) == 2", ...],
  "test_setup_code": str (optional)}``;
* **stdio** (contest-like): ``{"question" | "prompt": str, "inputs": [...], "outputs": [...]}`` or the same two
  lists JSON-encoded in ``"input_output"``.

Optional in every shape: ``task_id`` / ``uid`` (becomes ``Prompt.uid``) and ``solution`` (a reference
program, kept in ``metadata["solution"]``; never shown to the model). ``metadata["format"]`` records the
shape. A bad record raises ``ValueError`` naming the file, line and field before anything runs.

``SAMPLES`` is a small bundled set (two tasks per shape, written for this project) with reference solutions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lit_rl.data.prompts import Prompt

SAMPLES = Path(__file__).resolve().parent / "samples" / "code_tasks.jsonl"
FORMATS = ("native", "check", "asserts", "stdio")


def record_to_prompt(rec: dict[str, Any], where: str = "record") -> Prompt:
    """One JSONL record (any shape above) -> ``Prompt`` with ``metadata = {"tests", "format"[, "solution"]}``."""
    if not isinstance(rec, dict):
        raise TypeError(f"{where}: expected a JSON object, got {type(rec).__name__}")

    def text(*keys: str) -> str:
        for k in keys:
            if isinstance(rec.get(k), str):
                return rec[k]
        raise ValueError(f"{where}: needs a string field {' or '.join(map(repr, keys))} (the task text)")

    if "tests" in rec:
        fmt, prompt, tests = "native", text("prompt"), rec["tests"]
        if not isinstance(tests, list) or not tests:
            raise ValueError(f"{where}: 'tests' must be a non-empty list of test records")
    elif "entry_point" in rec or "test" in rec:
        fmt, prompt = "check", text("prompt")
        if not isinstance(rec.get("test"), str) or "def check" not in rec["test"]:
            raise ValueError(f"{where}: a check record needs 'test' holding 'def check(candidate): ...'")
        if not isinstance(rec.get("entry_point"), str):
            raise ValueError(f"{where}: a check record needs 'entry_point' (the function name)")
        tests = [{"check": rec["test"], "entry_point": rec["entry_point"]}]
    elif "test_list" in rec:
        fmt, prompt = "asserts", text("text", "prompt")
        if not isinstance(rec["test_list"], list) or not rec["test_list"]:
            raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert statements")
        tests = [{"asserts": rec["test_list"], "setup": rec.get("test_setup_code", "") or ""}]
    elif "inputs" in rec or "input_output" in rec:
        fmt, prompt = "stdio", text("question", "prompt")
        io = rec if "inputs" in rec else _json_field(rec, "input_output", where)
        ins, outs = io.get("inputs"), io.get("outputs")
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
            raise ValueError(f"{where}: 'inputs' and 'outputs' must be non-empty lists of equal length")
        tests = [{"stdin": str(i), "stdout": str(o)} for i, o in zip(ins, outs)]
    else:
        raise ValueError(
            f"{where}: unknown record shape, keys {sorted(rec)}; expected one of {', '.join(FORMATS)} "
            "('tests' | 'test'+'entry_point' | 'test_list' | 'inputs'+'outputs' / 'input_output')"
        )
    meta: dict[str, Any] = {"tests": tests, "format": fmt}
    if isinstance(rec.get("solution"), str):
        meta["solution"] = rec["solution"]
    uid = rec.get("task_id", rec.get("uid"))
    return Prompt(prompt=prompt, metadata=meta, uid=None if uid is None else str(uid))


def load_code_tasks(path: str | Path = SAMPLES) -> list[Prompt]:
    """Every record of a JSONL file (blank lines skipped), in order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"code task file {str(path)!r} does not exist")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e})") from e
        out.append(record_to_prompt(rec, f"{path}:{n}"))
    if not out:
        raise ValueError(f"{path}: no records")
    return out


def _json_field(rec: dict, key: str, where: str) -> dict:
    try:
        val = json.loads(rec[key]) if isinstance(rec[key], str) else rec[key]
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: {key!r} is not valid JSON ({e})") from e
    if not isinstance(val, dict):
        raise ValueError(f"{where}: {key!r} must hold an object with 'inputs' and 'outputs'")
    return val
