"""Invariances of the assembled step, for every loss aggregation: the same rows padded to another width, cut
into other micro-batches, or split over 2 DDP ranks give the same gradient (float64, rtol 1e-12 / 1e-10)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _conformance import build_module, flat, hand_experience, max_rel_diff, run_step

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
HERE = Path(__file__).resolve().parent


def _grad(model_dir, loss_agg, extra_pad=(0, 0), **kw):
    module = build_module("grpo", str(model_dir), loss_agg=loss_agg, **kw)
    exp = hand_experience(
        module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8, extra_pad=extra_pad
    )
    return flat(run_step(module, exp)[0])


@pytest.mark.parametrize("loss_agg", MODES)
def test_padding_and_micro_batches_do_not_change_the_gradient(tiny_model_dir, loss_agg):
    """Wider padding (2 prompt + 3 completion columns), and micro-batches of 1 and 3 rows (uneven: 3+3+2),
    give the gradient of the whole batch at its own width."""
    ref = _grad(tiny_model_dir, loss_agg)
    assert float(ref.abs().max()) > 0
    assert max_rel_diff(_grad(tiny_model_dir, loss_agg, extra_pad=(2, 3)), ref) <= 1e-12
    for micro in (1, 3):
        assert max_rel_diff(_grad(tiny_model_dir, loss_agg, micro_batch_size=micro), ref) <= 1e-12, micro


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("loss_agg", MODES)
def test_two_ddp_ranks_give_the_single_process_gradient(tiny_model_dir, tmp_path, loss_agg):
    """2 real processes (gloo), 4 rows each, trimmed to different widths: DDP's averaged gradient equals the
    1-process gradient on all 8 rows (global token / sequence counts, one constant horizon)."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": _free_port(),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "g2.pt"
    r = subprocess.run(
        [sys.executable, str(HERE / "ddp_grad_runner.py"), str(out), str(tiny_model_dir), loss_agg, "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    single = _grad(tiny_model_dir, loss_agg)
    assert float(single.abs().max()) > 0
    assert max_rel_diff(torch.load(out), single) <= 1e-10
