"""``policy_loss: vespo`` (VESPO, arXiv 2602.10693; TRL's ``loss_type="vespo"``): float64 values and
gradients, hand-computed from phi(w) = e^lambda w^k e^(-lambda w) on the sequence ratio w, one test per branch
(A >= 0, A < 0, on-policy, the clamp of log w, configured parameters), and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.policy_losses import PolicyLossInputs, compute_policy_loss

F64 = torch.float64
OLD = [[-1.0, -2.0]]  # log pi_old of a row's two tokens


def _phi(log_w: float, k: float, lam: float) -> float:
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


def _run(log_ratio, adv, **kw):
    old = torch.tensor(OLD, dtype=F64)
    lp = (old + torch.tensor([log_ratio], dtype=F64)).requires_grad_(True)
    a = torch.tensor([adv], dtype=F64)
    loss, metrics = compute_policy_loss(
        "vespo", PolicyLossInputs(lp, old, a, torch.ones_like(a, dtype=torch.bool), **kw)
    )
    loss.sum().backward()
    return loss.detach()[0].tolist(), lp.grad[0].tolist(), lp.detach()[0].tolist(), metrics


def test_non_negative_advantage_uses_k_pos_lambda_pos():
    # log w = 0.1 + 0.2 (a sum over the row, not a mean); k = 2, lambda = 3; L_t = -phi A log pi_t,
    # dL/dlogpi_t = -phi A
    phi = _phi(0.3, 2.0, 3.0)
    loss, grad, lp, m = _run([0.1, 0.2], [1.5, 1.5])
    assert loss == pytest.approx([-phi * 1.5 * lp[0], -phi * 1.5 * lp[1]], rel=1e-12)
    assert grad == pytest.approx([-phi * 1.5, -phi * 1.5], rel=1e-12)
    assert m["ratio_mean"] == pytest.approx(math.exp(0.3), rel=1e-12) and m["clipfrac"] == 0.0


def test_negative_advantage_uses_k_neg_lambda_neg():
    # log w = -0.5; k = 3, lambda = 2
    phi = _phi(-0.5, 3.0, 2.0)
    _, grad, _, _ = _run([-0.2, -0.3], [-2.0, -2.0])
    assert grad == pytest.approx([2.0 * phi, 2.0 * phi], rel=1e-12)


def test_on_policy_weight_is_one():
    # w = 1: phi = e^lambda e^-lambda = 1 for either sign, so the gradient is -A (REINFORCE)
    _, grad, _, _ = _run([0.0, 0.0], [0.7, -0.4])
    assert grad == pytest.approx([-0.7, 0.4], rel=1e-12)


def test_a_very_stale_row_is_clamped_not_nan():
    # log w = -30 is clamped to log 1e-8: phi = e^3 (1e-8)^2 e^(-3e-8), tiny and finite
    phi = _phi(math.log(1e-8), 2.0, 3.0)
    _, grad, _, _ = _run([-10.0, -20.0], [1.0, 1.0])
    assert grad == pytest.approx([-phi, -phi], rel=1e-12) and phi > 0


def test_configured_parameters():
    # k_pos = 1, lambda_pos = 0.5 at log w = 0.4: phi = e^0.5 e^0.4 e^(-0.5 e^0.4)
    phi = _phi(0.4, 1.0, 0.5)
    _, grad, _, _ = _run([0.4, 0.0], [1.0, 1.0], vespo_k_pos=1.0, vespo_lambda_pos=0.5, vespo_k_neg=9.0)
    assert grad == pytest.approx([-phi, -phi], rel=1e-12)


def test_refuses_dual_clip_foreign_and_bad_parameters():
    with pytest.raises(ValueError, match="dual_clip=2.0 is not used by policy loss 'vespo'"):
        _run([0.0, 0.0], [1.0, 1.0], dual_clip=2.0)
    with pytest.raises(ValueError, match="sapo_tau_pos=1.0 is not used by policy loss 'vespo'; only 'sapo'"):
        _run([0.0, 0.0], [1.0, 1.0], sapo_tau_pos=1.0)
    with pytest.raises(ValueError, match="vespo_lambda_neg must be None or a finite number > 0, got 0.0"):
        _run([0.0, 0.0], [1.0, 1.0], vespo_lambda_neg=0.0)
    with pytest.raises(ValueError, match="vespo_k_pos must be None or a finite number >= 0, got -1.0"):
        _run([0.0, 0.0], [1.0, 1.0], vespo_k_pos=-1.0)


def test_policy_config_reads_vespo_parameters_only_with_vespo():
    from lit_rl.learners.config import PolicyConfig

    PolicyConfig.of("m", tiny_if_missing={}, policy_loss="vespo", vespo_k_neg=0.0).validate()
    with pytest.raises(
        ValueError,
        match=r"vespo_k_neg=1.0 is read only by policy_loss: vespo "
        r"\(policy_loss='gspo'\); set it to null",
    ):
        PolicyConfig.of("m", tiny_if_missing={}, policy_loss="gspo", vespo_k_neg=1.0).validate()


def test_the_module_settings_reach_the_objective():
    from lit_rl.learners.config import PolicyConfig

    s = PolicyConfig.of("m", tiny_if_missing={}, policy_loss="vespo", vespo_k_neg=1.5).objective
    assert (s.policy_loss, s.vespo_k_neg, s.vespo_k_pos, s.sapo_tau_pos) == ("vespo", 1.5, None, None)
