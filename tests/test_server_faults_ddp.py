"""Rollout-server faults under 2 DDP ranks (gloo, real processes) sharing vLLM servers by URL (issue 28,
"Faults to survive"). Each test launches its own servers (it breaks one for good: SIGKILL or SIGSTOP).
"""

from __future__ import annotations

import os
import time
import types

import pytest
import requests
import torch
from _async_recorder import wrong_rows
from _server_helpers import ROOT, run_ddp_on_servers

from lit_rl.models.loading import load_causal_lm, load_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LAUNCH = {"num_servers": 2, "max_model_len": 64, "max_num_seqs": 16, "kv_cache_gb": 1, "timeout_s": 600}
PROMPTS, GROUP = 2, 4
COMMON = (
    "--data.init_args.batch_size",
    str(PROMPTS),
    "--rollout.group_size",
    str(GROUP),
    "--rollout.sampling.max_new_tokens",
    "4",
    "--model.init_args.optimizer.init_args.lr",
    "0.05",
    # a digit anywhere: reward variance at random init, so every step moves the weights
    "--rollout.rewards.init_args.rewards",
    '{fmt: {class_path: lit_rl.rewards.RegexFormatReward, init_args: {pattern: ".*[0-9].*"}}}',
)


def _launch(model_dir, n: int):
    from lit_rl.rollout.server import VLLMServerEngine

    path = str(model_dir)
    module = types.SimpleNamespace(
        model=load_causal_lm(path), tokenizer=load_tokenizer(path), model_path=path
    )
    engine = VLLMServerEngine(launch={**LAUNCH, "num_servers": n}, request_timeout_s=30, sync_timeout_s=60)
    engine.bind(module)
    return engine


@pytest.fixture
def pair(tiny_model_dir):
    """Two launched servers, fresh for each test (each test breaks one); close() SIGKILLs a stopped one too."""
    engine = _launch(tiny_model_dir, 2)
    try:
        yield engine
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_server_killed_mid_run_leaves_the_run_finishing_on_the_other(pair, tiny_model_dir, tmp_path, mode):
    """5 steps; rank 0 SIGKILLs server 1 in iteration 2: sync mode just before the optimizer step (the servers
    are idle, so the weight sync is the first to meet the dead server), async (k=1) when the rollout is taken
    (both producers are generating ahead). Every step still trains, every row is labelled with the weights that
    generated it, both ranks ran the same syncs and both report ``rollout/servers_alive`` = 1."""
    steps = 5
    urls = [s.url for s in pair.pool.servers]
    out = tmp_path / "rec"
    out.mkdir()
    mode_args = (
        [
            "--rollout.mode",
            "async",
            "--rollout.max_staleness",
            "1",
            "--model.init_args.rollout_correction",
            "tis",
        ]
        if mode == "async"
        else []
    )
    t0 = time.monotonic()
    res, ranks = run_ddp_on_servers(
        {"urls": urls, "request_timeout_s": 30, "sync_timeout_s": 60},
        tiny_model_dir,
        tmp_path,
        *COMMON,
        "--trainer.max_steps",
        str(steps),
        *mode_args,
        callbacks=[
            {
                "class_path": "_async_recorder.AsyncRowRecorder",
                "init_args": {
                    "out_dir": str(out),
                    "fault_at": 2,
                    "fault_pgid": pair._procs[1].pid,
                    "fault_when": "rollout" if mode == "async" else "update",
                },
            }
        ],
        timeout=600,
    )
    wall = time.monotonic() - t0
    assert not pair._procs[1].alive()
    rec = {r: torch.load(out / f"rows{r}.pt") for r in (0, 1)}
    assert [rec[r]["learner"] for r in (0, 1)] == [steps, steps]
    assert rec[0]["syncs"] == rec[1]["syncs"] == steps + 1
    assert requests.get(urls[0] + "/weight_info", timeout=10).json()["weight_version"] == str(steps + 1)
    for r in (0, 1):
        assert ranks[r]["metrics"]["rollout/servers_alive"] == 1.0, (r, ranks[r]["metrics"])
    wrong = wrong_rows(out, tiny_model_dir, steps * PROMPTS * GROUP, 1 if mode == "async" else 0)
    assert not wrong, "\n".join(wrong)
    print(f"2-rank {mode}, server 1 SIGKILLed in iteration 2: {wall:.1f} s wall")
    if mode == "sync":
        _same_as_one_server(res, tiny_model_dir, tmp_path / "one", steps)


