"""One run directory, resume that never silently restarts, one-line configuration errors, model sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lit_rl.cli import ConfigError, main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
]


def _quickstart(run: Path, *extra: str, steps: int = 2):
    return main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(run),
            "--trainer.max_steps",
            str(steps),
            *SMALL,
            *extra,
        ]
    )


def _steps(run: Path, key: str = "reward/mean") -> list[int]:
    """The steps of the CSV rows holding ``key`` (training rows; eval rows are their own rows)."""
    return [int(r["step"]) for r in log_rows(run / "logs" / "metrics.csv") if key in r]


def _tokens_seen(run: Path) -> list[float]:
    return [r["tokens_seen"] for r in log_rows(run / "logs" / "metrics.csv") if "tokens_seen" in r]


def test_default_root_dir_moves_every_output(tmp_path, monkeypatch):
    """The quickstart writes nothing outside trainer.default_root_dir: model, logs, checkpoints, plot, export."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "elsewhere" / "my_run"
    _quickstart(run, "--checkpoint.every_n_iterations", "1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]  # nothing in the working directory
    for rel in (
        "config.yaml",
        "model/config.json",
        "checkpoints/last.ckpt",
        "checkpoints/iter=2.ckpt",
        "logs/metrics.csv",
        "reward_curve.png",
        "final_model/config.json",
    ):
        assert (run / rel).is_file(), rel
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert _steps(run) == [1, 2]  # iteration i at step i, as the progress bar counts
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["default_root_dir"] == str(run)
    assert (
        saved["model"]["init_args"]["model"] == f"{run}/model"
    )  # ${trainer.default_root_dir}/model, resolved


def test_one_step_numbering_in_every_output(tmp_path, monkeypatch):
    """Iteration i is step i everywhere: metrics.csv (training rows and evaluations), the rollout files,
    rollouts/metrics.jsonl and the held-out history (what the progress bar counts); the baseline is step 0."""
    import json

    from lit_rl.callbacks import HeldoutEval

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    cli = _quickstart(run, "--trainer.val_check_interval", "2", steps=3)
    rollout_files = sorted(int(p.stem.split("_")[1]) for p in (run / "rollouts").glob("step_*.jsonl"))
    assert rollout_files == [1, 2, 3]
    assert _steps(run) == rollout_files
    jsonl = [json.loads(line) for line in (run / "rollouts/metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in jsonl if "reward/mean" in r) == rollout_files
    assert _steps(run, "eval/accuracy") == [0, 2]  # baseline, iteration 2 (validation loop)
    (ev,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval)]
    # + the final point HeldoutEval measures in on_train_end, after the loggers closed (not in metrics.csv)
    assert [int(h["step"]) for h in ev.history] == [0, 2, 3]
    assert sorted(r["step"] for r in jsonl if "eval/accuracy" in r) == [0, 2, 3]


def test_checkpoint_every_n_iterations_and_at_the_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    _quickstart(run, "--checkpoint.every_n_iterations", "2", "--checkpoint.save_top_k", "-1", steps=3)
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == [
        "iter=2.ckpt",
        "iter=3.ckpt",
        "last.ckpt",
    ]
    last = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert last["lit_rl_policy"]["iteration"] == 3


def test_resume_last_continues_the_same_logs(tmp_path, monkeypatch):
    """A run killed after logging step 3 whose last checkpoint is iteration 2 (simulated: last.ckpt is put back
    to iter=2.ckpt): `--ckpt_path last` continues at iteration 3 into the same metrics.csv and TensorBoard
    directory; every step is logged exactly once."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    _quickstart(run, "--checkpoint.every_n_iterations", "2", "--checkpoint.save_top_k", "-1", steps=3)
    assert _steps(run) == [1, 2, 3]
    seen = _tokens_seen(run)
    assert len(seen) == 3 and 0 < seen[0] < seen[1] < seen[2]
    shutil.copy(run / "checkpoints/iter=2.ckpt", run / "checkpoints/last.ckpt")
    cli = _quickstart(run, "--ckpt_path", "last", steps=5)
    assert cli.model.iteration == 5
    assert _steps(run) == [1, 2, 3, 4, 5]  # step 3 of the killed process replaced, none missing
    # tokens_seen continues from the checkpoint (resume is exact, so iteration 3 sees the same prompts again)
    again = _tokens_seen(run)
    assert again[:3] == seen and again[2] < again[3] < again[4]
    assert _steps(run, "lr-AdamW") == [1, 2, 3, 4, 5]
    assert _steps(run, "eval/accuracy") == [0]  # the baseline, once (no second one on resume)
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 2  # same directory, second file
    assert not list(tmp_path.glob("run/logs/version_*"))


def test_resume_from_a_ckpt_file_into_another_run_directory(tmp_path, monkeypatch):
    """`--ckpt_path <run>/checkpoints/iter=2.ckpt` (a file, not `last`) resumes exactly: the same weights after
    iteration 3 as the uninterrupted run, written under the new run directory. Lightning's own handling of a
    file path re-read the checkpoint's hyperparameters as the model's settings and refused every lit_rl run."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    full = _quickstart(run, "--checkpoint.every_n_iterations", "1", "--checkpoint.save_top_k", "-1", steps=3)
    again = _quickstart(tmp_path / "again", "--ckpt_path", str(run / "checkpoints/iter=2.ckpt"), steps=3)
    assert again.model.iteration == 3
    assert _steps(tmp_path / "again") == [3]
    want, got = full.model.state_dict(), again.model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_resume_requested_with_nothing_to_resume_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"nothing to resume.*last_or_new"):
        _quickstart(tmp_path / "empty", "--ckpt_path", "last")
    assert not (tmp_path / "empty" / "model").exists()  # refused before the model was built


def test_last_or_new_starts_fresh_then_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert _quickstart(run, "--ckpt_path", "last_or_new", steps=1).model.iteration == 1
    assert _quickstart(run, "--ckpt_path", "last_or_new", steps=2).model.iteration == 2
    assert _steps(run) == [1, 2]


def test_fresh_start_into_an_existing_run_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    _quickstart(run, steps=1)
    with pytest.raises(ConfigError, match="already holds a run.*--ckpt_path last"):
        _quickstart(run, steps=1)


def test_checkpointing_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _quickstart(tmp_path / "run", "--trainer.enable_checkpointing", "false", steps=1)
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------------------ console script
def _console(*args: str, cwd: Path, env: dict | None = None, timeout: float = 240):
    full = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", "from lit_rl.cli import console_main; console_main()", *args],
        check=False,
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("lit-rl: error:")]


