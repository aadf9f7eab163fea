"""Issue 26 §5: a logger of the user's own is added to the run directory's CSV / TensorBoard loggers (as
TRL's report_to adds W&B to what a run writes anyway), --run_loggers false keeps only the user's; every run logs
the learning rate and tokens seen."""

from __future__ import annotations

from pathlib import Path

from lit_rl.cli import main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.max_steps",
    "1",
]


def _fit(run: Path, *extra: str):
    return main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(run),
            *SMALL,
            *extra,
        ]
    )


def test_added_logger_keeps_the_run_directory_loggers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, mine = tmp_path / "run", tmp_path / "mine"
    cli = _fit(
        run,
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        str(mine),
        "--trainer.logger.name",
        "extra",
    )
    kinds = [type(lg).__name__ for lg in cli.trainer.loggers]
    assert kinds[-1] == "CSVLogger" and cli.trainer.loggers[-1].save_dir == str(mine)
    assert "TensorBoardLogger" in kinds and len(kinds) == 3
    assert list((run / "tb").glob("events.out.tfevents.*"))
    for path in (run / "logs/metrics.csv", mine / "extra/version_0/metrics.csv"):  # both get every metric
        keys = set().union(*log_rows(path))
        assert {"reward/mean", "lr-AdamW", "tokens_seen", "rollout/response_len_stopped_mean"} <= keys, path
    # the learning rate of the recipe's AdamW, as logged
    assert [r["lr-AdamW"] for r in log_rows(run / "logs/metrics.csv") if "lr-AdamW" in r] == [2e-3]


def test_recipe_lr_schedule_is_a_class_path_and_follows_max_steps(tmp_path, monkeypatch):
    """The quickstart's ``lr_scheduler`` (a class_path with init_args, as users write for any scheduler: before, the
    argument's type refused every class_path) decays over ``${trainer.max_steps}`` as resolved after the command
    line's override: lr_t = 2e-3 · (1 + cos(π t / 4)) / 2 at the 4 logged iterations t = 0..3."""
    import math

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    cli = _fit(run, "--trainer.max_steps", "4")
    sched = cli.trainer.lr_scheduler_configs[0].scheduler
    assert type(sched).__name__ == "CosineDecay" and sched.total_steps == 4
    got = [r["lr-AdamW"] for r in log_rows(run / "logs/metrics.csv") if "lr-AdamW" in r]
    want = [2e-3 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(4)]
    assert len(got) == 4 and all(abs(g - w) <= 1e-12 for g, w in zip(got, want)), (got, want)


def test_run_loggers_false_keeps_only_the_users(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, mine = tmp_path / "run", tmp_path / "mine"
    cli = _fit(
        run,
        "--run_loggers",
        "false",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        str(mine),
    )
    assert [type(lg).__name__ for lg in cli.trainer.loggers] == ["CSVLogger"]
    assert not (run / "logs").exists() and not (run / "tb").exists()
    assert (mine / "lightning_logs/version_0/metrics.csv").is_file()


def test_logger_false_is_no_logger_and_no_lr_monitor(tmp_path, monkeypatch):
    """LearningRateMonitor refuses a trainer without loggers, so it is only added when there is one."""
    monkeypatch.chdir(tmp_path)
    cli = _fit(tmp_path / "run", "--trainer.logger", "false")
    assert cli.trainer.loggers == [] and cli.model.iteration == 1
    assert not any(type(c).__name__ == "LearningRateMonitor" for c in cli.trainer.callbacks)
    assert float(cli.trainer.callback_metrics["tokens_seen"]) > 0


def test_a_run_whose_config_sets_no_logging_interval_logs_every_iteration(tmp_path, monkeypatch):
    """A config without trainer.log_every_n_steps (Lightning's default: every 50 steps) trains 2 iterations:
    logs/metrics.csv holds both (it was not written at all)."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "bare.yaml"
    cfg.write_text(
        "trainer: {max_steps: 2, max_epochs: -1, enable_progress_bar: false}\n"
        "model:\n  class_path: lit_rl.learners.PolicyModule\n  init_args:\n    model: model\n"
        "    tiny_if_missing: {layers: 1, hidden: 32, heads: 2, tokenizer: char}\n"
        "data:\n  class_path: lit_rl.data.PromptDataModule\n  init_args: {task: addition, batch_size: 2}\n"
        "rollout:\n  group_size: 2\n  sampling: {max_new_tokens: 1}\n  rewards: lit_rl.rewards.ExactAnswerReward\n"
    )
    cli = main(["fit", "-c", str(cfg), "--trainer.default_root_dir", str(tmp_path / "run")])
    assert cli.trainer.log_every_n_steps == 1
    rows = log_rows(tmp_path / "run/logs/metrics.csv")
    assert sorted({int(r["step"]) for r in rows if "reward/mean" in r}) == [1, 2]