def _same_as_one_server(res, tiny_model_dir, tmp_path, steps) -> None:
    """'The loss is the same as with one server': the same run on one server that never fails. Every request
    carries its own seed (rank, prompt, sample), so which server answers it does not change the sample: the final
    weights after 5 steps must agree to float32 round-off (the servers batch requests differently, which may
    change the last bits of a log-prob). Measured: bitwise equal (0.0); a different sample would change an Adam
    step of lr 0.05 by far more than the bound."""
    server = _launch(tiny_model_dir, 1)
    try:
        tmp_path.mkdir()
        one, _ = run_ddp_on_servers(
            {"urls": [server.pool.servers[0].url], "request_timeout_s": 30, "sync_timeout_s": 60},
            tiny_model_dir,
            tmp_path,
            *COMMON,
            "--trainer.max_steps",
            str(steps),
            timeout=600,
        )
    finally:
        server.close()
    diff = max(float((res["state"][k] - one["state"][k]).abs().max()) for k in one["state"])
    print(f"final weights, server killed vs one server: max |diff| = {diff:.3e}")
    assert diff < 1e-5, diff


def test_a_server_hanging_in_a_weight_sync_stops_both_ranks_with_its_url_in_bounded_time(
    tiny_model_dir, tmp_path
):
    """Sync mode on one server: rank 0 SIGSTOPs it just before iteration 1's optimizer step (both ranks
    have generated), so the weight sync after it gets no answer. Both ranks must exit non-zero, the log naming
    the server and the timeout, within sync_timeout_s plus start-up and teardown (bound: 240 s)."""
    server = _launch(tiny_model_dir, 1)
    try:
        _hang_in_sync(server, tiny_model_dir, tmp_path)
    finally:
        server.close()


def _hang_in_sync(server, tiny_model_dir, tmp_path) -> None:
    import subprocess
    import sys

    import yaml

    url = server.pool.servers[0].url
    cfg = yaml.safe_load((ROOT / "configs/grpo_server.yaml").read_text())
    cfg["rollout"]["engine"]["init_args"] = {"urls": [url], "request_timeout_s": 10, "sync_timeout_s": 10}
    cfg["trainer"]["callbacks"] = [
        {
            "class_path": "_async_recorder.AsyncRowRecorder",
            "init_args": {
                "out_dir": str(tmp_path),
                "fault_at": 1,
                "fault_pgid": server._procs[0].pid,
                "fault_signal": "STOP",
                "fault_when": "update",
            },
        }
    ]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/dist_runner.py"),
            str(tmp_path / "never.pt"),
            "fit",
            "-c",
            str(path),
            "-c",
            str(ROOT / "configs/strategies/ddp.yaml"),
            "--trainer.devices",
            "2",
            "--trainer.max_steps",
            "3",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--model.init_args.model",
            str(tiny_model_dir),
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.val_check_interval",
            "null",
            "--trainer.check_val_every_n_epoch",
            "null",
            *COMMON,
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - t0
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert not (tmp_path / "never.pt").exists()
    # rank 0: the server and the setting; rank 1 stops with rank 0's reason
    assert f"TimeoutError: server {url}: weight sync exceeded sync_timeout_s=10.0" in log, log[-4000:]
    assert (
        f"weight sync (version 3) failed: rank 0 failed the weight sync: TimeoutError: server {url}: weight "
        "sync exceeded sync_timeout_s=10.0"
    ) in log, log[-4000:]
    assert wall < 240, wall
    print(f"2-rank sync, server hung in a weight sync: exited {proc.returncode} after {wall:.1f} s")
