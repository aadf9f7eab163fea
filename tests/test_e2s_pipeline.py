"""scripts/experts_to_student.py --tiny end to end (every stage through `lit-rl fit` processes on a tiny
model): the table has every run and column, and a second invocation skips every finished run and resumes only
the one whose done-marker is gone. Slow: 12 + 1 `lit-rl fit` processes, the first 12 two at a time (`--jobs 2`;
~2 min on 2 quiet cores)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _script():
    spec = importlib.util.spec_from_file_location(
        "experts_to_student", ROOT / "scripts/experts_to_student.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STUDENTS = [
    "opd_multi",
    "grpo",
    "opd_single",
    "opsd",
    "opsd_frozen",
    "opd_lora_r2",
    "grpo_lora_r2",
    "opd_lora_r8",
    "grpo_lora_r8",
]
EXPERTS = ["expert_addition", "expert_multiplication", "addition_then_multiplication"]


def test_tiny_pipeline_table_and_resume(tmp_path, capsys):
    e2s, out = _script(), tmp_path / "e2s"
    e2s.main(["--tiny", "--out", str(out), "--jobs", "2"])  # two runs at a time (the resume below: one)
    first = capsys.readouterr().out
    assert first.count("[run ] ") == len(STUDENTS) + len(EXPERTS) and "[skip]" not in first
    assert first.count("[done] ") == len(STUDENTS) + len(EXPERTS)

    report = (out / "report.md").read_text()
    table, forgetting = report.split("Forgetting")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    head = "| run | addition | multiplication | mean | mean @ "
    assert next(line for line in table.splitlines() if line.startswith("| run | addition")).startswith(head)
    for name in ["start (step 0)", *EXPERTS, *STUDENTS]:
        cells = rows[name].strip("|").split("|")
        assert len(cells) == 8, (name, cells)  # run, 2 domains, mean, mean @ wall, wall, tokens, peak RSS
    for name in STUDENTS:  # every student sampled tokens and has a measured peak memory
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert float(cells[6]) > 0 and float(cells[7]) > 0.1, (name, cells)
    assert "| expert_multiplication | multiplication |" in forgetting  # addition while multiplication trains
    assert "| addition_then_multiplication | multiplication |" in forgetting
    assert (out / "e2s.png").stat().st_size > 10_000
    assert "Runs went 2 at a time (`--jobs 2`)" in report

    # the OPSD student's teacher read the privileged prompt; the multi-teacher run routed both domains
    opsd = (out / "students/opsd/seed0/recipe.yaml").read_text()
    assert "(The correct answer is {answer}.)" in opsd and "source: self\n" in opsd
    frozen = yaml.safe_load((out / "students/opsd_frozen/seed0/recipe.yaml").read_text())
    router = next(c for c in frozen["trainer"]["callbacks"] if c["class_path"].endswith("TeacherRouter"))
    assert router["init_args"]["fallback"] == "addition"  # one frozen copy for both domains
    assert router["init_args"]["teachers"]["addition"]["init_args"]["source"] == "self_frozen"
    multi = json.loads((out / "students/opd_multi/seed0/DONE.json").read_text())
    assert {"eval/accuracy/addition", "eval/accuracy/multiplication"} <= set(multi["history"][-1])

    # resume: finished runs are skipped; a run without its done-marker runs again (from its last checkpoint)
    (out / "students/opsd/seed0/DONE.json").unlink()
    e2s.main(["--tiny", "--out", str(out)])
    again = capsys.readouterr().out
    assert again.count("[skip] ") == len(STUDENTS) + len(EXPERTS) - 1
    assert again.count("[run ] ") == 1 and "[run ] student opsd seed 0" in again
    assert (out / "students/opsd/seed0/DONE.json").exists()
    assert "at a time" not in (out / "report.md").read_text()


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        _script()._args(["--jobs", "0"])
    assert "--jobs=0 must be >= 1" in capsys.readouterr().err
