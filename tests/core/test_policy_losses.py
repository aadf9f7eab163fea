"""Hand-computed float64 checks of every policy-loss branch (lit_rl.core.policy_losses)."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from lit_rl.core.policy_losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossKwargs,
    PolicyLossSettings,
    compute_policy_loss,
    loss_settings,
)

F64 = torch.float64
LN = math.log


def close(actual, expected, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=rtol, atol=atol
    )


def make(log_ratio, adv, mask=None, old=None, **kw):
    """Inputs with old_logprobs = ``old`` (default -1) and logprobs = old + log_ratio, a leaf with grad."""
    lr = torch.tensor(log_ratio, dtype=F64)
    old_t = torch.full_like(lr, -1.0) if old is None else torch.tensor(old, dtype=F64)
    lp = (old_t + lr).detach().requires_grad_(True)
    m = torch.ones_like(lr, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return PolicyLossInputs(lp, old_t, torch.tensor(adv, dtype=F64), m, **kw)


def loss_and_grad(name, inputs):
    loss, metrics = compute_policy_loss(name, inputs)
    loss.sum().backward()
    return loss.detach(), inputs.logprobs.grad, metrics


def test_registry_names_and_unknown_name():
    assert POLICY_LOSSES.names() == ["cispo", "gspo", "ppo_clip", "reinforce", "sapo", "vespo"]
    with pytest.raises(ValueError, match="valid names: cispo, gspo, ppo_clip, reinforce, sapo, vespo"):
        compute_policy_loss("ppo", make([[0.0]], [[1.0]]))


# ----------------------------------------------------------------------------- ppo_clip branches


def test_ppo_unclipped():
    # r = 1.1, A = 2: L = -r*A = -2.2, dL/dlogpi = -r*A.
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(1.1)]], [[2.0]]))
    close(loss, [[-2.2]])
    close(grad, [[-2.2]])
    assert m["clipfrac"] == 0.0


def test_ppo_clipped_high_positive_advantage():
    # r = 1.5 > 1.2, A = 2: L = -min(3.0, 2.4) = -2.4, constant -> zero gradient.
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(1.5)]], [[2.0]]))
    close(loss, [[-2.4]])
    close(grad, [[0.0]])
    assert (m["clipfrac_high"], m["clipfrac_low"], m["clipfrac"]) == (1.0, 0.0, 1.0)


def test_ppo_clipped_low_negative_advantage():
    # r = 0.5 < 0.8, A = -2: L = -min(-1.0, -1.6) = 1.6, zero gradient.
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(0.5)]], [[-2.0]]))
    close(loss, [[1.6]])
    close(grad, [[0.0]])
    assert (m["clipfrac_high"], m["clipfrac_low"], m["clipfrac"]) == (0.0, 1.0, 1.0)


def test_ppo_clip_not_binding_outside_range():
    # r = 1.5 with A = -1: L = -min(-1.5, -1.2) = 1.5 (unclipped, grad -r*A = 1.5);
    # r = 0.5 with A = +1: L = -min(0.5, 0.8) = -0.5 (unclipped, grad -0.5).
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(1.5), LN(0.5)]], [[-1.0, 1.0]]))
    close(loss, [[1.5, -0.5]])
    close(grad, [[1.5, -0.5]])
    assert m["clipfrac"] == 0.0


def test_ppo_asymmetric_bounds():
    # clip_low = 0.1, clip_high = 0.3: interval [0.9, 1.3].
    inputs = make(
        [[LN(1.25), LN(1.35), LN(0.95), LN(0.85)]], [[1.0, 1.0, -1.0, -1.0]], clip_low=0.1, clip_high=0.3
    )
    loss, grad, m = loss_and_grad("ppo_clip", inputs)
    close(loss, [[-1.25, -1.3, 0.95, 0.9]])
    close(grad, [[-1.25, 0.0, 0.95, 0.0]])
    assert (m["clipfrac_high"], m["clipfrac_low"]) == (0.25, 0.25)


def test_ppo_dual_clip_active():
    # r = 4, A = -1, c = 3: clipped surrogate gives 4, dual clip bounds it by c*|A| = 3, zero gradient.
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(4.0)]], [[-1.0]], dual_clip=3.0))
    close(loss, [[3.0]])
    close(grad, [[0.0]])
    assert (m["dual_clipfrac"], m["clipfrac"]) == (1.0, 0.0)


def test_ppo_dual_clip_inactive():
    # r = 2 < c with A = -1: L = 2 (unbounded branch); A > 0 is never dual-clipped: r = 4, A = 1 -> -1.2.
    loss, grad, m = loss_and_grad("ppo_clip", make([[LN(2.0), LN(4.0)]], [[-1.0, 1.0]], dual_clip=3.0))
    close(loss, [[2.0, -1.2]])
    close(grad, [[2.0, 0.0]])
    assert m["dual_clipfrac"] == 0.0


def test_ppo_masked_tokens_give_zero_loss_and_gradient_even_with_garbage():
    inputs = make([[LN(1.1), 0.0, 0.0]], [[2.0, float("nan"), 5.0]], mask=[[True, False, False]])
    with torch.no_grad():
        inputs.logprobs[0, 1] = float("-inf")  # padding may hold anything
        inputs.old_logprobs[0, 2] = float("inf")
    loss, grad, m = loss_and_grad("ppo_clip", inputs)
    close(loss, [[-2.2, 0.0, 0.0]])
    close(grad, [[-2.2, 0.0, 0.0]])
    close(m["ratio_max"], 1.1)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo", "reinforce"])
def test_all_masked_gives_zeros(name):
    inputs = make([[0.3, -0.2], [1.0, 0.1]], [[1.0, -1.0], [2.0, 0.5]], mask=[[False, False], [False, False]])
    loss, grad, m = loss_and_grad(name, inputs)
    close(loss, torch.zeros(2, 2))
    close(grad, torch.zeros(2, 2))
    assert set(m.values()) == {0.0} and len(m) == 8


def test_ppo_metrics_hand_example():
    # ratios 1.5 (A=1, high clip), 0.5 (A=-1, low clip), 1.0 (A=1), 4.0 (A=-1, dual clip c=3), + one padding token.
    r = [1.5, 0.5, 1.0, 4.0, 7.0]
    inputs = make(
        [[LN(x) for x in r]], [[1.0, -1.0, 1.0, -1.0, -1.0]], mask=[[True] * 4 + [False]], dual_clip=3.0
    )
    _, m = compute_policy_loss("ppo_clip", inputs)
    k3 = sum((x - 1) - LN(x) for x in r[:4]) / 4
    expected = {
        "clipfrac_low": 0.25,
        "clipfrac_high": 0.25,
        "clipfrac": 0.5,
        "dual_clipfrac": 0.25,
        "ratio_min": 0.5,
        "ratio_mean": 1.75,
        "ratio_max": 4.0,
        "approx_kl": k3,
    }
    assert m.keys() == expected.keys()
    for key, value in expected.items():
        close(m[key], value)


def test_is_weights_multiply_loss_and_gradient():
    w = torch.tensor([[0.5, 2.0]], dtype=F64, requires_grad=True)
    loss, grad, _ = loss_and_grad("ppo_clip", make([[LN(1.1), LN(0.9)]], [[2.0, 1.0]], is_weights=w))
    close(loss, [[-2.2 * 0.5, -0.9 * 2.0]])
    close(grad, [[-2.2 * 0.5, -0.9 * 2.0]])
    assert w.grad is None  # detached


def test_ppo_huge_log_ratio_stays_finite():
    # log r = 1000: A > 0 is clipped (finite value, zero grad); A < 0 without dual clip hits the e^20 clamp.
    loss, grad, m = loss_and_grad("ppo_clip", make([[1000.0, 1000.0]], [[1.0, -1.0]]))
    close(loss, [[-1.2, math.exp(20.0)]])
    close(grad, [[0.0, 0.0]])
    assert m["ratio_max"] == math.inf and not any(math.isnan(v) for v in m.values())


def _ppo_loop(lp, old, adv, mask, cl, ch, c):
    out = [[0.0] * len(lp[0]) for _ in lp]
    for b in range(len(lp)):
        for t in range(len(lp[0])):
            if not mask[b][t]:
                continue
            r, a = math.exp(lp[b][t] - old[b][t]), adv[b][t]
            loss = -min(r * a, min(max(r, 1 - cl), 1 + ch) * a)
            if c is not None and a < 0:
                loss = min(loss, -c * a)
            out[b][t] = loss
    return out


def test_ppo_vectorised_matches_python_loop():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(5, 9, generator=g, dtype=F64) * 3
    old = lp + torch.randn(5, 9, generator=g, dtype=F64) * 0.6
    adv = torch.randn(5, 9, generator=g, dtype=F64)
    mask = torch.rand(5, 9, generator=g) > 0.3
    x = PolicyLossInputs(lp, old, adv, mask, clip_low=0.15, clip_high=0.25, dual_clip=2.0)
    loss, m = compute_policy_loss("ppo_clip", x)
    expected = _ppo_loop(lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.15, 0.25, 2.0)
    close(loss, expected)
    assert 0 < m["clipfrac"] < 1 and 0 < m["dual_clipfrac"] < 1  # every branch occurred


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo", "reinforce"])
def test_padding_invariance(name):
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(3, 5, generator=g, dtype=F64)
    old = lp + torch.randn(3, 5, generator=g, dtype=F64) * 0.3
    roll = lp + torch.randn(3, 5, generator=g, dtype=F64) * 0.1
    adv = torch.randn(3, 5, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    kw = {"rollout_logprobs": roll} if name == "reinforce" else {}
    loss, m = compute_policy_loss(
        name, PolicyLossInputs(lp, old, adv, mask, clip_low=0.1, clip_high=0.1, **kw)
    )
    pad = torch.randn(3, 4, generator=g, dtype=F64) * 50

    def cat(x):
        return torch.cat([x, pad], dim=1)

    kw = {"rollout_logprobs": cat(roll)} if name == "reinforce" else {}
    padded = PolicyLossInputs(
        cat(lp),
        cat(old),
        cat(adv),
        torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1),
        clip_low=0.1,
        clip_high=0.1,
        **kw,
    )
    loss_p, m_p = compute_policy_loss(name, padded)
    # Not bit-exact: a longer row may be summed in a different order (GSPO's sequence mean).
    close(loss_p[:, :5], loss, rtol=1e-12, atol=1e-15)
    close(loss_p[:, 5:], torch.zeros(3, 4), rtol=0, atol=0)
    assert m_p.keys() == m.keys()
    for key in m:
        close(m_p[key], m[key], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- gspo


def test_gspo_value_and_sequence_metrics():
    # row 0: two tokens, log ratios 0.1, 0.3 -> s_0 = e^0.2; row 1: one token + padding, s_1 = e^-0.5.
    inputs = make(
        [[0.1, 0.3], [-0.5, 9.0]],
        [[1.0, 1.0], [-2.0, -2.0]],
        mask=[[True, True], [True, False]],
        clip_low=0.3,
        clip_high=0.3,
    )
    loss, grad, m = loss_and_grad("gspo", inputs)
    s0, s1 = math.exp(0.2), math.exp(-0.5)
    # row 0 unclipped: L = -s0*A; row 1: s1 = 0.607 < 0.7 with A < 0 -> clipped: L = -(0.7 * -2) = 1.4.
    close(loss, [[-s0, -s0], [1.4, 0.0]])
    close(grad, [[-s0, -s0], [0.0, 0.0]])  # d s_{i,t} / d logpi_t = s_i
    close(m["ratio_min"], s1)
    close(m["ratio_mean"], (s0 + s1) / 2)
    close(m["ratio_max"], s0)
    close(m["clipfrac_low"], 1 / 3)
    close(m["approx_kl"], sum(math.expm1(x) - x for x in (0.1, 0.3, -0.5)) / 3)


def test_gspo_gradient_equals_sequence_level_gspo():
    # Rows with per-row advantages, lengths 4, 6, 2, 5 and GSPO's tiny clip range; rows 1 and 2 are built to clip.
    cl, ch = 3e-4, 4e-4
    g = torch.Generator().manual_seed(2)
    lengths = [4, 6, 2, 5]
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    old = -torch.rand(4, 6, generator=g, dtype=F64) * 2
    delta = torch.randn(4, 6, generator=g, dtype=F64) * 1e-4
    delta[1] += 1e-3  # s_1 ~ e^1e-3 > 1 + 4e-4 with A > 0: clipped high
    delta[2] -= 1e-3  # s_2 < 1 - 3e-4 with A < 0: clipped low
    adv_row = torch.tensor([0.7, 1.3, -0.4, -1.1], dtype=F64)
    adv = adv_row[:, None].expand(4, 6)
    lp = (old + delta).requires_grad_(True)

    loss, m = compute_policy_loss("gspo", PolicyLossInputs(lp, old, adv, mask, clip_low=cl, clip_high=ch))
    n = mask.sum(-1).to(F64)
    (loss.sum(-1) / n).mean().backward()  # seq_mean_token_mean aggregation
    grad_token_form = lp.grad.clone()

    lp2 = (old + delta).requires_grad_(True)
    s = torch.exp(
        ((lp2 - old) * mask).sum(-1) / n
    )  # (B,) sequence ratio of the paper, differentiated directly
    objective = torch.minimum(s * adv_row, s.clamp(1 - cl, 1 + ch) * adv_row)
    (-objective.mean()).backward()

    close(grad_token_form, lp2.grad, rtol=1e-9, atol=1e-15)
    assert grad_token_form[1].abs().max() == 0 and grad_token_form[2].abs().max() == 0  # clipped rows
    assert grad_token_form[0, :4].abs().min() > 0 and grad_token_form[3, :5].abs().min() > 0
    close(m["clipfrac_high"], 6 / 17)
    close(m["clipfrac_low"], 2 / 17)


# ----------------------------------------------------------------------------- cispo


def test_cispo_value_and_gradient_through_logpi_only():
    # r = 1.5 -> weight 1.2; r = 0.9 -> weight 0.9 (inside); r = 0.5 -> weight 0.8 (lower clip binds, A > 0).
    inputs = make([[LN(1.5), LN(0.9), LN(0.5)]], [[2.0, -1.0, 1.0]], old=[[-1.0, -2.0, -0.5]])
    inputs.old_logprobs.requires_grad_(True)
    lp = inputs.logprobs.detach()
    loss, grad, m = loss_and_grad("cispo", inputs)
    w = torch.tensor([[1.2, 0.9, 0.8]], dtype=F64)
    adv = inputs.advantages
    close(loss, -w * adv * lp)
    close(grad, -w * adv)  # the clipped tokens still get a gradient, only their weight is bounded
    assert inputs.old_logprobs.grad is None
    assert (m["clipfrac_high"], m["clipfrac_low"]) == (1 / 3, 1 / 3)


def test_cispo_clip_low_one_disables_lower_bound_and_clip_counts_any_sign():
    inputs = make([[LN(0.05), LN(3.0), LN(3.0)]], [[1.0, -1.0, 0.0]], clip_low=1.0, clip_high=0.5)
    loss, grad, m = loss_and_grad("cispo", inputs)
    close(grad, [[-0.05, 1.5, 0.0]])
    close(loss, -torch.tensor([[0.05, -1.5, 0.0]], dtype=F64) * inputs.logprobs.detach())
    assert (m["clipfrac_low"], m["clipfrac_high"]) == (0.0, 1 / 3)  # A = 0 token: clipping changes nothing


# ----------------------------------------------------------------------------- reinforce


def test_reinforce_without_is_weight():
    inputs = make([[0.4, -0.3]], [[2.0, -0.5]], old=[[-1.0, -2.0]])
    loss, grad, m = loss_and_grad("reinforce", inputs)
    close(loss, [[-2.0 * -0.6, 0.5 * -2.3]])
    close(grad, [[-2.0, 0.5]])
    assert m["clipfrac"] == 0.0
    close(m["ratio_max"], math.exp(0.4))


def test_reinforce_with_rollout_is_weight():
    # log pi = [-0.6, -2.3], log mu = [-0.8, -2.0]: w = [e^0.2, e^-0.3], detached.
    inputs = make(
        [[0.4, -0.3]],
        [[2.0, -0.5]],
        old=[[-1.0, -2.0]],
        rollout_logprobs=torch.tensor([[-0.8, -2.0]], dtype=F64, requires_grad=True),
    )
    loss, grad, _ = loss_and_grad("reinforce", inputs)
    w = [math.exp(0.2), math.exp(-0.3)]
    close(loss, [[-w[0] * 2.0 * -0.6, w[1] * 0.5 * -2.3]])
    close(grad, [[-w[0] * 2.0, w[1] * 0.5]])
    assert inputs.rollout_logprobs.grad is None


@pytest.mark.parametrize("name", ["cispo", "reinforce"])
def test_dual_clip_rejected_where_unused(name):
    with pytest.raises(ValueError, match="dual_clip=3.0 is not used by policy loss"):
        compute_policy_loss(name, make([[0.0]], [[1.0]], dual_clip=3.0))


# ----------------------------------------------------------------------------- validation


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"advantages has shape \(1, 3\) but logprobs has shape \(1, 2\)"):
        PolicyLossInputs(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match=r"logprobs must be \(B, T\)"):
        PolicyLossInputs(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool))


def test_mask_must_be_bool():
    with pytest.raises(TypeError, match="mask must be a torch.bool tensor"):
        PolicyLossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"clip_low": -0.1}, "clip_low must be in"),
        ({"clip_low": 1.5}, "clip_low must be in"),
        ({"clip_high": 0.0}, "clip_high must be"),
        ({"dual_clip": 1.0}, "dual_clip must be None or > 1"),
        ({"is_weights": torch.tensor([[-1.0]], dtype=F64)}, "is_weights must be >= 0"),
    ],
)
def test_bad_settings_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        make([[0.0]], [[1.0]], **kw)


def test_non_finite_masked_in_value_raises():
    with pytest.raises(ValueError, match="advantages holds NaN or Inf"):
        make([[0.0, 0.0]], [[1.0, float("nan")]])


def test_loss_settings_kwargs_list_every_setting():
    # PolicyLossKwargs repeats PolicyLossSettings' names for the type checker: a setting added to one
    # only would silently not reach the losses (or fail at construction).
    assert list(PolicyLossKwargs.__annotations__) == [f.name for f in fields(PolicyLossSettings)]
    s = PolicyLossSettings(clip_low=0.1, clip_high=0.3, dual_clip=3.0, vespo_k_neg=4.0)
    kw = loss_settings(s)
    assert kw["clip_low"] == 0.1 and kw["clip_high"] == 0.3 and kw["dual_clip"] == 3.0
    assert kw["vespo_k_neg"] == 4.0 and kw["sapo_tau_pos"] is None
