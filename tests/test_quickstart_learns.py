"""End to end: the quickstart recipe, shortened, learns from scratch with RL only (CI variant)."""
from pathlib import Path

import pytest
from _learning import record, seed_args

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # 200 GRPO iterations of 256 rollouts: minutes on 2 cores


def test_quickstart_learns_from_scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's run directory is runs/quickstart, relative to the working directory
    cli = main(["fit", "-c", str(ROOT / "configs/quickstart.yaml"), "--trainer.max_steps", "200",
                *seed_args()])
    from lit_rl.callbacks import HeldoutEval

    ev = next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval))
    acc = [h["eval/accuracy"] for h in ev.history]
    record("quickstart/heldout_accuracy", first=acc[0], best_last2=max(acc[-2:]), curve=acc)
    assert acc[0] <= 0.15, acc  # a random-init model cannot do the task
    assert max(acc[-2:]) >= acc[0] + 0.30, acc  # held-out accuracy rose by at least 30 points
    run = tmp_path / "runs/quickstart"
    assert (run / "reward_curve.png").stat().st_size > 1000
    assert (run / "final_model/config.json").exists() and (run / "final_model/model.safetensors").exists()
    assert "eval/accuracy" in (run / "logs/metrics.csv").read_text().splitlines()[0]
    assert (run / "checkpoints/last.ckpt").exists() and (run / "config.yaml").exists()
