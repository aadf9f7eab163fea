"""``OptimizerStep`` on a real float64 linear model and SGD, and ``PolicyConfig``'s validation."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.learners.config import PolicyConfig
from lit_rl.learners.optim_step import LossParts, OptimizerStep


def _setup():
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -2.0]], dtype=torch.float64))
    return lin, torch.optim.SGD(lin.parameters(), lr=0.5)


def _run(step, lin, opt, micros, scale=1.0):
    def loss_fn(x):  # loss = scale · Σ w·x; metrics: a max and a mean
        val = scale * (lin.weight @ x).sum()
        return LossParts({"policy": val}, {"is/max_weight": float(x.sum()), "actor/entropy": float(x.sum())})

    zero = lambda: {"policy": (lin.weight @ torch.ones(2, dtype=torch.float64)).sum()}  # noqa: E731
    return step.run(opt, None, micros, loss_fn, zero, lambda loss: loss.backward(), lin.parameters)


def test_accumulates_clips_and_reduces_metrics_as_declared():
    lin, opt = _setup()
    step = OptimizerStep(max_grad_norm=1.0, max_nonfinite_steps=2)
    x1, x2 = torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 4.0], dtype=torch.float64)
    stats = _run(step, lin, opt, [x1, None, x2])  # None: a zero-weight pass, adds nothing
    # gradient = x1 + x2 = (3, 4), norm 5, clipped to 1 (torch scales by 1 / (norm + 1e-6)); SGD lr 0.5
    assert stats["actor/grad_norm"] == pytest.approx(5.0, rel=1e-15)
    c = 0.5 / (5.0 + 1e-6)
    expect = torch.tensor([[1.0 - 3 * c, -2.0 - 4 * c]], dtype=torch.float64)
    assert torch.allclose(lin.weight, expect, rtol=1e-14, atol=0)
    assert stats["loss/policy"] == pytest.approx(3.0 - 8.0, rel=1e-15)  # parts summed over micro-batches
    assert stats["is/max_weight"] == 4.0 and stats["actor/entropy"] == 3.5  # declared max; undeclared mean


def test_nonfinite_norm_skips_the_step_and_counts_then_raises():
    lin, opt = _setup()
    before = lin.weight.detach().clone()
    step = OptimizerStep(max_grad_norm=1.0, max_nonfinite_steps=2)
    x = torch.tensor([1.0, 1.0], dtype=torch.float64)
    stats = _run(step, lin, opt, [x], scale=math.nan)
    assert (
        math.isnan(stats["actor/grad_norm"]) and torch.equal(lin.weight, before) and lin.weight.grad is None
    )
    assert (step.skipped_steps, step.nonfinite_in_a_row) == (1, 1)
    _run(step, lin, opt, [x])  # a finite step resets the run, not the total
    assert (step.skipped_steps, step.nonfinite_in_a_row) == (1, 0)
    _run(step, lin, opt, [x], scale=math.inf)
    with pytest.raises(RuntimeError, match=r"2 optimizer steps in a row .*max_nonfinite_steps=2"):
        _run(step, lin, opt, [x], scale=math.nan)


def test_policy_config_names_the_field_and_its_values(tiny_model_dir):
    with pytest.raises(ValueError, match=r"loss_agg='mean'; valid values: token_mean, seq_mean_token_mean"):
        PolicyConfig.of(str(tiny_model_dir), loss_agg="mean").validate()
    with pytest.raises(ValueError, match=r"correction_level=.*valid values: token, sequence, geometric"):
        PolicyConfig.of(str(tiny_model_dir), correction_level="row").validate()
    cfg = PolicyConfig.of(str(tiny_model_dir), clip_high=0.28)
    assert cfg.validate() is cfg and cfg.objective.clip_high == 0.28
    with pytest.raises(TypeError, match=r"^PolicyModule: unknown setting 'losses'$"):  # DistillModule's only
        PolicyConfig.of(str(tiny_model_dir), clip_high=0.28, losses={"x": 1.0})
