"""``core.objective.policy_objective``: one hand-computed float64 case per branch (ratio denominator, mismatch
correction none / tis / mis, extra importance weights, metrics, empty mask, aggregation denominators)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.objective import ObjectiveInputs, ObjectiveSettings, policy_objective

D = torch.float64


def _t(rows):
    return torch.tensor(rows, dtype=D)


def _lp(rows):
    """Log-probs as a leaf that collects the gradient."""
    return torch.tensor(rows, dtype=D).log().requires_grad_(True)


def test_on_policy_step_uses_detached_current_logprobs():
    # old_logprobs None: r = 1, L_t = -A_t; token_mean over the *minibatch* count 4 (this micro-batch holds 2)
    lp = _lp([[0.5, 0.25, 0.8]])
    x = ObjectiveInputs(
        logprobs=lp,
        mask=torch.tensor([[True, True, False]]),
        advantages=_t([[2.0, -1.0, 5.0]]),
        num_tokens=4.0,
        num_seqs=1.0,
        entropy=_t([[1.0, 2.0, 9.0]]),
    )
    parts, m = policy_objective(x, ObjectiveSettings())
    assert list(parts) == ["policy"]
    assert parts["policy"].item() == pytest.approx(-(2.0 - 1.0) / 4, rel=1e-15, abs=1e-15)
    parts["policy"].backward()
    assert torch.allclose(lp.grad, _t([[-0.5, 0.25, 0.0]]), rtol=1e-14, atol=1e-15)  # dL/dlp_t = -A_t / N
    assert m["actor/entropy"] == pytest.approx(1.5, rel=1e-15)  # masked tokens only (9.0 is padding)
    assert m["actor/ratio_max"] == 1.0 and m["actor/ratio_min"] == 1.0 and m["actor/clipfrac"] == 0.0
    assert not any(k.startswith("is/") for k in m) and "rollout/logprob_mismatch_kl" not in m


def test_old_logprobs_clip_and_horizon_aggregation():
    # row 0: r = (1.5, 0.5), A = 1: clipped at 1.2 (L = -1.2, no gradient) and unclipped (L = -0.5, dL/dlp = -A·r)
    # row 1: r = 1, A = -1: L = 1 (dL/dlp = 1); its second token is masked out
    lp = _lp([[1.5, 0.5], [1.0, 1.0]])
    x = ObjectiveInputs(
        logprobs=lp,
        mask=torch.tensor([[True, True], [True, False]]),
        advantages=_t([[1.0, 1.0], [-1.0, 7.0]]),
        old_logprobs=torch.zeros(2, 2, dtype=D),
        num_tokens=3.0,
        num_seqs=2.0,
        horizon=4,
    )
    parts, m = policy_objective(x, ObjectiveSettings(loss_agg="seq_mean_token_sum_norm"))
    # Σ_rows (Σ_t L_t / H) / N_seq = ((-1.2 - 0.5) / 4 + 1 / 4) / 2
    assert parts["policy"].item() == pytest.approx(-0.0875, rel=1e-14)
    parts["policy"].backward()
    assert torch.allclose(lp.grad, _t([[0.0, -0.5 / 8], [1.0 / 8, 0.0]]), rtol=1e-14, atol=1e-15)
    assert m["actor/clipfrac_high"] == pytest.approx(1 / 3, rel=1e-15) and m["actor/clipfrac_low"] == 0.0
    assert m["actor/ratio_max"] == pytest.approx(1.5, rel=1e-14)
    assert m["actor/ratio_min"] == pytest.approx(0.5, rel=1e-14)
    assert "actor/entropy" not in m  # no entropy given: not reported


def _mismatch_inputs(**kw):
    # π_θ = π_old = 1 on both tokens (log 0); the engine μ reported 0.5 and 2 → ρ = π_old / μ = (2, 0.5)
    return ObjectiveInputs(
        logprobs=torch.zeros(1, 2, dtype=D, requires_grad=True),
        mask=torch.ones(1, 2, dtype=torch.bool),
        advantages=_t([[1.0, 1.0]]),
        old_logprobs=torch.zeros(1, 2, dtype=D),
        rollout_logprobs=_t([[0.5, 2.0]]).log(),
        num_tokens=2.0,
        num_seqs=1.0,
        **kw,
    )


# k3 of KL(μ‖π_θ) with ρ = (2, 0.5): mean((ρ - 1) - log ρ) = ((1 - log 2) + (-0.5 + log 2)) / 2
MISMATCH_KL = 0.25


def test_tis_correction_truncates_weights():
    parts, m = policy_objective(
        _mismatch_inputs(), ObjectiveSettings(rollout_correction="tis", correction_cap=1.5)
    )
    # w = min(ρ, 1.5) = (1.5, 0.5); L_t = -A·r·w; token_mean over 2
    assert parts["policy"].item() == pytest.approx(-(1.5 + 0.5) / 2, rel=1e-15)
    assert m["is/max_weight"] == pytest.approx(2.0, rel=1e-14) and m["is/clipped_frac"] == 0.5
    assert m["rollout/logprob_mismatch_kl"] == pytest.approx(MISMATCH_KL, rel=1e-14)


def test_tis_weights_multiply_experience_is_weights():
    x = _mismatch_inputs(is_weights=_t([[2.0, 3.0]]))
    parts, _ = policy_objective(x, ObjectiveSettings(rollout_correction="tis", correction_cap=1.5))
    assert parts["policy"].item() == pytest.approx(-(1.5 * 2 + 0.5 * 3) / 2, rel=1e-15)


def test_mis_band_drops_tokens_outside_it():
    # μ = (0.8, 0.5) → ρ = (1.25, 2); band [1/1.5, 1.5] keeps the first token only, weight 1.25
    x = _mismatch_inputs()
    x.rollout_logprobs = _t([[0.8, 0.5]]).log()
    parts, m = policy_objective(x, ObjectiveSettings(rollout_correction="mis", correction_cap=1.5))
    assert parts["policy"].item() == pytest.approx(-1.25 / 2, rel=1e-14)
    assert m["is/masked_frac"] == 0.5


def test_no_correction_keeps_weights_and_reports_mismatch():
    parts, m = policy_objective(_mismatch_inputs(), ObjectiveSettings(rollout_correction="none"))
    assert parts["policy"].item() == pytest.approx(-1.0, rel=1e-15)  # r = 1, no weight: -(1 + 1) / 2
    assert not any(k.startswith("is/") for k in m)
    assert m["rollout/logprob_mismatch_kl"] == pytest.approx(MISMATCH_KL, rel=1e-14)


def test_experience_is_weights_alone():
    parts, _ = policy_objective(_mismatch_inputs(is_weights=_t([[2.0, 3.0]])), ObjectiveSettings())
    assert parts["policy"].item() == pytest.approx(-(2.0 + 3.0) / 2, rel=1e-15)


def test_empty_mask_gives_zero_loss_zero_gradient_and_no_token_metrics():
    lp = _lp([[0.5, 0.5]])
    x = ObjectiveInputs(
        logprobs=lp,
        mask=torch.zeros(1, 2, dtype=torch.bool),
        advantages=_t([[1.0, 1.0]]),
        num_tokens=1.0,
        num_seqs=1.0,
        rollout_logprobs=_t([[0.5, 0.5]]).log(),
        entropy=_t([[1.0, 1.0]]),
    )
    parts, m = policy_objective(x, ObjectiveSettings(rollout_correction="tis"))
    parts["policy"].backward()
    assert parts["policy"].item() == 0.0 and bool((lp.grad == 0).all())
    assert "actor/entropy" not in m and "rollout/logprob_mismatch_kl" not in m
    assert m["actor/clipfrac"] == 0.0 and not math.isnan(m["is/max_weight"])