def test_config_error_is_one_line_naming_the_field(tmp_path, tiny_model_dir):
    proc = _console(
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        str(tiny_model_dir),
        "--model.init_args.clip_low",
        "5",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    (line,) = _error_lines(proc)
    assert "clip_low" in line and "[0, 1]" in line
    assert "Traceback" not in proc.stderr


def test_missing_local_model_path_is_an_error(tmp_path):
    proc = _console(
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        "runs/typo/model",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "model='runs/typo/model'" in line and "does not exist" in line and "not a hub id" in line


def test_hub_id_goes_to_from_pretrained_and_says_why_it_failed(tmp_path):
    proc = _console(
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        "some-org/some-model",
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "model='some-org/some-model' is not a local directory" in line and "hub id" in line
    assert "network" in line


def test_only_the_quickstarts_build_a_tiny_model():
    """tiny_if_missing turns a typo into a silently trained random model: only the from-scratch demos (the
    quickstart, and the same quickstart through vLLM, in-process or on servers) may use it."""
    users = sorted(
        p.stem
        for p in (ROOT / "configs").glob("*.yaml")
        if "tiny_if_missing" in (yaml.safe_load(p.read_text())["model"]["init_args"])
    )
    assert users == ["grpo_server", "grpo_vllm", "quickstart"]


def test_progress_bar_counts_iterations_and_no_args_warning(tmp_path, monkeypatch, capsys, recwarn):
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--trainer.max_steps",
            "2",
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "2",
            "--trainer.callbacks",
            "[]",
            "-c",
            str(ROOT / "callbacks/eval.yaml"),  # the default (tqdm) bar
            "--trainer.val_check_interval",
            "1",
        ]
    )
    out = capsys.readouterr()
    bar = out.out + out.err  # Lightning's tqdm writes to stdout
    assert "Iteration" in bar and "2/2" in bar and "eval/accuracy" in bar
    assert "Epoch" not in bar
    assert not [w for w in recwarn if "args parameter" in str(w.message)]
