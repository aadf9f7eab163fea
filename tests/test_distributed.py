"""Multi-process training equals single-process training (CPU, gloo, fp32).

Same global batch (16 prompts: 1 rank × 16 or 2 ranks × 8), same seed, seeded per-prompt sampling (so a
prompt's completions do not depend on which rank generates them) → parameters after N optimizer steps
agree within 1e-5 for DDP, FSDP2 (ModelParallelStrategy), DeepSpeed ZeRO-2 and ZeRO-3 (DeepSpeedZeROStrategy on
CPU) and 2 nodes × 1 process. Every run clips (max_grad_norm below the steps' norms) and has one NaN-loss
iteration (``NAN_AT_ITERATION``), so the gradient-norm guard must clip with the global norm and skip that step
identically in every strategy.
"""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNER = str(ROOT / "tests/dist_runner.py")
pytestmark = pytest.mark.slow
NAN_ITERATION = "1"  # of 3: step 0 and 2 update, step 1's NaN gradients must be skipped
MAX_GRAD_NORM = 0.3  # below the unclipped norms of these steps (≈0.7): clipping changes every update


def _config(tmp_path, model_dir, loss_agg="token_mean", steps=3):
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": steps,
            "default_root_dir": str(tmp_path),
            "max_epochs": -1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [
                {
                    "class_path": "lit_rl.callbacks.RolloutCallback",
                    "init_args": {
                        "group_size": 4,
                        # seeded per prompt: rank-independent samples; 3 tokens so lengths (eos) vary per row
                        "sampling": {"temperature": 1.0, "max_new_tokens": 3, "seed": 7},
                        "rewards": {
                            "class_path": "lit_rl.rewards.RewardPool",
                            "init_args": {
                                "rewards": {
                                    # a digit anywhere: ~frequent enough at random init to give non-zero advantages
                                    "fmt": {
                                        "class_path": "lit_rl.rewards.RegexFormatReward",
                                        "init_args": {"pattern": ".*[0-9].*"},
                                    }
                                }
                            },
                        },
                    },
                }
            ],
        },
        "model": {
            "class_path": "lit_rl.learners.PolicyModule",
            "init_args": {
                "model": str(model_dir),
                "advantage": "grpo",
                "loss_agg": loss_agg,
                "max_grad_norm": MAX_GRAD_NORM,
                "optimizer": {
                    "class_path": "torch.optim.AdamW",
                    "init_args": {"lr": 0.001, "weight_decay": 0.0},
                },
            },
        },
        "data": {
            "class_path": "lit_rl.data.PromptDataModule",
            "init_args": {
                "task": "addition",
                "task_args": {"answer_width": 1, "max_sum": 9, "unary": True},
                "batch_size": 16,
            },
        },
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(out, cfg, *extra, env=None, timeout=600):
    cmd = [sys.executable, RUNNER, str(out), "fit", "-c", cfg, *extra]
    e = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": _free_port(),
        "NAN_AT_ITERATION": NAN_ITERATION,
        **(env or {}),
    }
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), timeout


def _wait(procs):
    logs = []
    for p, timeout in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            raise AssertionError("distributed run did not finish in time (a rank hung?)") from None
        assert p.returncode == 0, logs[-1][-4000:]
    return logs


def _max_diff(a, b):
    sa, sb = torch.load(a)["state"], torch.load(b)["state"]
    assert sa.keys() == sb.keys()
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa)


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("single")
    cfg = _config(d, tiny_model_dir)
    out = d / "single.pt"
    _wait([_run(out, cfg)])
    init = torch.load(out)["state"]
    return cfg, out, init


def test_training_moved_the_parameters(single, tiny_model_dir):
    # guard against a vacuous equivalence: the runs must actually have changed the weights, clipped the
    # gradients and skipped the NaN step
    from transformers import AutoModelForCausalLM

    _, out, final = single
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = max(float((final[k].double() - base[k].double()).abs().max()) for k in final)
    assert moved > 1e-3, moved
    metrics = torch.load(out)["metrics"]
    assert metrics["actor/skipped_steps"] == 1.0
    assert metrics["actor/grad_norm"] > 1.5 * MAX_GRAD_NORM  # the last step was clipped


DEEPSPEED = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (optional extra: pip install -e .[deepspeed])",
)


