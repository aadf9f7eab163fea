"""``policy_loss: sapo`` (SAPO, arXiv 2511.20347; TRL's ``loss_type="sapo"``): float64 values and gradients,
hand-computed from f(r) = sigmoid(tau (r - 1)) * 4 / tau, one test per branch (A > 0, A < 0, A = 0, the
temperatures, on-policy), and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.policy_losses import PolicyLossInputs, compute_policy_loss

F64 = torch.float64


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _run(log_ratio, adv, mask=None, **kw):
    lp = torch.tensor([log_ratio], dtype=F64, requires_grad=True)  # (1, T); old log-probs 0, so r = exp(lp)
    old = torch.zeros_like(lp)
    a = torch.tensor([adv], dtype=F64)
    m = torch.ones_like(a, dtype=torch.bool) if mask is None else torch.tensor([mask])
    loss, metrics = compute_policy_loss("sapo", PolicyLossInputs(lp, old, a, m, **kw))
    loss.sum().backward()
    return loss.detach()[0].tolist(), lp.grad[0].tolist(), metrics


def test_positive_advantage_uses_tau_pos():
    # r = 1.5, A = 2, tau = 1: L = -2 * 4 sigmoid(0.5); dL/dlogpi = -2 * 4 s (1 - s) * 1.5
    s = _sig(0.5)
    loss, grad, _ = _run([math.log(1.5)], [2.0])
    assert loss == pytest.approx([-8 * s], rel=1e-12)
    assert grad == pytest.approx([-2 * 4 * s * (1 - s) * 1.5], rel=1e-12)


def test_negative_advantage_uses_tau_neg():
    # r = 0.5, A = -1, tau = 1.05: L = sigmoid(1.05 * -0.5) * 4 / 1.05; dL/dlogpi = 4 s (1 - s) * 0.5
    s = _sig(-0.525)
    loss, grad, _ = _run([math.log(0.5)], [-1.0])
    assert loss == pytest.approx([s * 4 / 1.05], rel=1e-12)
    assert grad == pytest.approx([4 * s * (1 - s) * 0.5], rel=1e-12)


def test_configured_temperatures_and_zero_advantage():
    # tau_pos = 2 on A = 1 at r = 2: L = -sigmoid(2) * 2; A = 0 (tau_neg = 3): loss and gradient 0
    s = _sig(2.0)
    loss, grad, _ = _run([math.log(2.0), 0.3], [1.0, 0.0], sapo_tau_pos=2.0, sapo_tau_neg=3.0)
    assert loss == pytest.approx([-2 * s, 0.0], rel=1e-12, abs=1e-15)
    assert grad == pytest.approx([-1 * 4 * s * (1 - s) * 2.0, 0.0], rel=1e-12, abs=1e-15)


def test_on_policy_gradient_is_the_policy_gradient_and_padding_is_zero():
    # r = 1: weight 4 * 1/2 * 1/2 * 1 = 1, so dL/dlogpi = -A, for either temperature; a masked token gives 0
    loss, grad, m = _run([0.0, 0.0, 5.0], [3.0, -2.0, 1.0], mask=[True, True, False])
    assert grad == pytest.approx([-3.0, 2.0, 0.0], rel=1e-12, abs=1e-15)
    assert loss == pytest.approx([-3.0 * 2, 2.0 * 2 / 1.05, 0.0], rel=1e-12)  # sigmoid(0) * 4 / tau = 2 / tau
    assert m["clipfrac"] == 0.0 and m["ratio_mean"] == 1.0


def test_refuses_dual_clip_and_bad_temperatures():
    with pytest.raises(ValueError, match="dual_clip=3.0 is not used by policy loss 'sapo'"):
        _run([0.0], [1.0], dual_clip=3.0)
    with pytest.raises(ValueError, match="sapo_tau_neg must be None or a finite number > 0"):
        _run([0.0], [1.0], sapo_tau_neg=0.0)


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo", "vespo", "reinforce"])
def test_other_losses_refuse_the_sapo_temperatures(loss):
    z = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match=f"sapo_tau_pos=2.0 is not used by policy loss '{loss}'"):
        compute_policy_loss(
            loss, PolicyLossInputs(z, z, z, torch.ones(1, 2, dtype=torch.bool), sapo_tau_pos=2.0)
        )


def test_policy_config_names_the_field_and_the_loss_that_reads_it():
    from lit_rl.learners.config import PolicyConfig

    with pytest.raises(
        ValueError,
        match=r"sapo_tau_pos=2.0 is read only by policy_loss: sapo "
        r"\(policy_loss='ppo_clip'\); set it to null",
    ):
        PolicyConfig.of("m", tiny_if_missing={}, sapo_tau_pos=2.0).validate()
    PolicyConfig.of("m", tiny_if_missing={}, policy_loss="sapo", sapo_tau_pos=2.0).validate()
    with pytest.raises(ValueError, match="sapo_tau_neg must be null or a finite number > 0, got -1"):
        PolicyConfig.of("m", tiny_if_missing={}, policy_loss="sapo", sapo_tau_neg=-1.0).validate()
    with pytest.raises(
        ValueError, match="policy_loss='clipped'.*valid names: cispo, gspo, ppo_clip, reinforce, sapo, vespo"
    ):
        PolicyConfig.of("m", tiny_if_missing={}, policy_loss="clipped").validate()
