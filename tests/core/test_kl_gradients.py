"""What each KL estimator does *as a loss*, by exact enumeration over a small vocabulary (float64).

π = softmax(θ) over V = 5 tokens, π_ref a fixed, quite different distribution. For an estimator k used as a
loss on samples y ~ π (the samples held fixed, k differentiated through log π(y) — how ReferenceKL's
``where="loss"`` term and GRPO use it) the expected gradient is

    E_{y~π}[∇_θ k(y)] = Σ_y π(y) ∇_θ k(y)      (π(y) a constant weight here: the sampling is not differentiated)

computed exactly by summing over the whole vocabulary, and compared with the gradient of an exactly computed
KL. These back the claims in ``core.kl.kl_estimate``'s docstring and ReferenceKL's k1+loss rejection.
"""

import pytest
import torch

from lit_rl.core.kl import kl_estimate

F64 = torch.float64
THETA = [1.2, -0.3, 0.5, -1.1, 0.0]
REF = [0.05, 0.15, 0.1, 0.3, 0.4]  # far from softmax(THETA): the KL directions differ visibly


def _theta(values=THETA):
    return torch.tensor(values, dtype=F64, requires_grad=True)


def expected_loss_gradient(kind: str, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Σ_y π(y).detach() · ∇_θ k(y): the exact expectation of the sampled loss's gradient."""
    logp = torch.log_softmax(theta, -1)
    k = kl_estimate(logp[None], ref.log()[None], kind, log_ratio_clamp=None)[0]  # (V,) one entry per token y
    surrogate = (logp.exp().detach() * k).sum()
    (g,) = torch.autograd.grad(surrogate, theta)
    return g


def kl_gradient(direction: str, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """∇_θ of KL(π‖π_ref) ("reverse") or KL(π_ref‖π) ("forward"), computed exactly."""
    logp = torch.log_softmax(theta, -1)
    if direction == "reverse":
        kl = (logp.exp() * (logp - ref.log())).sum()
    else:
        kl = (ref * (ref.log() - logp)).sum()
    (g,) = torch.autograd.grad(kl, theta)
    return g


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_k1_in_the_loss_has_zero_expected_gradient():
    g = expected_loss_gradient("k1", _theta(), torch.tensor(REF, dtype=F64))
    assert float(g.abs().max()) <= 1e-15  # E_π[∇ log π] = Σ ∇π = ∇ 1 = 0
    assert float(kl_gradient("reverse", _theta(), torch.tensor(REF, dtype=F64)).abs().max()) > 0.1


def test_k2_in_the_loss_has_the_gradient_of_kl_pi_ref():
    ref = torch.tensor(REF, dtype=F64)
    g = expected_loss_gradient("k2", _theta(), ref)
    torch.testing.assert_close(g, kl_gradient("reverse", _theta(), ref), rtol=1e-12, atol=1e-14)
    assert _rel(g, kl_gradient("forward", _theta(), ref)) > 0.1  # and it is not the forward KL's


def test_k3_in_the_loss_has_the_gradient_of_kl_ref_pi():
    ref = torch.tensor(REF, dtype=F64)
    g = expected_loss_gradient("k3", _theta(), ref)
    torch.testing.assert_close(g, kl_gradient("forward", _theta(), ref), rtol=1e-12, atol=1e-14)
    assert _rel(g, kl_gradient("reverse", _theta(), ref)) > 0.1  # not KL(π‖π_ref)'s, away from π_ref


def test_k1_and_k3_values_are_unbiased_for_kl_pi_ref_and_k2_is_not():
    theta, ref = _theta(), torch.tensor(REF, dtype=F64)
    logp = torch.log_softmax(theta, -1).detach()
    exact = float((logp.exp() * (logp - ref.log())).sum())
    mean = {
        kind: float(
            (logp.exp() * kl_estimate(logp[None], ref.log()[None], kind, log_ratio_clamp=None)[0]).sum()
        )
        for kind in ("k1", "k2", "k3")
    }
    assert mean["k1"] == pytest.approx(exact, rel=1e-12)
    assert mean["k3"] == pytest.approx(exact, rel=1e-12)
    assert abs(mean["k2"] - exact) > 0.05 * exact


def test_forward_and_reverse_gradients_agree_to_first_order_near_the_reference():
    """Why k3 in the loss still works as a KL penalty: with π = π_ref·exp(ε·δ), the two gradients differ by
    O(ε²) while each is O(ε), so shrinking ε by 10 shrinks the difference by ~100."""
    ref = torch.tensor(REF, dtype=F64)
    delta = torch.tensor([0.7, -1.0, 0.4, 0.2, -0.3], dtype=F64)
    diffs = []
    for eps in (1e-2, 1e-3):
        theta = (ref.log() + eps * delta).clone().requires_grad_(True)
        fwd, rev = kl_gradient("forward", theta, ref), kl_gradient("reverse", theta, ref)
        assert float(rev.norm()) == pytest.approx(float(fwd.norm()), rel=0.05)  # both O(ε)
        diffs.append(float((fwd - rev).norm()))
    assert 0.008 < diffs[1] / diffs[0] < 0.012  # second order: ratio ≈ (1e-3 / 1e-2)² = 0.01