@pytest.mark.parametrize(
    "strategy",
    [
        "ddp",
        "fsdp",
        pytest.param("deepspeed_zero2", marks=DEEPSPEED),
        pytest.param("deepspeed_zero3", marks=DEEPSPEED),
    ],
)
def test_two_processes_equal_one(single, tmp_path, strategy):
    """DDP, FSDP2 (FSDP2Strategy), ZeRO-2 and ZeRO-3 (DeepSpeedZeROStrategy, CPU): 2 ranks × 8 prompts train
    exactly like 1 rank × 16 — clipped with the global norm, the NaN step skipped (under ZeRO ``p.grad`` is None
    on the ranks: only the engine's norm can do either), and under ZeRO-3 the rollout engine's copy synced by
    gathering the partitions (the rollouts of steps 2 and 3 come from it)."""
    cfg, ref, _ = single
    out = tmp_path / f"{strategy}.pt"
    # ZeRO: 4 micro-batches of 8 rows per optimizer step, accumulated by the engine up to step()
    micro = ["--model.init_args.micro_batch_size", "8"] if strategy.startswith("deepspeed") else []
    logs = _wait(
        [
            _run(
                out,
                cfg,
                "-c",
                str(ROOT / f"configs/strategies/{strategy}.yaml"),
                "--trainer.devices",
                "2",
                "--data.init_args.batch_size",
                "8",
                *micro,
            )
        ]
    )
    got, want = torch.load(out), torch.load(ref)
    assert got["world_size"] == 2
    # DDP, FSDP2 and ZeRO-2 take the chunked LM-head path (FSDP2's root unit holds the unsharded head weight from
    # its forward to the end of the backward); ZeRO-3 releases the partitioned weight after lm_head's forward, so
    # it keeps the materialised logits and says so
    fell_back = "vocabulary logits are materialised" in logs[0]
    assert fell_back == (strategy == "deepspeed_zero3"), logs[0][-3000:]
    assert _max_diff(ref, out) <= 1e-5
    assert got["metrics"]["actor/skipped_steps"] == 1.0
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["metrics"]["actor/grad_norm"], rel=1e-5)


def test_two_nodes_one_process_each_equals_one(single, tmp_path):
    cfg, ref, _ = single
    out = tmp_path / "nodes.pt"
    port = _free_port()
    procs = [
        _run(
            out,
            cfg,
            "-c",
            str(ROOT / "configs/strategies/ddp.yaml"),
            "--trainer.num_nodes",
            "2",
            "--data.init_args.batch_size",
            "8",
            env={"NODE_RANK": str(r), "MASTER_PORT": port, "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        )
        for r in (0, 1)
    ]
    _wait(procs)
    assert torch.load(out)["world_size"] == 2
    assert _max_diff(ref, out) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["deepspeed_zero2", "deepspeed_zero3"])
def test_deepspeed_fragments_train_on_gpu(tmp_path, tiny_model_dir, stage):
    """The same fragments on one CUDA GPU in bf16 (DeepSpeed's CUDA accelerator, nccl): runs where a GPU exists."""
    pytest.importorskip("deepspeed")
    cfg = _config(tmp_path, tiny_model_dir, steps=2)
    out = tmp_path / f"{stage}.pt"
    _wait(
        [
            _run(
                out,
                cfg,
                "-c",
                str(ROOT / f"configs/strategies/{stage}.yaml"),
                "--trainer.devices",
                "1",
                "--trainer.accelerator",
                "gpu",
                "--trainer.precision",
                "bf16-mixed",
            )
        ]
    )
    got = torch.load(out)
    assert got["world_size"] == 1
    assert got["metrics"]["actor/skipped_steps"] == 1.0


def test_a_dead_engine_on_one_rank_fails_the_job_within_a_bound(tmp_path, tiny_model_dir):
    """Rank 1's engine raises on its 2nd rollout while rank 0 goes on into the next collective: the whole job
    must exit non-zero, and quickly (the peer's closed connection fails rank 0's collective), never hang."""
    import time

    cfg = _config(tmp_path, tiny_model_dir, steps=4)
    t0 = time.monotonic()
    proc, _ = _run(
        tmp_path / "never.pt",
        cfg,
        "-c",
        str(ROOT / "configs/strategies/ddp.yaml"),
        "--trainer.devices",
        "2",
        "--data.init_args.batch_size",
        "8",
        env={"KILL_ENGINE": "1:2"},
    )
    try:
        log = proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("a rank's dead engine left the job hanging for 300 s") from None
    assert proc.returncode != 0
    assert "rollout engine on rank 1 died" in log
    assert time.monotonic() - t0 < 300
    assert not (tmp_path / "never.pt").exists()
