"""scripts/experts_to_student.py --tiny end to end (every stage through `lit-rl fit` processes on a tiny
model): the table has every run and column, and a second invocation skips every finished run and resumes only
the one whose done-marker is gone. Slow: 13 + 1 `lit-rl fit` processes, the first 13 two at a time (`--jobs 2`;
~2 min on 2 quiet cores)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


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
    "grpo_x2",
]
EXPERTS = ["expert_addition", "expert_largest", "addition_then_largest"]


@pytest.mark.slow
def test_tiny_pipeline_table_and_resume(tmp_path, capsys):
    e2s, out = _script(), tmp_path / "e2s"
    e2s.main(["--tiny", "--out", str(out), "--jobs", "2"])  # two runs at a time (the resume below: one)
    first = capsys.readouterr().out
    assert first.count("[run ] ") == len(STUDENTS) + len(EXPERTS) and "[skip]" not in first
    assert first.count("[done] ") == len(STUDENTS) + len(EXPERTS)

    report = (out / "report.md").read_text()
    table, forgetting = report.split("Forgetting")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    head = "| run | addition | largest | mean | mean @ "
    assert next(line for line in table.splitlines() if line.startswith("| run | addition")).startswith(head)
    for name in ["start (step 0)", *EXPERTS, *STUDENTS]:
        cells = rows[name].strip("|").split("|")
        assert len(cells) == 9, (name, cells)  # run, 2 domains, mean, 2 x mean @ wall, wall, tokens, peak RSS
    for name in STUDENTS:  # every student sampled tokens and has a measured peak memory
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert float(cells[7]) > 0 and float(cells[8]) > 0.1, (name, cells)
    # at opd_multi's own wall time its mean is its final mean (the second "mean @" column is its budget)
    opd = [c.strip() for c in rows["opd_multi"].strip("|").split("|")]
    assert opd[5] == opd[3], opd
    assert "| expert_largest | largest |" in forgetting  # addition while largest trains
    assert "| addition_then_largest | largest |" in forgetting
    assert (out / "e2s.png").stat().st_size > 10_000
    assert "Runs went 2 at a time (`--jobs 2`)" in report

    # the OPSD student's teacher read the privileged prompt; the multi-teacher run routed both domains
    opsd = (out / "students/opsd/seed0/recipe.yaml").read_text()
    assert "(The correct answer is {answer}.)" in opsd and "source: self\n" in opsd
    frozen = yaml.safe_load((out / "students/opsd_frozen/seed0/recipe.yaml").read_text())
    router = next(c for c in frozen["trainer"]["callbacks"] if c["class_path"].endswith("TeacherRouter"))
    assert router["init_args"]["fallback"] == "addition"  # one frozen copy for both domains
    assert router["init_args"]["teachers"]["addition"]["init_args"]["source"] == "self_frozen"
    x2 = yaml.safe_load((out / "students/grpo_x2/seed0/recipe.yaml").read_text())
    grpo = yaml.safe_load((out / "students/grpo/seed0/recipe.yaml").read_text())
    assert x2["trainer"]["max_steps"] == 2 * grpo["trainer"]["max_steps"] and "Router" not in str(x2)
    multi = json.loads((out / "students/opd_multi/seed0/DONE.json").read_text())
    assert {"eval/accuracy/addition", "eval/accuracy/largest"} <= set(multi["history"][-1])

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


def _done(name: str, evals: list[tuple[float, float, float]]) -> dict:
    """A run's DONE.json with (wall_s, addition, largest) evaluations."""
    history = [
        {"wall_s": w, "student_tokens": 100.0 * k, "eval/accuracy/addition": x, "eval/accuracy/largest": y}
        for k, (w, x, y) in enumerate(evals)
    ]
    return {"name": name, "elapsed_s": evals[-1][0], "peak_rss_mb": 5120.0, "history": history}


