"""Hand-computed and equivalence tests for lit_rl.core.kl (all float64 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.kl import KL_KINDS, generalized_jsd, kl_estimate, kl_from_logits

F64 = torch.float64
RTOL = 1e-12
LN2 = math.log(2)


def _close(actual, expected, rtol=RTOL, atol=1e-14):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# sampled estimators
# ---------------------------------------------------------------------------------------------
# π(y) = (1/2, 1/4), π_ref(y) = (1/4, 1/2)  ->  log r = (-ln 2, +ln 2)
LP = [[math.log(0.5), math.log(0.25)]]
REF = [[math.log(0.25), math.log(0.5)]]
HAND = {
    "k1": [[LN2, -LN2]],
    "k2": [[0.5 * LN2**2, 0.5 * LN2**2]],
    "k3": [[(0.5 - 1) + LN2, (2 - 1) - LN2]],
}


def test_kl_kinds():
    assert KL_KINDS == ("k1", "k2", "k3")


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_estimate_hand_values(kind):
    out = kl_estimate(torch.tensor(LP, dtype=F64), torch.tensor(REF, dtype=F64), kind)
    _close(out, HAND[kind])


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_estimate_gradient_hand_values(kind):
    # d/d logprobs with log r = ref - lp:  k1 -> 1;  k2 -> -log r;  k3 -> 1 - r
    lp = torch.tensor(LP, dtype=F64, requires_grad=True)
    kl_estimate(lp, torch.tensor(REF, dtype=F64), kind).sum().backward()
    expected = {"k1": [[1.0, 1.0]], "k2": [[LN2, -LN2]], "k3": [[1 - 0.5, 1 - 2.0]]}[kind]
    _close(lp.grad, expected)


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_estimate_vectorised_vs_loop(kind):
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(3, 4, generator=g, dtype=F64) * 3, -torch.rand(3, 4, generator=g, dtype=F64) * 3
    mask = torch.rand(3, 4, generator=g) > 0.3
    out = kl_estimate(lp, ref, kind, mask=mask)
    for b in range(3):
        for t in range(4):
            lr = ref[b, t].item() - lp[b, t].item()
            want = {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1 - lr}[kind] if mask[b, t] else 0.0
            assert out[b, t].item() == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_estimate_masked_positions_are_zero_even_with_garbage(kind):
    lp = torch.tensor([[math.log(0.5), -math.inf, math.nan]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), 0.0]], dtype=F64)
    mask = torch.tensor([[True, False, False]])
    for clamp in (20.0, None):  # the clamp must not be what keeps NaN out of the gradient
        out = kl_estimate(lp, ref, kind, mask=mask, log_ratio_clamp=clamp)
        _close(out, [[HAND[kind][0][0], 0.0, 0.0]])
        (grad,) = torch.autograd.grad(out.sum(), lp)
        assert grad[0, 1:].tolist() == [0.0, 0.0]


def test_kl_estimate_padding_invariance():
    lp, ref = torch.tensor(LP, dtype=F64), torch.tensor(REF, dtype=F64)
    lp_pad = torch.cat([lp, torch.tensor([[-5.0, 0.0]], dtype=F64)], dim=1)
    ref_pad = torch.cat([ref, torch.tensor([[-1.0, -9.0]], dtype=F64)], dim=1)
    mask = torch.tensor([[True, True, False, False]])
    for kind in KL_KINDS:
        out = kl_estimate(lp_pad, ref_pad, kind, mask=mask)
        _close(out[:, :2], kl_estimate(lp, ref, kind))
        _close(out[:, 2:], [[0.0, 0.0]])


def test_kl_estimate_clamp_default_and_off():
    lp, ref = torch.tensor([[-31.0]], dtype=F64), torch.tensor([[-1.0]], dtype=F64)  # log r = 30
    _close(kl_estimate(lp, ref, "k1"), [[-20.0]])
    _close(kl_estimate(lp, ref, "k3"), [[math.exp(20) - 1 - 20]])
    _close(kl_estimate(lp, ref, "k3", log_ratio_clamp=None), [[math.exp(30) - 1 - 30]])
    _close(kl_estimate(ref, lp, "k1", log_ratio_clamp=5.0), [[5.0]])  # log r = -30 -> -5


def test_k1_k3_unbiased_k2_biased():
    # Monte-Carlo: sample y ~ π on V=5, compare sample means with the exact KL(π‖π_ref).
    pi = torch.tensor([0.6, 0.2, 0.1, 0.05, 0.05], dtype=F64)
    ref = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3], dtype=F64)
    exact = float((pi * (pi.log() - ref.log())).sum())
    n = 100_000
    y = torch.multinomial(pi, n, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, lref = pi.log()[y].unsqueeze(0), ref.log()[y].unsqueeze(0)  # (1, n)
    for kind in ("k1", "k3"):
        k = kl_estimate(lp, lref, kind)
        se = float(k.std()) / math.sqrt(n)
        assert abs(float(k.mean()) - exact) < 4 * se, kind
    k2 = kl_estimate(lp, lref, "k2")
    # E[k2] = 1.1957 here vs KL = 0.9652: the bias is ~100 standard errors
    assert float(k2.mean()) - exact > 20 * float(k2.std()) / math.sqrt(n)


def test_kl_estimate_errors():
    lp = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(lp, lp, "k4")
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        kl_estimate(lp, torch.zeros(2, 4, dtype=F64), "k1")
    with pytest.raises(TypeError, match="mask"):
        kl_estimate(lp, lp, "k1", mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask.*\(2, 2\).*\(2, 3\)"):
        kl_estimate(lp, lp, "k1", mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="log_ratio_clamp"):
        kl_estimate(lp, lp, "k1", log_ratio_clamp=0.0)
    bad = lp.clone()
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"non-finite.*\(1, 2\)"):
        kl_estimate(bad, lp, "k3")


# ---------------------------------------------------------------------------------------------
# exact KL from logits
# ---------------------------------------------------------------------------------------------
P3 = [1 / 6, 1 / 3, 1 / 2]  # softmax of (ln 1, ln 2, ln 3)
LOG3 = [0.0, math.log(2), math.log(3)]
REV3 = sum(p * math.log(p / (1 / 3)) for p in P3)  # KL(p‖uniform)
FWD3 = sum((1 / 3) * math.log((1 / 3) / p) for p in P3)  # KL(uniform‖p)


def _pair3():
    p = torch.tensor([[LOG3]], dtype=F64, requires_grad=True)  # (1, 1, 3) student
    q = torch.tensor([[[0.7, 0.7, 0.7]]], dtype=F64, requires_grad=True)  # uniform teacher
    return p, q, torch.ones(1, 1, dtype=torch.bool)


def test_kl_reverse_hand_values_and_gradients():
    p, q, mask = _pair3()
    out = kl_from_logits(p, q, mask, "reverse")
    _close(out, [[REV3]])
    out.sum().backward()
    # dKL(p‖q)/da_v = p_v (log p_v - log q_v - KL);  dKL(p‖q)/db_v = q_v - p_v
    _close(p.grad, [[[x * (math.log(x / (1 / 3)) - REV3) for x in P3]]])
    _close(q.grad, [[[1 / 3 - x for x in P3]]])


def test_kl_forward_hand_values_and_gradients():
    p, q, mask = _pair3()
    out = kl_from_logits(p, q, mask, "forward")
    _close(out, [[FWD3]])
    out.sum().backward()
    _close(p.grad, [[[x - 1 / 3 for x in P3]]])
    _close(q.grad, [[[(1 / 3) * (math.log((1 / 3) / x) - FWD3) for x in P3]]])


@pytest.mark.parametrize("direction", ["reverse", "forward"])
@pytest.mark.parametrize("chunk_size", [1, 3, 100, None])
def test_kl_matches_torch_distributions_with_gradients(direction, chunk_size):
    g = torch.Generator().manual_seed(1)
    p = torch.randn(2, 3, 9, generator=g, dtype=F64).requires_grad_(True)
    q = torch.randn(2, 3, 9, generator=g, dtype=F64).requires_grad_(True)
    w = torch.randn(2, 3, generator=g, dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    out = kl_from_logits(p, q, mask, direction, chunk_size=chunk_size)
    P, Q = torch.distributions.Categorical(logits=p), torch.distributions.Categorical(logits=q)
    ref = (
        torch.distributions.kl_divergence(P, Q)
        if direction == "reverse"
        else torch.distributions.kl_divergence(Q, P)
    )
    _close(out, ref.detach(), atol=1e-13)
    ga = torch.autograd.grad((out * w).sum(), (p, q))
    gb = torch.autograd.grad((ref * w).sum(), (p, q))
    for a, b in zip(ga, gb):
        _close(a, b, atol=1e-13)


def test_kl_temperature():
    g = torch.Generator().manual_seed(2)
    p, q = torch.randn(1, 2, 5, generator=g, dtype=F64), torch.randn(1, 2, 5, generator=g, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for d in ("reverse", "forward"):
        _close(kl_from_logits(p, q, mask, d, temperature=2.0), kl_from_logits(p / 2, q / 2, mask, d))


def test_kl_masked_rows_zero_value_and_gradient_even_with_nan():
    p, q, _ = _pair3()
    p2 = torch.cat([p.detach(), torch.full((1, 1, 3), math.nan, dtype=F64)], dim=1).requires_grad_(True)
    q2 = torch.cat([q.detach(), torch.zeros(1, 1, 3, dtype=F64)], dim=1).requires_grad_(True)
    mask = torch.tensor([[True, False]])
    for d, val in (("reverse", REV3), ("forward", FWD3)):
        out = kl_from_logits(p2, q2, mask, d, chunk_size=1)
        _close(out, [[val, 0.0]])
        ga, gb = torch.autograd.grad(out.sum(), (p2, q2))
        assert ga[0, 1].tolist() == [0.0] * 3 and gb[0, 1].tolist() == [0.0] * 3


def test_kl_padding_invariance():
    g = torch.Generator().manual_seed(3)
    p, q = torch.randn(2, 3, 6, generator=g, dtype=F64), torch.randn(2, 3, 6, generator=g, dtype=F64)
    pp = torch.cat([p, torch.randn(2, 2, 6, generator=g, dtype=F64)], dim=1)
    qp = torch.cat([q, torch.randn(2, 2, 6, generator=g, dtype=F64)], dim=1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask_p = torch.cat([mask, torch.zeros(2, 2, dtype=torch.bool)], dim=1)
    for d in ("reverse", "forward"):
        out = kl_from_logits(pp, qp, mask_p, d, chunk_size=4)
        _close(out[:, :3], kl_from_logits(p, q, mask, d, chunk_size=4))
        assert out[:, 3:].abs().sum().item() == 0.0
    out = generalized_jsd(pp, qp, 0.3, mask_p, chunk_size=4)
    _close(out[:, :3], generalized_jsd(p, q, 0.3, mask, chunk_size=4))
    assert out[:, 3:].abs().sum().item() == 0.0


def test_kl_masked_vocabulary_minus_inf():
    # an entry at -inf in both: 0·log 0 terms vanish; equals the KL over the remaining entries
    p = torch.tensor([[LOG3 + [-math.inf]]], dtype=F64, requires_grad=True)
    q = torch.tensor([[[0.0, 0.0, 0.0, -math.inf]]], dtype=F64, requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    out = kl_from_logits(p, q, mask, "reverse") + kl_from_logits(p, q, mask, "forward")
    _close(out, [[REV3 + FWD3]])
    out.sum().backward()
    assert torch.isfinite(p.grad).all() and torch.isfinite(q.grad).all()
    # q has zero mass where p has some -> KL(p‖q) = inf at an unmasked position: an error
    with pytest.raises(ValueError, match="non-finite"):
        kl_from_logits(q.detach(), p.detach()[..., [0, 1, 2, 0]], mask, "forward")
    with pytest.raises(ValueError, match="non-finite"):
        kl_from_logits(torch.zeros(1, 1, 4, dtype=F64), q.detach(), mask, "reverse")


def test_kl_from_logits_errors():
    z = torch.zeros(2, 3, 4)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(2, 3, 5\)"):
        kl_from_logits(z, torch.zeros(2, 3, 5), mask)
    with pytest.raises(ValueError, match="forward, reverse"):
        kl_from_logits(z, z, mask, direction="backward")
    with pytest.raises(TypeError, match="mask"):
        kl_from_logits(z, z, mask.float())
    with pytest.raises(ValueError, match=r"mask.*\(3, 2\).*\(2, 3\)"):
        kl_from_logits(z, z, torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="3-D"):
        kl_from_logits(z[0], z[0], mask[0])
    with pytest.raises(ValueError, match="temperature"):
        kl_from_logits(z, z, mask, temperature=0.0)


# ---------------------------------------------------------------------------------------------
# generalized JSD (GKD): M = β·q + (1-β)·p, JSD = β KL(q‖M) + (1-β) KL(p‖M), β on the teacher q
# ---------------------------------------------------------------------------------------------
def _jsd_by_hand(p, q, beta):
    m = [beta * b + (1 - beta) * a for a, b in zip(p, q)]

    def kl(x, y):
        return sum(a * math.log(a / b) for a, b in zip(x, y) if a > 0)

    return beta * kl(q, m) + (1 - beta) * kl(p, m)


@pytest.mark.parametrize("beta", [0.5, 0.3, 0.9])
def test_jsd_hand_values(beta):
    p, q, mask = _pair3()
    out = generalized_jsd(p, q, beta, mask)
    _close(out, [[_jsd_by_hand(P3, [1 / 3] * 3, beta)]])


def test_jsd_beta_weights_the_teacher():
    p, q, mask = _pair3()
    # swapping the roles of student and teacher is the same as β -> 1-β
    _close(generalized_jsd(p, q, 0.3, mask), generalized_jsd(q, p, 0.7, mask).detach())
    # and the value is the GKD one (β on q), measurably not the β-on-p one
    a = generalized_jsd(p, q, 0.3, mask).item()
    assert a == pytest.approx(_jsd_by_hand(P3, [1 / 3] * 3, 0.3), rel=1e-12)
    assert abs(a - _jsd_by_hand([1 / 3] * 3, P3, 0.3)) > 1e-4


def test_jsd_limits_are_forward_and_reverse_kl():
    p, q, mask = _pair3()
    eps = 1e-8
    _close(generalized_jsd(p, q, eps, mask) / eps, [[FWD3]], rtol=1e-6)  # β → 0: KL(q‖p)
    _close(generalized_jsd(p, q, 1 - eps, mask) / eps, [[REV3]], rtol=1e-6)  # β → 1: KL(p‖q)


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_jsd_rejects_beta_outside_open_interval(beta):
    p, q, mask = _pair3()
    with pytest.raises(ValueError, match="kl_from_logits"):
        generalized_jsd(p, q, beta, mask)


@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_jsd_matches_naive_with_gradients(chunk_size):
    g = torch.Generator().manual_seed(5)
    p = torch.randn(2, 3, 7, generator=g, dtype=F64).requires_grad_(True)
    q = torch.randn(2, 3, 7, generator=g, dtype=F64).requires_grad_(True)
    w = torch.randn(2, 3, generator=g, dtype=F64)
    mask = torch.tensor([[True, False, True], [True, True, True]])
    beta = 0.25
    out = generalized_jsd(p, q, beta, mask, chunk_size=chunk_size)
    lp, lq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
    m = beta * lq.exp() + (1 - beta) * lp.exp()
    ref = beta * (lq.exp() * (lq - m.log())).sum(-1) + (1 - beta) * (lp.exp() * (lp - m.log())).sum(-1)
    ref = ref * mask
    _close(out, ref.detach(), atol=1e-13)
    ga = torch.autograd.grad((out * w).sum(), (p, q))
    gb = torch.autograd.grad((ref * w).sum(), (p, q))
    for a, b in zip(ga, gb):
        _close(a, b, atol=1e-13)


def test_jsd_masked_vocabulary_minus_inf():
    p = torch.tensor([[LOG3 + [-math.inf]]], dtype=F64, requires_grad=True)
    q = torch.tensor([[[0.0, 0.0, 0.0, -math.inf]]], dtype=F64, requires_grad=True)
    out = generalized_jsd(p, q, 0.4, torch.ones(1, 1, dtype=torch.bool))
    _close(out, [[_jsd_by_hand(P3, [1 / 3] * 3, 0.4)]])
    out.sum().backward()
    assert torch.isfinite(p.grad).all() and torch.isfinite(q.grad).all()


def test_kl_and_jsd_only_differentiate_what_requires_grad():
    p = torch.randn(1, 2, 5, dtype=F64, requires_grad=True)
    q = torch.randn(1, 2, 5, dtype=F64)  # frozen teacher
    mask = torch.ones(1, 2, dtype=torch.bool)
    (kl_from_logits(p, q, mask).sum() + generalized_jsd(p, q, 0.5, mask).sum()).backward()
    assert p.grad is not None and q.grad is None
