"""Every recipe runs a few RL iterations through the `lit-rl` CLI; callback fragments compose."""
from pathlib import Path

import pytest

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce", "async"]


def _run(tmp_path, monkeypatch, model_dir, *configs, steps=2, extra=()):
    monkeypatch.chdir(tmp_path)
    args = ["fit"]
    for c in configs:
        args += ["-c", str(ROOT / c)]
    args += ["--trainer.max_steps", str(steps), "--trainer.logger", "false", "--trainer.enable_progress_bar",
             "false", "--model.init_args.model", str(model_dir), *extra]
    return main(args)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_through_cli(recipe, tmp_path, monkeypatch, tiny_model_dir):
    cli = _run(tmp_path, monkeypatch, tiny_model_dir, f"configs/{recipe}.yaml")
    m = cli.trainer.callback_metrics
    assert cli.model.iteration >= 1
    assert "reward/mean" in m and "actor/grad_norm" in m
    hp = cli.model.hparams
    import yaml

    preset = yaml.safe_load((ROOT / f"configs/{recipe}.yaml").read_text())["model"]["init_args"]
    for field in ("advantage", "policy_loss", "loss_agg"):  # the preset's independent fields arrive as set
        assert hp[field] == preset[field]


def test_callback_fragment_composes_with_recipe(tmp_path, monkeypatch, tiny_model_dir):
    from lit_rl.callbacks import HeldoutEval, RolloutCallback

    cli = _run(tmp_path, monkeypatch, tiny_model_dir, "configs/grpo.yaml", "callbacks/eval.yaml",
               "callbacks/save_hf.yaml")
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert RolloutCallback in kinds and HeldoutEval in kinds  # appended, not replaced
    assert "eval/accuracy" in cli.trainer.callback_metrics
    assert (tmp_path / "final_model" / "config.json").exists()


def test_unknown_name_in_recipe_fails_at_construction(tmp_path, monkeypatch, tiny_model_dir):
    with pytest.raises((ValueError, SystemExit)):
        _run(tmp_path, monkeypatch, tiny_model_dir, "configs/grpo.yaml",
             extra=["--model.init_args.advantage", "ppo"])


def test_distill_recipe_runs_through_cli(tmp_path, monkeypatch, tiny_model_dir):
    """configs/distill.yaml: DistillModule + TeacherRouter; its teacher path is the quickstart's output, which
    the test fakes with a tiny model (the student is another copy, so the KL starts at 0 — plumbing only)."""
    import shutil

    from lit_rl.callbacks import TeacherRouter
    from lit_rl.modules import DistillModule

    shutil.copytree(tiny_model_dir, tmp_path / "runs/quickstart/final_model")
    cli = _run(tmp_path, monkeypatch, tiny_model_dir, "configs/distill.yaml")
    assert isinstance(cli.model, DistillModule) and cli.model.iteration >= 1
    assert cli.model.losses == {"reverse_kl_full": 1.0}
    assert any(isinstance(cb, TeacherRouter) for cb in cli.trainer.callbacks)
    m = cli.trainer.callback_metrics
    assert "loss/reverse_kl_full" in m and "distill/addition/reverse_kl" in m and "distill/addition/rows" in m
