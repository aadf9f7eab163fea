"""The saved config.yaml names one source of prompts: with train_files the recipe's built-in task is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_train_files_replace_the_recipe_task_in_the_saved_config(tmp_path, monkeypatch):
    from lit_rl.cli import main

    monkeypatch.chdir(ROOT)
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(
            json.dumps({"prompt": "|" * a + "+" + "|" * b + "+|=", "answer": str(a + b + 1)}) + "\n"
            for a in range(1, 4)
            for b in range(1, 3)
        )
    )
    run = tmp_path / "run"
    main(
        [
            "fit",
            "-c",
            "configs/quickstart.yaml",
            "--data.init_args.train_files",
            f"[{train}]",
            "--data.init_args.heldout_files",
            f"[{train}]",
            "--trainer.max_steps",
            "1",
            "--trainer.default_root_dir",
            str(run),
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "2",
        ]
    )
    data = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]
    assert data["train_files"] == [str(train)]
    assert data["task"] is None and not data["task_args"]  # configs/quickstart.yaml says task: addition
