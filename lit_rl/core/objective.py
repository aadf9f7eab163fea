"""The policy objective of one micro-batch: log-probs of the sampled tokens → the policy loss part and its metrics.

This is the algorithm of ``PolicyModule`` with the model, the optimizer and Lightning taken out: what an
algorithm author changes lives here or in the registries it calls. Per micro-batch, with π_θ the policy being
trained, π_old the policy the ratio is taken against and μ the engine that sampled the tokens:

1. ratio denominator: log π_old = ``old_logprobs`` when the Experience carries them (several optimizer steps
   per Experience), else the detached current log-probs (one on-policy step: ratio 1, gradient ∇ log π_θ);
2. engine-mismatch correction (``rollout_correction`` none|tis|mis, ``core.importance``): per-token weights
   w_t · keep_t from ρ = π_old / μ, times any per-token ``is_weights`` the Experience carries;
3. per-token policy loss ``L_t`` (``core.policy_losses``: ppo_clip, gspo, cispo, sapo, vespo, reinforce);
4. ``policy = agg(L_t)`` with ``loss_agg`` over the *minibatch* denominators (``num_tokens`` / ``num_seqs``
   of all ranks) and the run's constant horizon, so micro-batch parts sum to the minibatch loss
   (``core.aggregation``).

Metrics (no gradient, floats): ``is/*`` of the correction, ``actor/entropy`` (mean over trainable tokens),
``rollout/logprob_mismatch_kl`` (k3 estimate of KL(μ‖π_θ)) and ``actor/*`` of the policy loss; how they
combine over micro-batches is declared in ``core.metrics``. Pure tensor math: no model, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rl.core.aggregation import AGG_MODES, aggregate
from lit_rl.core.importance import CORRECTION_LEVELS, CORRECTION_MODES, k3_mismatch_kl, rollout_correction
from lit_rl.core.names import CorrectionLevel, CorrectionMode, LossAgg, PolicyLossName
from lit_rl.core.policy_losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossSettings,
    compute_policy_loss,
    loss_settings,
)
from lit_rl.core.settings import setting


@dataclass(frozen=True, kw_only=True)
class ObjectiveSettings(PolicyLossSettings):
    """The settings of the objective: the policy loss's own (``PolicyLossSettings``: clip_*, dual_clip,
    sapo_*, vespo_*), its aggregation and the engine-mismatch correction. One declaration each;
    ``PolicyModule`` takes them flat and validates them (``learners.config``)."""

    policy_loss: PolicyLossName | str = setting(
        "ppo_clip", "Per-token policy loss (core.policy_losses).", choices=POLICY_LOSSES.names
    )
    loss_agg: LossAgg = setting(
        "token_mean",
        "How token losses combine: token_mean (DAPO), seq_mean_token_mean (GRPO), "
        "seq_mean_token_sum, seq_mean_token_sum_norm (Dr. GRPO).",
        choices=AGG_MODES,
    )
    loss_horizon: int | None = setting(
        None,
        "The constant H seq_mean_token_sum_norm divides each row's token sum by; null = the "
        "Experience's horizon (RolloutCallback: sampling.max_new_tokens); with neither, that mode raises.",
    )
    rollout_correction: CorrectionMode = setting(
        "none",
        "Engine-vs-trainer mismatch correction (core.importance): tis truncates, mis masks the ratio.",
        choices=CORRECTION_MODES,
    )
    correction_level: CorrectionLevel = setting(
        "token", "Level of the mismatch ratio of rollout_correction.", choices=CORRECTION_LEVELS
    )
    correction_cap: float = setting(
        2.0, "Upper bound of the mismatch ratio (tis: truncation, mis: band top)."
    )
    correction_low: float | None = setting(
        None,
        "Lower bound of the mis band [low, cap] (IcePop, arXiv 2510.18855); null = 1/correction_cap, "
        "0 = no lower bound (TRL's vllm_importance_sampling_clip_min=None).",
    )


@dataclass
class ObjectiveInputs:
    """One micro-batch as the objective reads it; every tensor is (b, C), aligned with the completion tokens.

    Shapes / meaning:
        logprobs:          log π_θ(y_t) at the module's temperature, differentiable.
        mask:              bool, the trainable tokens (``Experience.train_mask``).
        advantages:        A_t, zero off ``mask``.
        old_logprobs:      log π_old(y_t) or None (= ``logprobs.detach()``).
        rollout_logprobs:  log μ(y_t) reported by the engine, or None (no correction, no mismatch metric).
        is_weights:        extra per-token importance weights or None.
        entropy:           H(π_θ(·|s_t)) per position for the ``actor/entropy`` metric, or None (metric not
                           reported); only read without gradient here.
        num_tokens, num_seqs: the minibatch's global denominators (> 0); horizon: H of seq_mean_token_sum_norm.
    """

    logprobs: Tensor
    mask: Tensor
    advantages: Tensor
    num_tokens: float
    num_seqs: float
    horizon: int | None = None
    old_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    is_weights: Tensor | None = None
    entropy: Tensor | None = None


def policy_objective(
    inputs: ObjectiveInputs, settings: ObjectiveSettings
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """``({"policy": agg(L_t)}, metrics)`` for one micro-batch (see the module doc for the steps).

    Returns the loss part as a scalar tensor (differentiable through ``inputs.logprobs``) and a dict of floats.
    """
    s, x = settings, inputs
    mask, lp = x.mask, x.logprobs
    old = x.old_logprobs if x.old_logprobs is not None else lp.detach()
    is_w, metrics = None, {}
    if s.rollout_correction != "none" and x.rollout_logprobs is not None:
        w, keep, cm = rollout_correction(
            old,
            x.rollout_logprobs,
            mask,
            s.rollout_correction,
            s.correction_level,
            s.correction_cap,
            s.correction_low,
        )
        is_w = w * keep
        metrics.update({f"is/{k}": v for k, v in cm.items()})
    if x.is_weights is not None:
        is_w = x.is_weights if is_w is None else is_w * x.is_weights
    per_token, pm = compute_policy_loss(
        s.policy_loss,
        PolicyLossInputs(
            logprobs=lp,
            old_logprobs=old,
            advantages=x.advantages,
            mask=mask,
            rollout_logprobs=None,
            is_weights=is_w,
            **loss_settings(s),
        ),
    )
    policy = aggregate(per_token, mask, s.loss_agg, x.horizon, num_tokens=x.num_tokens, num_seqs=x.num_seqs)
    with torch.no_grad():
        if mask.any():
            if x.entropy is not None:
                metrics["actor/entropy"] = float(x.entropy.detach()[mask].mean())
            if x.rollout_logprobs is not None:
                metrics["rollout/logprob_mismatch_kl"] = k3_mismatch_kl(lp.detach(), x.rollout_logprobs, mask)
    metrics.update({f"actor/{k}": v for k, v in pm.items()})
    return {"policy": policy}, metrics
