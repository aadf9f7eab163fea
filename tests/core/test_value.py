"""Hand-computed float64 checks of the critic math (lit_rl.core.value)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.value import bce_value_loss, clipped_value_loss, explained_variance, yes_no_value

F64 = torch.float64


def close(actual, expected, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=rtol, atol=atol
    )


def t(x, grad=False):
    return torch.tensor(x, dtype=F64, requires_grad=grad)


def ones_mask(n):
    return torch.ones(1, n, dtype=torch.bool)


# ----------------------------------------------------------------------------- clipped_value_loss


def test_value_loss_unclipped():
    v = t([[1.0, 2.5]], grad=True)
    loss, m = clipped_value_loss(v, t([[9.0, 9.0]]), t([[2.0, 2.0]]), ones_mask(2))
    close(loss, [[0.5, 0.125]])  # 0.5 * (V - R)^2, old values play no part without clip
    loss.sum().backward()
    close(v.grad, [[-1.0, 0.5]])
    assert m == {"vf_clipfrac": 0.0}


def test_value_loss_clipped_term_binds():
    # V_old = 0, V = 1, R = 2, eps = 0.2: clipped V = 0.2, (0.2 - 2)^2 = 3.24 > (1 - 2)^2 = 1 -> 1.62, no gradient.
    v = t([[1.0]], grad=True)
    loss, m = clipped_value_loss(v, t([[0.0]]), t([[2.0]]), ones_mask(1), clip=0.2)
    close(loss, [[1.62]])
    loss.sum().backward()
    close(v.grad, [[0.0]])
    assert m["vf_clipfrac"] == 1.0


def test_value_loss_clip_not_binding():
    # V = 1 moved past eps (V_old = 0) but its own error is the larger one: (1 - .5)^2 = .25 > (.2 - .5)^2 = .09,
    # so the unclipped term is kept with its gradient. V = 0.1 stays inside [V_old - eps, V_old + eps]: terms equal.
    v = t([[1.0, 0.1]], grad=True)
    loss, m = clipped_value_loss(v, t([[0.0, 0.0]]), t([[0.5, 0.5]]), ones_mask(2), clip=0.2)
    close(loss, [[0.125, 0.08]])
    loss.sum().backward()
    close(v.grad, [[0.5, -0.4]])
    assert m["vf_clipfrac"] == 0.0


def test_value_loss_masked_and_all_masked():
    v = t([[1.0, float("inf")], [0.3, 0.0]], grad=True)
    old, ret = t([[0.0, float("nan")], [0.0, 0.0]]), t([[2.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [False, False]])
    loss, m = clipped_value_loss(v, old, ret, mask, clip=0.2)
    close(loss, [[1.62, 0.0], [0.0, 0.0]])
    loss.sum().backward()
    close(v.grad, torch.zeros(2, 2))
    assert m["vf_clipfrac"] == 1.0
    loss, m = clipped_value_loss(v, old, ret, torch.zeros(2, 2, dtype=torch.bool), clip=0.2)
    close(loss, torch.zeros(2, 2))
    assert m["vf_clipfrac"] == 0.0


def test_value_loss_vectorised_matches_loop_and_padding_invariance():
    g = torch.Generator().manual_seed(4)
    v, old, ret = (torch.randn(4, 6, generator=g, dtype=F64) for _ in range(3))
    mask = torch.rand(4, 6, generator=g) > 0.3
    loss, m = clipped_value_loss(v, old, ret, mask, clip=0.3)
    expected, n_clip = [[0.0] * 6 for _ in range(4)], 0
    for b in range(4):
        for j in range(6):
            if mask[b, j]:
                vv, oo, rr = float(v[b, j]), float(old[b, j]), float(ret[b, j])
                vc = min(max(vv, oo - 0.3), oo + 0.3)
                expected[b][j] = 0.5 * max((vv - rr) ** 2, (vc - rr) ** 2)
                n_clip += (vc - rr) ** 2 > (vv - rr) ** 2
    close(loss, expected)
    close(m["vf_clipfrac"], n_clip / int(mask.sum()))
    assert 0 < n_clip < int(mask.sum())
    pad = torch.randn(4, 3, generator=g, dtype=F64) * 100

    def cat(x):
        return torch.cat([x, pad], 1)

    loss2, m2 = clipped_value_loss(
        cat(v), cat(old), cat(ret), torch.cat([mask, torch.zeros(4, 3, dtype=torch.bool)], 1), clip=0.3
    )
    close(loss2[:, :6], loss, rtol=0, atol=0)
    close(loss2[:, 6:], torch.zeros(4, 3), rtol=0, atol=0)
    assert m2 == m


def test_value_loss_errors():
    with pytest.raises(ValueError, match=r"returns has shape \(1, 3\) but values has shape \(1, 2\)"):
        clipped_value_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[0.0, 0.0, 0.0]]), ones_mask(2))
    with pytest.raises(TypeError, match="mask must be a torch.bool tensor"):
        clipped_value_loss(t([[0.0]]), t([[0.0]]), t([[0.0]]), torch.ones(1, 1))
    with pytest.raises(ValueError, match="clip must be None or > 0"):
        clipped_value_loss(t([[0.0]]), t([[0.0]]), t([[0.0]]), ones_mask(1), clip=0.0)
    with pytest.raises(ValueError, match="returns holds NaN or Inf"):
        clipped_value_loss(t([[0.0]]), t([[0.0]]), t([[float("nan")]]), ones_mask(1))


# ----------------------------------------------------------------------------- explained_variance


def test_explained_variance_hand_example():
    # R = [1, 2, 3, 4], V = [1, 2, 2, 5]: R - V = [0, 0, 1, -1], Var = 0.5; Var[R] = 1.25; EV = 1 - 0.4 = 0.6.
    values = t([[1.0, 2.0, 2.0], [5.0, 99.0, 0.0]])
    returns = t([[1.0, 2.0, 3.0], [4.0, -7.0, float("nan")]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    close(explained_variance(values, returns, mask), 0.6)
    close(explained_variance(returns, returns, mask), 1.0)


def test_explained_variance_degenerate_returns_zero():
    mask = ones_mask(3)
    assert explained_variance(t([[0.0, 1.0, 2.0]]), t([[2.0, 2.0, 2.0]]), mask) == 0.0  # Var[R] = 0
    assert (
        explained_variance(t([[0.0, 1.0, 2.0]]), t([[1.0, 2.0, 3.0]]), torch.tensor([[True, False, False]]))
        == 0.0
    )
    assert (
        explained_variance(t([[0.0, 1.0, 2.0]]), t([[1.0, 2.0, 3.0]]), torch.zeros(1, 3, dtype=torch.bool))
        == 0.0
    )


# ----------------------------------------------------------------------------- yes/no value head and BCE


def test_yes_no_value_equals_renormalised_probability():
    logits = t([[2.0, 0.5, 3.0, -1.0]])  # vocab of 4; "yes" = 0, "no" = 1
    p = torch.softmax(logits, dim=-1)
    expected = p[:, 0] / (p[:, 0] + p[:, 1])
    close(yes_no_value(logits[:, 0], logits[:, 1]), expected)
    close(expected, [1 / (1 + math.exp(-1.5))])
    close(yes_no_value(t([1000.0, -1000.0]), t([-1000.0, 1000.0])), [1.0, 0.0])  # saturates, no NaN
    with pytest.raises(ValueError, match=r"logits_no has shape \(2,\) but logits_yes has shape \(1,\)"):
        yes_no_value(t([0.0]), t([0.0, 0.0]))


def test_bce_value_loss_values_gradient_and_mask():
    z = t([[0.3, -1.2, 1000.0, 5.0]], grad=True)
    y = t([[0.7, 0.0, 1.0, -100.0]])  # last token is padding with a placeholder target
    mask = torch.tensor([[True, True, True, False]])
    loss = bce_value_loss(z, y, mask)
    s = 1 / (1 + math.exp(-0.3))
    expected = [-(0.7 * math.log(s) + 0.3 * math.log(1 - s)), math.log1p(math.exp(-1.2)), 0.0, 0.0]
    close(loss, [expected])
    loss.sum().backward()
    close(z.grad, [[s - 0.7, 1 / (1 + math.exp(1.2)), 0.0, 0.0]])  # d/dz = sigmoid(z) - y


def test_bce_value_loss_rejects_out_of_range_targets_and_bad_mask():
    with pytest.raises(ValueError, match=r"target must lie in \[0, 1\]"):
        bce_value_loss(t([[0.0, 0.0]]), t([[0.5, 1.5]]), ones_mask(2))
    with pytest.raises(TypeError, match="mask must be a torch.bool tensor"):
        bce_value_loss(t([[0.0]]), t([[0.5]]), torch.ones(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"target has shape \(1, 2\) but value_logit has shape \(1, 1\)"):
        bce_value_loss(t([[0.0]]), t([[0.5, 0.5]]), ones_mask(1))