def test_report_compares_at_the_shortest_students_time_and_at_opd_multis():
    e2s = _script()
    a = e2s._args(["--out", "/tmp/unused", "--domains", "addition,largest", "--iterations", "16"])
    experts = {"expert_addition": _done("expert_addition", [(0, 0.2, 0.3), (50, 0.7, 0.3)])}
    students = {
        "grpo": [_done("grpo", [(0, 0.2, 0.3), (40, 0.5, 0.5), (80, 0.6, 0.6)])],
        "opd_multi": [_done("opd_multi", [(0, 0.2, 0.3), (60, 0.4, 0.4), (120, 0.8, 1.0)])],
        "grpo_x2": [_done("grpo_x2", [(0, 0.2, 0.3), (40, 0.5, 0.5), (80, 0.6, 0.6), (120, 0.7, 0.7)])],
    }
    table = e2s.report(a, experts, students).split("Forgetting")[0]
    rows = {ln.split("|")[1].strip(): ln for ln in table.splitlines() if "|" in ln}
    assert "| mean | mean @ 80 s | mean @ 120 s | wall s |" in rows["run"]
    # opd_multi: its 60 s evaluation is the last within 80 s (0.40), its final one within its own 120 s (0.90)
    assert rows["opd_multi"] == "| opd_multi | 0.80 | 1.00 | 0.90 | 0.40 | 0.90 | 120 | 200 | 5.00 |"
    assert rows["grpo_x2"] == "| grpo_x2 | 0.70 | 0.70 | 0.70 | 0.60 | 0.70 | 120 | 300 | 5.00 |"
    assert rows["expert_addition"] == "| expert_addition | 0.70 | 0.30 | 0.50 | | | 50 | 100 | 5.00 |"
    # without opd_multi (a --variants subset) there is one equal-time column, not a crash
    del students["opd_multi"]
    table = e2s.report(a, experts, students).split("Forgetting")[0]
    rows = {ln.split("|")[1].strip(): ln for ln in table.splitlines() if "|" in ln}
    assert "| mean | mean @ 80 s | wall s |" in rows["run"]
    assert rows["grpo_x2"] == "| grpo_x2 | 0.70 | 0.70 | 0.70 | 0.60 | 120 | 300 | 5.00 |"
    # a run whose step-0 evaluation came after that time (its set-up) is read at that baseline, not dropped
    late = _done("grpo", [(90, 0.2, 0.3), (200, 0.9, 0.9)])["history"]
    assert e2s._at_wall(late, 80) is late[0] and e2s._at_wall(late, 200) is late[1]


@pytest.mark.slow
def test_variants_that_read_no_expert_skip_the_expert_stage(tmp_path, capsys):
    """`--variants opsd,grpo`: two student runs, no expert or forgetting run, a table without the forgetting
    section; a variant that reads an expert (opd_single) brings the expert stage back."""
    e2s, out = _script(), tmp_path / "e2s"
    e2s.main(["--tiny", "--out", str(out), "--variants", "opsd,grpo"])
    printed = capsys.readouterr().out
    assert (
        printed.count("[run ] ") == 2 and "[run ] student opsd seed 0" in printed and "expert" not in printed
    )
    assert not (out / "experts").exists()
    report = (out / "report.md").read_text()
    rows = [ln.split("|")[1].strip() for ln in report.splitlines() if ln.startswith("| ")]
    assert rows == ["run", "start (step 0)", "grpo", "opsd"] and "Forgetting" not in report
    # the check pipeline() makes: a student's recipe names an expert's path, or not
    a = e2s._args(["--tiny", "--out", str(out)])
    experts = {d: str(out / "experts" / d / "final_model") for d in a.domains}
    reads = {
        name: str(out / "experts") in yaml.safe_dump(change(e2s._student_recipe(a, "m", name, 0)))
        for name, change in e2s.student_variants(a, experts).items()
    }
    assert {n for n, r in reads.items() if r} == {"opd_multi", "opd_single", "opd_lora_r2", "opd_lora_r8"}
