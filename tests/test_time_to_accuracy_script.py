"""scripts/time_to_accuracy.py: it reads the evaluation lines ProgressLog prints, and says when a target was
reached and whether it held (the long runs themselves are the script's job; their table is in the README)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from time_to_accuracy import EVAL_LINE, main, reached


def test_reads_progresslogs_evaluation_line():
    # the line lit_rl.callbacks.progress.ProgressLog prints (keys sorted, per-domain keys after the total)
    line = (
        "Evaluation at iteration 16: eval/accuracy 0.8550, eval/accuracy/addition 0.8550, "
        "eval/reward_mean 0.86"
    )
    m = EVAL_LINE.search(line)
    assert m is not None and (int(m.group(1)), float(m.group(2))) == (16, 0.855)
    assert EVAL_LINE.search("Iteration 16/48: reward/mean 0.55, 12.00 s/it") is None


@pytest.mark.parametrize(
    ("accs", "want"),
    [
        ([0.5, 0.86, 0.9], (20.0, True)),  # reached at the second evaluation and held
        ([0.5, 0.86, 0.84], (20.0, False)),  # reached, then fell below
        ([0.5, 0.6, 0.7], (None, False)),  # never reached
        ([0.85, 0.85, 0.85], (10.0, True)),  # >= counts
    ],
)
def test_first_time_at_target_and_whether_it_held(accs, want):
    evals = [(10.0 * (i + 1), 8 * (i + 1), a) for i, a in enumerate(accs)]
    assert reached(evals, 0.85) == want


def test_target_outside_0_1_is_refused_before_any_run(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--target", "85", "--seeds", "0"])
    assert e.value.code == 2 and "--target must be in (0, 1], got 85.0" in capsys.readouterr().err
