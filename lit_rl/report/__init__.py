"""`lit-rl inspect RUN_DIR [-o report.html]`: one self-contained HTML page of a run's rollouts.

Reads what ``RolloutInspector`` wrote (``RUN_DIR/rollouts/step_*.jsonl`` and ``metrics.jsonl``; RUN_DIR may
also be the rollouts folder itself) and writes one static file: the data as compact JSON inside a
``<script type="application/json">`` tag, plus inline CSS and JavaScript (``_template.py``) -- no server,
network or CDN. Rows are stored as arrays with prompts interned (a prompt seen at many steps is stored
once), so 800 steps x 64 rows stay a few MB; the page renders one page of groups at a time.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lit_rl.jsonl import clean_text, read_jsonl
from lit_rl.report._template import TEMPLATE

# Per-row array layout in the embedded JSON (the page's JavaScript reads the same order).
ROW_FIELDS = (
    "row",
    "group",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "finish",
    "length",
    "policy_version",
    "staleness",
    "logprob",
    "error",
    "pick",
    "components",
    "extra",
    "turns",
)
_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


def find_rollouts(run_dir: str | Path) -> Path:
    """The folder holding ``step_*.jsonl``: ``run_dir/rollouts`` or ``run_dir`` itself."""
    run_dir = Path(run_dir)
    for d in (run_dir / "rollouts", run_dir):
        if d.is_dir() and (any(d.glob("step_*.jsonl")) or (d / "metrics.jsonl").exists()):
            return d
    raise FileNotFoundError(
        f"{run_dir}: no rollouts found (expected {run_dir / 'rollouts'}/step_*.jsonl, written by "
        "the RolloutInspector callback: add `-c callbacks/inspect.yaml` to the run)"
    )


def _num(x, digits: int = 4):
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return x if isinstance(x, int) else round(x, digits)


def _records(path: Path, skipped: list[str]) -> Iterator[dict]:
    r"""The objects of one rollout / metrics file, lines split at "\n" only (``lit_rl.jsonl``: a prompt holding
    U+2028 is one line). A line that is not a JSON object (a process killed mid-write leaves a torn one) is left
    out and named in ``skipped`` as ``file:line: why``: counted and shown, never the end of the report."""
    for line in read_jsonl(path):
        if line.error is None and isinstance(line.value, dict):
            yield line.value
        else:
            why = line.error or f"a JSON {type(line.value).__name__}, not an object"
            skipped.append(f"{path.name}:{line.lineno}: {why}")


def _call_text(c) -> str:
    if not isinstance(c, dict):
        return str(c)
    if "error" in c:
        return f"error: {c['error']}"
    return f"{c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"


def _turns(turns) -> list[list] | None:
    """An agent episode's turns (``RolloutInspector``'s ``turns``) as [turn, tool calls, reward, advantage, action
    tokens] each: what the page lists under the episode (the action and observation texts are the completion's)."""
    if not isinstance(turns, list) or not turns:
        return None
    out = []
    for t in turns:
        if not isinstance(t, dict):
            continue
        calls = t.get("tool_calls")
        out.append(
            [
                t.get("turn"),
                None if calls is None else [_call_text(c) for c in calls],
                _num(t.get("reward")),
                _num(t.get("advantage")),
                t.get("action_tokens"),
            ]
        )
    return out


def load_run(rollouts: Path) -> dict:
    """The report's data: steps, interned prompts, component names, rows per step, metric curves."""
    prompts: list[list] = []  # [text, answer, uid]
    index: dict[tuple, int] = {}
    comp_names: list[str] = []
    rows: dict[str, list] = {}
    skipped: list[str] = []
    files = sorted(
        (int(m.group(1)), p) for p in rollouts.glob("step_*.jsonl") if (m := _STEP_FILE.search(p.name))
    )
    for step, path in files:
        out = []
        for r in _records(path, skipped):
            key = (r.get("prompt", ""), r.get("answer"), r.get("uid"))
            if key not in index:
                index[key] = len(prompts)
                prompts.append(list(key))
            comps = r.get("components") or {}
            for k in comps:
                if k not in comp_names:
                    comp_names.append(k)
            rec = {
                **r,
                "prompt": index[key],
                "components": [_num(comps.get(k)) for k in comp_names],
                "turns": _turns(r.get("turns")),
            }
            out.append(
                [
                    _num(rec.get(f)) if f in ("reward", "advantage", "logprob") else rec.get(f)
                    for f in ROW_FIELDS
                ]
            )
        rows[str(step)] = out
    curves: dict[str, dict[int, float]] = {}
    mpath = rollouts / "metrics.jsonl"
    if mpath.exists():
        for rec in _records(mpath, skipped):
            step = rec.pop("step", None)
            for k, v in rec.items():
                if step is not None and _num(v) is not None:
                    curves.setdefault(k, {})[int(step)] = _num(v)  # a resumed run's rewrite wins
    return {
        "steps": [s for s, _ in files],
        "prompts": prompts,
        "components": comp_names,
        "fields": list(ROW_FIELDS),
        "rows": rows,
        "curves": {k: sorted(v.items()) for k, v in sorted(curves.items())},
        "skipped": skipped,
    }


def render(data: dict, title: str) -> str:
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # "<" stands only inside JSON strings, where \u003c is the same character: no "</script" or "<!--" can end
    # or change the <script> element (a "<\\!--" escape, used before, is not JSON: such a completion emptied the
    # page). clean_text: a lone surrogate has no UTF-8 form; the file must still be written.
    blob = clean_text(blob.replace("<", "\\u003c"))
    values = {
        "TITLE": html.escape(clean_text(title)),
        "GENERATED": time.strftime("%Y-%m-%d %H:%M:%S"),
        "DATA": blob,
    }
    # one pass: a title or a row holding "%%DATA%%" is text, never a place to fill
    return re.sub(r"%%(TITLE|GENERATED|DATA)%%", lambda m: values[m.group(1)], TEMPLATE)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Build the report of ``run_dir`` into ``out`` (default: ``<run dir>/report.html``); returns its path."""
    return build_report(run_dir, out)[0]


def build_report(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, list[str]]:
    """``write_report``, also returning the file lines it left out (``file:line: why``, ``load_run``)."""
    rollouts = find_rollouts(run_dir)
    run_root = rollouts.parent if rollouts.name == "rollouts" else rollouts
    out = Path(out) if out is not None else run_root / "report.html"
    data = load_run(rollouts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data, f"lit_rl rollouts: {run_root.resolve().name}"), encoding="utf-8")
    return out, data["skipped"]


def skipped_note(skipped: list[str], limit: int = 5) -> str:
    more = f" and {len(skipped) - limit} more" if len(skipped) > limit else ""
    return f"{len(skipped)} line(s) that are not records were left out: {'; '.join(skipped[:limit])}{more}"


def main(argv: list[str] | None = None) -> int:
    """``lit-rl inspect RUN_DIR [-o report.html]``; returns the exit code."""
    ap = argparse.ArgumentParser(
        prog="lit-rl inspect",
        description="Write a self-contained HTML report of a run's "
        "rollouts (the files RolloutInspector writes under RUN_DIR/rollouts).",
    )
    ap.add_argument("run_dir", help="the run's directory (trainer.default_root_dir) or its rollouts/ folder")
    ap.add_argument(
        "-o", "--output", default=None, help="where to write the HTML (default: RUN_DIR/report.html)"
    )
    args = ap.parse_args(argv)
    try:
        out, skipped = build_report(args.run_dir, args.output)
    except FileNotFoundError as e:
        print(f"lit-rl inspect: {e}", file=sys.stderr)
        return 2
    if skipped:
        print(f"lit-rl inspect: warning: {skipped_note(skipped)}", file=sys.stderr)
    size = out.stat().st_size
    # a folder name that is not UTF-8 holds lone surrogates (surrogateescape), which stdout cannot encode
    print(f"wrote {clean_text(str(out))} ({size / 1e6:.2f} MB)")
    return 0
