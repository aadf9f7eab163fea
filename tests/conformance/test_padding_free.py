"""``padding_free``: one optimizer step's gradient through a real Trainer equals the padded forward's (float64),
for GRPO, Dr. GRPO's length-normalised loss, PPO with a shared critic (its value head reads the packed hidden
states), together with token-budget micro-batches and under gradient checkpointing; and 2 DDP ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _conformance import build_module, flat, hand_experience, max_rel_diff, run_step

from tests._float64 import float64_rmsnorm

HERE = Path(__file__).resolve().parent

RTOL = 1e-9


@pytest.fixture(autouse=True)
def float64_norm():
    # packing sums a prompt's gradients before transformers' RMSNorm (float32 inside), the padded forward after
    with float64_rmsnorm():
        yield


def _grad(model_dir, name, **kw):
    module = build_module(name, str(model_dir), **kw)
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
    return flat(run_step(module, exp)[0])


@pytest.mark.parametrize(
    "name, extra",
    [
        ("grpo", {}),
        ("grpo", {"loss_agg": "seq_mean_token_sum_norm"}),
        ("ppo", {}),
        ("grpo", {"micro_batch_tokens": 16}),
        ("grpo", {"pack_row_tokens": 4}),
        ("grpo", {"gradient_checkpointing": True}),
    ],
)
def test_padding_free_gradient_equals_padded(tiny_model_dir, name, extra):
    ref = _grad(tiny_model_dir, name, **{k: v for k, v in extra.items() if k == "loss_agg"})
    assert float(ref.abs().max()) > 0
    got = _grad(tiny_model_dir, name, padding_free=True, **extra)
    assert max_rel_diff(got, ref) <= RTOL, max_rel_diff(got, ref)


def test_two_ddp_ranks_packed_equal_one_padded_process(tiny_model_dir, tmp_path):
    """test_token_budget.py's 2-rank run (ranks with different length mixes and micro-batch counts, one
    zero-weight pass) with padding_free: the averaged gradient equals one padded process on all 8 rows."""
    from test_token_budget import _free_port
    from token_budget_runner import long_and_short

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": _free_port(),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "g2.pt"
    r = subprocess.run(
        [
            sys.executable,
            str(HERE / "token_budget_runner.py"),
            str(out),
            str(tiny_model_dir),
            "token_mean",
            "2",
            "10",
            "padding_free",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [json.loads(Path(f"{out}.rank{k}.json").read_text()) for k in range(2)]
    assert ran[1] == [{"real": 2, "zero_weight": 1, "rows": [3, 1]}]
    module = build_module("grpo", str(tiny_model_dir), loss_agg="token_mean")
    single = flat(run_step(module, long_and_short(module))[0])
    assert max_rel_diff(torch.load(out), single) <= RTOL
