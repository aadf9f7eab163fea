"""End to end: PPO with a critic on the policy's backbone (configs/ppo.yaml) learns the quickstart task, and
its critic explains the returns of rollouts on held-out prompts (CI variant of the recipe)."""

from pathlib import Path

import pytest
from _learning import record, seed_args

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_ppo_learns_and_critic_generalises(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)  # the recipe's run directory (runs/ppo) goes here
    # tiny_model_dir is the quickstart's random-init model (same sizes and seed): what the recipe points at
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/ppo.yaml"),
            "--trainer.max_steps",
            "400",
            "--model.init_args.model",
            str(tiny_model_dir),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "false",
            *seed_args(),
        ]
    )
    from lit_rl.callbacks import HeldoutEval

    ev = next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval))
    acc = [h["eval/accuracy"] for h in ev.history]
    assert acc[0] <= 0.15, acc
    assert max(acc[-2:]) >= acc[0] + 0.30, acc  # held-out greedy accuracy rose by at least 30 points
    evs = [h["eval/critic_explained_variance"] for h in ev.history]
    record("ppo/heldout", first=acc[0], best_last2=max(acc[-2:]), ev_last=evs[-1], curve=acc)
    assert evs[-1] > 0.3, evs  # the value head predicts returns on prompts it never trained on
