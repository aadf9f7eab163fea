"""The monitoring and curriculum fragments compose with a recipe through the `lit-rl` CLI."""

import warnings
from pathlib import Path

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_monitoring_and_curriculum_fragments_run_through_cli(tmp_path, monkeypatch, tiny_model_dir):
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.callbacks.curriculum import Curriculum
    from lit_rl.callbacks.monitoring import RLHealthMonitor

    monkeypatch.chdir(tmp_path)
    args = [
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "-c",
        str(ROOT / "callbacks/monitoring.yaml"),
        "-c",
        str(ROOT / "callbacks/curriculum.yaml"),
        "--trainer.max_steps",
        "2",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--model.init_args.model",
        str(tiny_model_dir),
        "--data.init_args.batch_size",
        "4",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # max_new_tokens=1 truncates every completion: a real, expected warning
        cli = main(args)
    m = cli.trainer.callback_metrics
    for key in (
        "health/zero_adv_frac",
        "health/zero_var_group_frac",
        "health/invalid_frac",
        "health/warnings",
        "reward/domain/addition",
        "curriculum/solved",
        "curriculum/replaced",
    ):
        assert key in m, key
    assert 0.0 <= float(m["health/zero_adv_frac"]) <= 1.0
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    # callbacks+ appended the Curriculum after the RolloutCallback; setup moved it right before
    assert kinds.index(Curriculum) == kinds.index(RolloutCallback) - 1 and RLHealthMonitor in kinds
    cur = cli.trainer.callbacks[kinds.index(Curriculum)]
    assert (
        cur.iteration == 2 and sum(s["visits"] for s in cur.tracker.stats.values()) == 8
    )  # 2 steps x 4 prompts
    mon = cli.trainer.callbacks[kinds.index(RLHealthMonitor)]
    # the entropy explosion bound was resolved from the model's vocabulary at setup
    import math

    vocab = cli.model.model.config.vocab_size
    assert mon.checks.checks["entropy"].high == 0.9 * math.log(vocab)

    # both states survive a real Lightning checkpoint under torch.load(weights_only=True) and restore exactly
    import torch

    cli.trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"]
    for cb, fresh in ((cur, Curriculum(seed=123)), (mon, RLHealthMonitor())):
        fresh.load_state_dict(saved[cb.state_key])
        assert fresh.state_dict() == cb.state_dict()
