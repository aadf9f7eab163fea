"""The report as a browser draws it (headless Chromium): a one-token task's rows, coinciding eval curves, the
last x-axis label (issue 24, "small things that mislead")."""

from __future__ import annotations

import json
import re

import pytest

from lit_rl.report import write_report
from lit_rl.report.chromium import dump_dom, find_chromium

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not installed (Debian: "
    "apt-get install -y chromium; scripts/install.sh does it with the dev extra)",
)
STEPS = 800  # a long run: 3-digit labels at the right edge


def _one_token_run(tmp_path):
    """A one-token task (max_new_tokens 1): every row stops at the budget, finish reason "length"; held-out
    accuracy equals held-out mean reward (exact-answer reward), so the two eval curves coincide."""
    d = tmp_path / "run" / "rollouts"
    d.mkdir(parents=True)
    for step in (1, STEPS):
        rows = [
            {
                "step": step,
                "group": g,
                "pick": "random",
                "prompt": f"{g}+1=",
                "answer": str(g + 1),
                "completion": str(g + 1 - (j % 2)),
                "reward": float(1 - j % 2),
                "advantage": 0.5 - j % 2,
                "finish": "length",
                "length": 1,
                "policy_version": step - 1,
                "staleness": 0,
                "logprob": -0.7,
                "error": None,
                "components": {"exact": float(1 - j % 2)},
                "row": 2 * g + j,
            }
            for g in range(3)
            for j in range(2)
        ]
        (d / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = [
        {"step": s, "reward/mean": 0.5, "rollout/truncation_rate": 1.0} for s in range(1, STEPS + 1, 50)
    ]
    metrics += [
        {"step": s, "eval/accuracy": a, "eval/reward_mean": a}
        for s, a in ((0, 0.1), (400, 0.6), (STEPS, 0.9))
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return write_report(d.parent)


def test_one_token_rows_say_budget_reached_not_length(tmp_path):
    dom = dump_dom(_one_token_run(tmp_path).as_uri() + "#pagesize=100")
    tbody = dom[
        dom.index('<tbody id="tbody">') : dom.index("</tbody>")
    ]  # the drawn rows, not the script's source
    rows = re.findall(r'<tr class="row"[^>]*data-finish="([^"]*)">(.*?)</tr>', tbody, flags=re.DOTALL)
    assert len(rows) == 6, dom[-3000:]  # the last step's 3 groups x 2
    for finish, body in rows:
        attrs, text = re.findall(r"<td([^>]*)>(.*?)</td>", body, flags=re.DOTALL)[5]  # the finish column
        assert finish == "length" and text == "budget reached" and "max_new_tokens" in attrs, body
    controls = dom[dom.index('<section id="controls">') : dom.index('<section id="diff"')]
    assert "budget reached only" in controls and "truncated only" not in controls
    assert "rollout/truncation_rate (budget reached)" in dom  # the curve's legend says what the rate counts


def _svgs(dom):
    dom = dom[dom.index('<section id="curves">') : dom.index('<section id="controls">')]
    return re.findall(
        r'<svg width="(\d+)" height="\d+" data-x0="[^"]*" data-x1="[^"]*" data-l="\d+" data-r="(\d+)">(.*?)</svg>',
        dom,
        flags=re.DOTALL,
    )


def test_coinciding_eval_curves_both_visible_and_last_x_label_inside(tmp_path):
    dom = dump_dom(_one_token_run(tmp_path).as_uri())
    charts = _svgs(dom)
    assert charts
    for width, right, body in charts:
        lines = re.findall(
            r'<polyline class="curve" data-key="([^"]+)" fill="none" stroke="([^"]+)" '
            r'stroke-width="([^"]+)" stroke-dasharray="([^"]*)" points="([^"]+)"',
            body,
        )
        for i, (k1, c1, w1, _d1, p1) in enumerate(
            lines
        ):  # a curve drawn over an identical one must not hide it
            for k2, c2, w2, d2, p2 in lines[i + 1 :]:
                if p1 == p2:
                    assert float(w2) < float(w1) and d2 and c2 != c1, (k1, k2)
        labels = [
            (float(x), a, t)
            for x, a, t in re.findall(
                r'<text x="([0-9.]+)" y="\d+(?:\.\d+)?" text-anchor="(\w+)">([^<]+)</text>', body
            )
        ]
        assert labels, body[:500]
        x, anchor, text = max(labels)
        # the rightmost label ends at the plot's right edge: drawn centred there, its right half was clipped
        assert anchor == "end" and x <= int(width) - int(right) + 1e-6, (x, anchor, text, width)
    reward = next(body for _, _, body in charts if 'data-key="eval/accuracy"' in body)
    assert 'data-key="eval/reward_mean"' in reward
