"""Token-budget micro-batches (``micro_batch_tokens``): the gradient of one optimizer step equals the gradient of
the whole minibatch in one pass (float64), in one process and over 2 DDP ranks whose rows have different
length mixes (and so different numbers of micro-batches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _conformance import build_module, flat, hand_experience, max_rel_diff, run_step

from lit_rl.learners import PolicyModule

HERE = Path(__file__).resolve().parent
RTOL = 1e-9


def _grad(model_dir, name, **kw):
    module = build_module(name, str(model_dir), **kw)
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
    return flat(run_step(module, exp)[0]), module


@pytest.mark.parametrize(
    "name, loss_agg", [("grpo", "token_mean"), ("grpo", "seq_mean_token_sum_norm"), ("ppo", None)]
)
def test_token_budget_gradient_equals_one_full_batch(tiny_model_dir, name, loss_agg):
    """Budget 16 groups the 8 rows as [2, 7] [0, 4] [3, 6] [1, 5] (test_microbatch.py), each micro-batch trimmed
    to its own width; budget 1 puts every row alone. Both give the one-pass gradient (PPO: policy + value loss
    through the shared critic)."""
    kw = {"loss_agg": loss_agg} if loss_agg else {}
    ref, _ = _grad(tiny_model_dir, name, **kw)
    assert float(ref.abs().max()) > 0
    # budget 1: each row alone at its own width, group 1's prompts (2 tokens) without group 0's third column
    alone = [(1, w) for w in (8, 7, 6, 6, 5, 5, 4, 4)]
    for budget, widths in ((16, [(2, 8), (2, 7), (2, 6), (2, 5)]), (1, alone)):
        module = build_module(name, str(tiny_model_dir), micro_batch_tokens=budget, **kw)
        exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
        micros = module.train_micro_batches(
            exp.trim()
        )  # the plan: trimmed (rows, prompt + completion) blocks
        assert [(m.batch_size, m.input_ids.shape[1]) for m in micros] == widths
        got = flat(run_step(module, exp)[0])
        assert max_rel_diff(got, ref) <= RTOL, (budget, max_rel_diff(got, ref))


def test_zero_weight_micro_batches_add_nothing(tiny_model_dir):
    """The padding a rank with fewer micro-batches runs (here: 3 extra, forced) leaves the gradient as it was."""

    class MoreRanksAgree(PolicyModule):
        def _all_reduce_sum(self, t, op="sum"):
            return t + 3 if op == "max" else t

    ref, _ = _grad(tiny_model_dir, "grpo")
    module = build_module("grpo", str(tiny_model_dir), micro_batch_tokens=16)
    module.__class__ = MoreRanksAgree
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
    micros = module.train_micro_batches(exp.trim())
    assert len(micros) == 7 and micros[4:] == [None] * 3
    assert max_rel_diff(flat(run_step(module, exp)[0]), ref) <= RTOL


def test_micro_batch_tokens_config_errors(tiny_model_dir):
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="micro_batch_tokens"):
            PolicyModule(model=str(tiny_model_dir), micro_batch_tokens=bad)


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_two_ddp_ranks_with_different_length_mixes(tiny_model_dir, tmp_path):
    """Rank 0 holds group 0 (completions 3, 1, 5, 2 tokens), rank 1 group 1 cut to 1-token completions. Budget
    10: rank 0 forms [2] [0] [3, 1], rank 1 [4, 5, 6] [7] plus one zero-weight pass; both run 3. The averaged
    gradient equals one process on all 8 rows in one pass."""
    sys.path.insert(0, str(HERE))
    from token_budget_runner import long_and_short

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": _free_port(),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
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
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [json.loads(Path(f"{out}.rank{k}.json").read_text()) for k in range(2)]
    assert ran[0] == [{"real": 3, "zero_weight": 0, "rows": [1, 1, 2]}]
    assert ran[1] == [{"real": 2, "zero_weight": 1, "rows": [3, 1]}]
    module = build_module("grpo", str(tiny_model_dir), loss_agg="token_mean")
    single = flat(run_step(module, long_and_short(module))[0])
    assert float(single.abs().max()) > 0
    assert max_rel_diff(torch.load(out), single) <= 1e-10
