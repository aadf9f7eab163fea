"""Hand-computed float64 checks of importance ratios, TIS/MIS weights and rollout correction."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lit_rl.core.importance import (
    CORRECTION_LEVELS,
    CORRECTION_MODES,
    k3_mismatch_kl,
    masked_weights,
    rollout_correction,
    sequence_log_ratio,
    token_log_ratio,
    truncated_weights,
)

F64 = torch.float64
E = math.exp
INF = float("inf")


def close(actual, expected, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=rtol, atol=atol
    )


def example():
    """Two rows; token log-ratios row 0: [0.1, 0.5, -0.2], row 1: [1.0, 0.3, <padding>]."""
    behavior = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.7, -INF]], dtype=F64)
    log_ratio = torch.tensor([[0.1, 0.5, -0.2], [1.0, 0.3, 0.0]], dtype=F64)
    logprobs = (behavior.nan_to_num(neginf=0.0) + log_ratio).requires_grad_(True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return logprobs, behavior, mask


def test_exports():
    assert CORRECTION_MODES == ("none", "tis", "mis")
    assert CORRECTION_LEVELS == ("token", "sequence", "geometric")


def test_token_log_ratio_zero_on_padding_and_differentiable():
    lp, beh, mask = example()
    lr = token_log_ratio(lp, beh, mask)  # padding holds -inf behaviour logprob: must not leak
    close(lr, [[0.1, 0.5, -0.2], [1.0, 0.3, 0.0]])
    lr.sum().backward()
    close(lp.grad, mask.to(F64))


def test_sequence_log_ratio_sum_and_mean_and_empty_row():
    lp, beh, mask = example()
    mask = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    lp, beh = (
        torch.cat([lp.detach(), torch.zeros(1, 3, dtype=F64)]),
        torch.cat([beh, torch.ones(1, 3, dtype=F64)]),
    )
    close(sequence_log_ratio(lp, beh, mask), [0.4, 1.3, 0.0])
    close(sequence_log_ratio(lp, beh, mask, length_normalize=True), [0.4 / 3, 0.65, 0.0])


def test_truncated_weights_values_and_metrics():
    lr = torch.tensor([[0.1, 0.5, -0.2], [1.0, 0.3, 7.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    w, m = truncated_weights(lr, 1.5, mask=mask)
    close(w, [[E(0.1), 1.5, E(-0.2)], [1.5, E(0.3), 1.5]])
    assert not w.requires_grad
    close(m["max_weight"], E(1.0))  # the masked-out 7.0 does not count
    close(m["clipped_frac"], 2 / 5)
    _, m_all = truncated_weights(lr, 1.5)  # no mask: every entry counts
    close(m_all["max_weight"], E(7.0))
    close(m_all["clipped_frac"], 3 / 6)


def test_truncated_weights_overflow_safe():
    w, m = truncated_weights(torch.tensor([1000.0, -1000.0, INF], dtype=F64), 2.0)
    close(w, [2.0, 0.0, 2.0])
    assert m["max_weight"] == math.inf
    close(m["clipped_frac"], 2 / 3)


def test_masked_weights_high_only_and_with_low():
    lr = torch.tensor([[0.1, 0.5, -0.2], [1.0, 0.3, 7.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    keep, m = masked_weights(lr, 1.5, mask=mask)
    assert keep.tolist() == [[True, False, True], [False, True, False]]
    close(m["max_weight"], E(1.0))
    close(m["masked_frac"], 2 / 5)
    keep, m = masked_weights(lr, 1.5, low=0.9, mask=mask)  # e^-0.2 = 0.819 < 0.9 is dropped too
    assert keep.tolist() == [[True, False, False], [False, True, False]]
    close(m["masked_frac"], 3 / 5)
    keep, _ = masked_weights(torch.tensor([1000.0, -1000.0, 0.0], dtype=F64), 2.0, low=0.5)
    assert keep.tolist() == [False, False, True]
    keep, m = masked_weights(torch.tensor([-1000.0], dtype=F64), 2.0)  # low=None: no lower bound
    assert keep.tolist() == [True] and m["masked_frac"] == 0.0


@pytest.mark.parametrize("bad", [{"high": 0.0}, {"high": 2.0, "low": -0.1}, {"high": 2.0, "low": 2.0}])
def test_masked_weights_bad_bounds(bad):
    with pytest.raises(ValueError, match="high must be > 0|low must be None or in"):
        masked_weights(torch.zeros(2, dtype=F64), **bad)


def test_weights_reject_nan_and_bad_cap():
    with pytest.raises(ValueError, match="log_ratio holds NaN"):
        truncated_weights(torch.tensor([0.0, float("nan")], dtype=F64), 2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_weights(torch.zeros(2, dtype=F64), 0.0)
    # NaN on an entry the mask leaves out is padding and allowed.
    w, _ = truncated_weights(
        torch.tensor([0.0, float("nan")], dtype=F64), 2.0, mask=torch.tensor([True, False])
    )
    close(w[0], 1.0)


# ----------------------------------------------------------------------------- rollout_correction, every branch


KL = sum(math.expm1(x) - x for x in (0.1, 0.5, -0.2, 1.0, 0.3)) / 5


@pytest.mark.parametrize(
    "mode, level, low, weights, keep, metrics",
    [
        (
            "none",
            "token",
            None,
            [[1, 1, 1], [1, 1, 0]],
            [[1, 1, 1], [1, 1, 0]],
            {"max_weight": E(1.0), "clipped_frac": 0.0, "masked_frac": 0.0},
        ),
        (
            "tis",
            "token",
            None,
            [[E(0.1), 1.5, E(-0.2)], [1.5, E(0.3), 0]],
            [[1, 1, 1], [1, 1, 0]],
            {"max_weight": E(1.0), "clipped_frac": 2 / 5, "masked_frac": 0.0},
        ),
        (
            "mis",
            "token",
            None,
            [[E(0.1), 0, E(-0.2)], [0, E(0.3), 0]],
            [[1, 0, 1], [0, 1, 0]],
            {"max_weight": E(1.0), "clipped_frac": 0.0, "masked_frac": 2 / 5},
        ),
        (
            "mis",
            "token",
            0.9,
            [[E(0.1), 0, 0], [0, E(0.3), 0]],
            [[1, 0, 0], [0, 1, 0]],
            {"max_weight": E(1.0), "clipped_frac": 0.0, "masked_frac": 3 / 5},
        ),
        (
            "none",
            "sequence",
            None,
            [[1, 1, 1], [1, 1, 0]],
            [[1, 1, 1], [1, 1, 0]],
            {"max_weight": E(1.3), "clipped_frac": 0.0, "masked_frac": 0.0},
        ),
        (
            "tis",
            "sequence",
            None,
            [[E(0.4)] * 3, [1.5, 1.5, 0]],
            [[1, 1, 1], [1, 1, 0]],
            {"max_weight": E(1.3), "clipped_frac": 1 / 2, "masked_frac": 0.0},
        ),
        (
            "mis",
            "sequence",
            None,
            [[E(0.4)] * 3, [0, 0, 0]],
            [[1, 1, 1], [0, 0, 0]],
            {"max_weight": E(1.3), "clipped_frac": 0.0, "masked_frac": 1 / 2},
        ),
        (
            "tis",
            "geometric",
            None,
            [[E(0.4 / 3)] * 3, [1.5, 1.5, 0]],
            [[1, 1, 1], [1, 1, 0]],
            {"max_weight": E(0.65), "clipped_frac": 1 / 2, "masked_frac": 0.0},
        ),
        (
            "mis",
            "geometric",
            None,
            [[E(0.4 / 3)] * 3, [0, 0, 0]],
            [[1, 1, 1], [0, 0, 0]],
            {"max_weight": E(0.65), "clipped_frac": 0.0, "masked_frac": 1 / 2},
        ),
        (
            "mis",
            "geometric",
            1.2,
            [[0, 0, 0], [0, 0, 0]],
            [[0, 0, 0], [0, 0, 0]],
            {"max_weight": E(0.65), "clipped_frac": 0.0, "masked_frac": 1.0},
        ),
    ],
)
def test_rollout_correction_branches(mode, level, low, weights, keep, metrics):
    lp, beh, mask = example()
    w, k, m = rollout_correction(lp, beh, mask, mode, level, cap=1.5, low=low)
    close(w, weights)
    assert k.dtype == torch.bool and k.tolist() == torch.tensor(keep, dtype=torch.bool).tolist()
    assert not w.requires_grad
    assert m.keys() == {"max_weight", "clipped_frac", "masked_frac", "mismatch_kl"}
    for key, value in {**metrics, "mismatch_kl": KL}.items():
        close(m[key], value)


def test_rollout_correction_sequence_fractions_skip_empty_rows():
    lp, beh, mask = example()
    lp = torch.cat([lp.detach(), torch.zeros(1, 3, dtype=F64)])
    beh, mask = (
        torch.cat([beh, torch.zeros(1, 3, dtype=F64)]),
        torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)]),
    )
    w, k, m = rollout_correction(lp, beh, mask, "tis", "sequence", cap=1.5)
    close(m["clipped_frac"], 1 / 2)  # two rows with tokens, not three
    close(w[2], [0.0, 0.0, 0.0])
    assert not k[2].any()


def test_rollout_correction_overflow_safe():
    beh = torch.tensor([[-1000.0, -1.0], [-1.0, -1.0]], dtype=F64)
    lp = torch.tensor([[-0.5, 999.0], [-1.0, -1.0]], dtype=F64)  # log-ratios 999.5, 1000, 0, 0
    mask = torch.ones(2, 2, dtype=torch.bool)
    for level in CORRECTION_LEVELS:
        w, _, m = rollout_correction(lp, beh, mask, "tis", level, cap=3.0)
        close(w[0], [3.0, 3.0])
        close(w[1], [1.0, 1.0])
        assert m["max_weight"] == math.inf and m["mismatch_kl"] == math.inf
        w, k, m = rollout_correction(lp, beh, mask, "mis", level, cap=3.0)
        close(w, [[0.0, 0.0], [1.0, 1.0]])
        assert k.tolist() == [[False, False], [True, True]]
        assert not any(math.isnan(v) for v in m.values())


def _loop_correction(lp, beh, mask, mode, level, cap):
    weights = [[0.0] * len(lp[0]) for _ in lp]
    for b in range(len(lp)):
        toks = [t for t in range(len(lp[0])) if mask[b][t]]
        diffs = [lp[b][t] - beh[b][t] for t in toks]
        if level == "token":
            per_tok = diffs
        else:
            s = sum(diffs) / (len(diffs) if level == "geometric" and diffs else 1)
            per_tok = [s] * len(toks)
        for t, d in zip(toks, per_tok):
            rho = math.exp(d)
            weights[b][t] = min(rho, cap) if mode == "tis" else (rho if 1 / cap <= rho <= cap else 0.0)
    return weights


@pytest.mark.parametrize("mode, level", itertools.product(["tis", "mis"], CORRECTION_LEVELS))
def test_rollout_correction_matches_python_loop(mode, level):
    g = torch.Generator().manual_seed(3)
    beh = -torch.rand(4, 7, generator=g, dtype=F64) * 3
    lp = beh + torch.randn(4, 7, generator=g, dtype=F64) * 0.4
    mask = torch.rand(4, 7, generator=g) > 0.25
    w, _, _ = rollout_correction(lp, beh, mask, mode, level, cap=1.3)
    close(w, _loop_correction(lp.tolist(), beh.tolist(), mask.tolist(), mode, level, 1.3))


@pytest.mark.parametrize("mode, level", itertools.product(CORRECTION_MODES, CORRECTION_LEVELS))
def test_rollout_correction_padding_invariance(mode, level):
    lp, beh, mask = example()
    w, k, m = rollout_correction(lp, beh, mask, mode, level, cap=1.5)
    pad = torch.tensor([[5.0, -INF], [40.0, 3.0]], dtype=F64)
    w2, k2, m2 = rollout_correction(
        torch.cat([lp.detach(), pad.nan_to_num(neginf=0.0)], 1),
        torch.cat([beh, pad], 1),
        torch.cat([mask, torch.zeros(2, 2, dtype=torch.bool)], 1),
        mode,
        level,
        cap=1.5,
    )
    close(w2[:, :3], w, rtol=1e-12, atol=1e-15)
    close(w2[:, 3:], torch.zeros(2, 2), rtol=0, atol=0)
    assert k2[:, :3].tolist() == k.tolist() and not k2[:, 3:].any()
    for key in m:
        close(m2[key], m[key], rtol=1e-12, atol=1e-15)


def band_example():
    """Five rows, cap 2 (default low 1/2), with these token log-ratios (log 0.5 = -0.693, log 2 = 0.693).

    r0 [-1.0, 0.2, 1.0]   tokens below / inside / above;  sum 0.2 inside;   mean 0.0667 inside
    r1 [-0.6, -0.5, pad]  tokens inside;                  sum -1.1 below;   mean -0.55 inside
    r2 [0.4, 0.4, 0.4]    tokens inside;                  sum 1.2 above;    mean 0.4 inside
    r3 [-0.8, -0.8, pad]  tokens below;                   sum -1.6 below;   mean -0.8 below
    r4 [0.8, 0.8, 0.8]    tokens above;                   sum 2.4 above;    mean 0.8 above
    """
    lr = torch.tensor(
        [[-1.0, 0.2, 1.0], [-0.6, -0.5, 0.0], [0.4] * 3, [-0.8, -0.8, 0.0], [0.8] * 3], dtype=F64
    )
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[1, 2] = mask[3, 2] = False
    behavior = torch.full((5, 3), -2.0, dtype=F64)
    return behavior + lr, behavior, mask


@pytest.mark.parametrize(
    "level, low, weights, frac",
    [
        # token level, default low = 1/cap = 0.5: below and above the band dropped, inside kept
        ("token", None, [[0, E(0.2), 0], [E(-0.6), E(-0.5), 0], [E(0.4)] * 3, [0, 0, 0], [0, 0, 0]], 7 / 13),
        (
            "token",
            0.6,
            [[0, E(0.2), 0], [0, E(-0.5), 0], [E(0.4)] * 3, [0, 0, 0], [0, 0, 0]],
            8 / 13,
        ),  # e^-0.6 < 0.6
        (
            "token",
            0.0,
            [[E(-1.0), E(0.2), 0], [E(-0.6), E(-0.5), 0], [E(0.4)] * 3, [E(-0.8), E(-0.8), 0], [0, 0, 0]],
            4 / 13,
        ),  # low = 0: upper bound only
        # sequence level (whole-trajectory ratio): r1, r3 below, r2, r4 above, r0 inside
        ("sequence", None, [[E(0.2)] * 3, [0] * 3, [0] * 3, [0] * 3, [0] * 3], 4 / 5),
        (
            "sequence",
            0.3,
            [[E(0.2)] * 3, [E(-1.1), E(-1.1), 0], [0] * 3, [0] * 3, [0] * 3],
            3 / 5,
        ),  # e^-1.1 = 0.333
        (
            "sequence",
            0.0,
            [[E(0.2)] * 3, [E(-1.1), E(-1.1), 0], [0] * 3, [E(-1.6), E(-1.6), 0], [0] * 3],
            2 / 5,
        ),
        # geometric (GSPO length-normalised): r3 below, r4 above, r0-r2 inside
        (
            "geometric",
            None,
            [[E(0.2 / 3)] * 3, [E(-0.55), E(-0.55), 0], [E(0.4)] * 3, [0] * 3, [0] * 3],
            2 / 5,
        ),
        (
            "geometric",
            0.0,
            [[E(0.2 / 3)] * 3, [E(-0.55), E(-0.55), 0], [E(0.4)] * 3, [E(-0.8), E(-0.8), 0], [0] * 3],
            1 / 5,
        ),
    ],
)
def test_mis_band_masks_below_low_and_above_cap(level, low, weights, frac):
    lp, beh, mask = band_example()
    w, k, m = rollout_correction(lp, beh, mask, "mis", level, cap=2.0, low=low)
    close(w, weights)
    assert k.tolist() == (torch.tensor(weights, dtype=F64) > 0).tolist()
    close(m["masked_frac"], frac)


def test_mis_band_settings_errors():
    lp, beh, mask = band_example()
    with pytest.raises(ValueError, match=r"cap=1.0 <= 1 has no default lower bound"):
        rollout_correction(lp, beh, mask, "mis", "token", cap=1.0)
    with pytest.raises(ValueError, match=r"low must be in \[0, cap=2.0\)"):
        rollout_correction(lp, beh, mask, "mis", "token", cap=2.0, low=2.0)
    with pytest.raises(ValueError, match=r"low must be in \[0, cap=2.0\)"):
        rollout_correction(lp, beh, mask, "mis", "token", cap=2.0, low=-0.1)
    w, _, _ = rollout_correction(lp, beh, mask, "mis", "token", cap=0.9, low=0.5)  # explicit low: any cap
    close(w[0], [0.0, 0.0, 0.0])


def test_rollout_correction_bad_names_and_settings():
    lp, beh, mask = example()
    with pytest.raises(ValueError, match="unknown correction mode 'clip'; valid modes: none, tis, mis"):
        rollout_correction(lp, beh, mask, "clip", "token", cap=2.0)
    with pytest.raises(
        ValueError, match="unknown correction level 'seq'; valid levels: token, sequence, geometric"
    ):
        rollout_correction(lp, beh, mask, "tis", "seq", cap=2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        rollout_correction(lp, beh, mask, "tis", "token", cap=-1.0)
    with pytest.raises(ValueError, match="low=0.5 is only used by mode='mis'"):
        rollout_correction(lp, beh, mask, "tis", "token", cap=2.0, low=0.5)


def test_bad_shapes_mask_and_non_finite_inputs():
    lp, beh, mask = example()
    with pytest.raises(
        ValueError, match=r"behavior_logprobs has shape \(2, 2\) but logprobs has shape \(2, 3\)"
    ):
        token_log_ratio(lp, beh[:, :2], mask)
    with pytest.raises(TypeError, match="mask must be a torch.bool tensor"):
        token_log_ratio(lp, beh, mask.long())
    bad = beh.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="behavior_logprobs holds NaN or Inf"):
        rollout_correction(lp, bad, mask, "tis", "token", cap=2.0)


def test_k3_mismatch_kl_hand_value_and_direction():
    # Samples from mu; rho = pi/mu = 2 on one token, 1/2 on the other: k3 = mean((rho - 1) - log rho).
    beh = torch.tensor([[-1.0, -1.0, 0.0]], dtype=F64)
    lp = beh + torch.tensor([[math.log(2.0), -math.log(2.0), 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    expected = ((1.0 - math.log(2.0)) + (-0.5 + math.log(2.0))) / 2
    close(k3_mismatch_kl(lp, beh, mask), expected)
    assert k3_mismatch_kl(lp, beh, torch.zeros_like(mask)) == 0.0
