"""Shared by the server test files: a 2-rank gloo DDP `lit-rl fit` of configs/grpo_server.yaml against
servers given by URL (tests/dist_runner.py runs it; each rank writes its own engine metrics)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_ddp_on_servers(
    engine_args: dict,
    model_dir,
    tmp_path: Path,
    *extra: str,
    callbacks: list | None = None,
    env: dict | None = None,
    timeout: float = 900,
    strategy: str = "ddp",
) -> tuple[dict, dict[int, dict]]:
    """2 ranks x 2 steps x 4 prompts x group 2 on the servers in ``engine_args["urls"]``; returns (the run's
    result dict from dist_runner, {rank: that rank's ``{"urls", "metrics"}``}). ``extra``: more CLI overrides
    (later ones win); ``callbacks``: ``trainer.callbacks`` entries; ``env``: more environment (dist_runner's
    fault hooks); ``strategy``: a ``configs/strategies/`` fragment's name. A run still going after ``timeout``
    (a hang) fails the test, its whole process group (both ranks) killed."""
    cfg = yaml.safe_load((ROOT / "configs/grpo_server.yaml").read_text())
    cfg["rollout"]["engine"]["init_args"] = engine_args
    cfg["trainer"]["callbacks"] = list(callbacks or [])
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out, per_rank = tmp_path / "ddp.pt", tmp_path / "per_rank"
    per_rank.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MASTER_ADDR": "127.0.0.1",
        "SERVER_METRICS_DIR": str(per_rank),
        **(env or {}),
    }
    proc = run_killing_group(
        [
            sys.executable,
            str(ROOT / "tests/dist_runner.py"),
            str(out),
            "fit",
            "-c",
            str(path),
            "-c",
            str(ROOT / f"configs/strategies/{strategy}.yaml"),
            "--trainer.devices",
            "2",
            "--trainer.max_steps",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--model.init_args.model",
            str(model_dir),
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "2",
            "--trainer.val_check_interval",
            "null",
            "--trainer.check_val_every_n_epoch",
            "null",
            *extra,
        ],
        env,
        timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = torch.load(out)
    assert res["world_size"] == 2
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in per_rank.iterdir()}
    assert sorted(ranks) == [0, 1], sorted(ranks)
    return res, ranks


def run_killing_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; past ``timeout`` kill the whole group (Lightning's launcher starts
    the other ranks as children: killing rank 0 alone would leave them waiting in a collective) and fail."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"the run did not finish within {timeout} s (a hang?): killed\n{stdout[-3000:]}{stderr[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
