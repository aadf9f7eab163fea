"""Held-out evaluation through Lightning's validation loop: logged only where measured, `lit-rl validate`
evaluates a checkpoint, torchmetrics accumulation is exact across batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rl.cli import main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = 44  # the quickstart's held-out operand triples
COMMON = ["--rollout.group_size", "2", "--trainer.enable_progress_bar", "false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The quickstart (plus the eval fragment, composed as README shows), 4 iterations, evaluated every 2."""
    root = tmp_path_factory.mktemp("val") / "run"
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "-c",
            str(ROOT / "callbacks/eval.yaml"),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "2",
            "--data.init_args.batch_size",
            "8",
            *COMMON,
        ]
    )
    return root, cli


def test_eval_metrics_appear_only_on_the_steps_they_were_measured(run):
    from lit_rl.callbacks import HeldoutEval

    root, cli = run
    rows = log_rows(root / "logs" / "metrics.csv")
    evals = [(int(r["step"]), r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    # baseline at step 0, then after iterations 2 and 4, logged at those steps (iteration i is step i)
    assert [s for s, _ in evals] == [0, 2, 4]
    assert sorted({int(r["step"]) for r in rows if "reward/mean" in r}) == [1, 2, 3, 4]
    (ev,) = [
        cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval)
    ]  # the fragment replaced the recipe's
    assert [h["step"] for h in ev.history] == [0.0, 2.0, 4.0]
    assert [h["eval/accuracy"] for h in ev.history] == pytest.approx([a for _, a in evals], abs=1e-7)
    for _, acc in evals:  # a fraction of the 44 prompts: accumulated over all 6 batches, not a mean of means
        assert acc * HELD_OUT == pytest.approx(round(acc * HELD_OUT), abs=1e-4)


@pytest.mark.parametrize("batch_size, ckpt", [(8, "last"), (44, "last"), (8, "file")])
def test_validate_subcommand_evaluates_the_checkpoint(run, batch_size, ckpt):
    """`lit-rl validate --ckpt_path last` (or the checkpoint file's path) on the run directory gives the fit's
    final held-out accuracy, with any batch size (6 uneven batches or 1)."""
    root, _ = run
    if ckpt == "file":
        ckpt = str((root / "checkpoints" / "last.ckpt").resolve())
    final = [r["eval/accuracy"] for r in log_rows(root / "logs" / "metrics.csv") if "eval/accuracy" in r][-1]
    cli = main(
        [
            "validate",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(root),
            "--ckpt_path",
            ckpt,
            "--data.init_args.batch_size",
            str(batch_size),
            *COMMON,
        ]
    )
    assert float(cli.trainer.callback_metrics["eval/accuracy"]) == pytest.approx(final, abs=1e-7)
    assert (root / "validate" / "metrics.csv").exists()
    assert (root / "config.yaml").read_text().count("max_steps: 4")  # the run's own config is untouched


def test_no_validation_without_heldout_eval(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo.yaml"),
            "--model.init_args.model",
            str(tiny_model_dir),
            "--trainer.max_steps",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--data.init_args.batch_size",
            "4",
            *COMMON,
        ]
    )
    assert not [k for k in cli.trainer.callback_metrics if k.startswith("eval/")]


@pytest.mark.parametrize("weight, accuracy", [(1.0, 1.0), (0.5, 0.0)])
def test_accuracy_is_the_runs_reward(tmp_path, weight, accuracy):
    """eval/accuracy counts the run's own reward >= 1 (the recipe's reward replaced by one that accepts every
    completion, weighted): never a scorer the user did not choose (exact answer would give ~0 here: an
    untrained model). Weight 0.5: every reward is 0.5 < 1, so nothing is correct while reward_mean is 0.5."""
    rewards = {
        "rewards": {
            "anything": {
                "class_path": "lit_rl.rewards.verifiers.RegexFormatReward",
                "init_args": {"pattern": "(?s).*"},
            }
        },
        "weights": {"anything": weight},
    }
    cli = main(
        [
            "validate",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--rollout.rewards.init_args",
            json.dumps(rewards),
            "--trainer.logger",
            "false",
            *COMMON,
        ]
    )
    m = cli.trainer.callback_metrics
    assert float(m["eval/reward_mean"]) == pytest.approx(weight)
    assert float(m["eval/accuracy"]) == accuracy
