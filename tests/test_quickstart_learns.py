"""End to end: the quickstart recipe, shortened, learns from scratch with RL only (CI variant)."""

from pathlib import Path

import pytest
from _learning import record, seed_args

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = (
    pytest.mark.slow
)  # the whole recipe: 500 GRPO iterations of 256 rollouts, about a minute on 2 quiet cores


def test_quickstart_learns_from_scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(
        tmp_path
    )  # the recipe's run directory is runs/quickstart, relative to the working directory
    cli = main(["fit", "-c", str(ROOT / "configs/quickstart.yaml"), *seed_args()])
    from lit_rl.callbacks import HeldoutEval

    ev = next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval))
    acc = [h["eval/accuracy"] for h in ev.history]
    record("quickstart/heldout_accuracy", first=acc[0], best=max(acc), min_last8=min(acc[-8:]), curve=acc)
    assert len(acc) == 21, acc  # iterations 0, 25, ..., 500
    assert acc[0] <= 0.15, acc  # a random-init model cannot do the task
    # the recipe's promise: >= 0.95 (42 of 44 held-out triples) and held to the end. Measured over seeds x CPU
    # kernels (docs/learning_tests.md): best 0.977 (43 of 44) in every run, and >= 0.954 at every evaluation
    # after it was first reached; the reached bar keeps 1 triple of margin, the held bar 2.
    assert max(acc) >= 0.95, acc
    assert min(acc[-8:]) >= 0.90, acc  # iterations 325..500
    run = tmp_path / "runs/quickstart"
    assert (run / "reward_curve.png").stat().st_size > 1000
    assert (run / "final_model/config.json").exists() and (run / "final_model/model.safetensors").exists()
    assert "eval/accuracy" in (run / "logs/metrics.csv").read_text().splitlines()[0]
    assert (run / "checkpoints/last.ckpt").exists() and (run / "config.yaml").exists()
