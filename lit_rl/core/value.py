"""Critic math: PPO's (clipped) value loss, explained variance, and the parameter-free yes/no "token" value head.

All per-token losses are (B, T) and zero wherever ``mask`` is False; the caller aggregates them with the same
modes as the policy loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["bce_value_loss", "clipped_value_loss", "explained_variance", "yes_no_value"]


def _check(mask: Tensor, ref_name: str, ref: Tensor, **others: Tensor) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a torch.bool tensor, got {got}")
    for name, x in {**others, "mask": mask}.items():
        if x.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
            )
    for name, x in {ref_name: ref, **others}.items():
        if not bool(torch.isfinite(x.detach()[mask]).all()):
            raise ValueError(f"{name} holds NaN or Inf on masked-in tokens")


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """PPO value loss, optionally clipped around the values the rollout was scored with.

    clip=eps: L_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - eps, V_old_t + eps) - R_t)^2)
    clip=None: L_t = 0.5 * (V_t - R_t)^2

    The paper (arXiv 1707.06347) states the squared error; the clipped form is the one from OpenAI's baselines
    PPO2 implementation, which every PPO-for-LLM trainer adopted. Taking the max is pessimistic: once V has moved
    more than eps from V_old in the direction that lowers the error, the gradient is 0. ``old_values`` is detached.
    Metric ``vf_clipfrac``: fraction of masked tokens where the clipped term is strictly larger (its gradient is
    then 0); 0.0 without clipping or with no masked tokens.

    Shapes:
        values, old_values, returns, mask: (B, T). returns per_token_loss (B, T), metrics dict[str, float].
    """
    _check(mask, "values", values, old_values=old_values, returns=returns)
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be None or > 0, got {clip}")
    zeros = torch.zeros_like(values)
    # Replace padding before any arithmetic: an Inf there would give a NaN gradient even through a final where.
    v = torch.where(mask, values, zeros)
    ret = torch.where(mask, returns.detach(), torch.zeros_like(returns))
    unclipped = (v - ret).square()
    n = int(mask.sum())
    if clip is None:
        return torch.where(mask, 0.5 * unclipped, zeros), {"vf_clipfrac": 0.0}
    old = torch.where(mask, old_values.detach(), torch.zeros_like(old_values))
    v_clipped = old + (v - old).clamp(-clip, clip)  # (B, T), equals clip(V, V_old - eps, V_old + eps)
    clipped = (v_clipped - ret).square()
    loss = 0.5 * torch.maximum(unclipped, clipped)
    with torch.no_grad():
        binds = (clipped > unclipped) & mask
        frac = float(binds.sum()) / n if n else 0.0
    return torch.where(mask, loss, zeros), {"vf_clipfrac": frac}


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """Explained variance of the returns by the critic, over masked tokens: 1 - Var[R - V] / Var[R].

    1 is a perfect critic, 0 is no better than predicting the mean return, negative is worse than that. Both
    variances are population variances (the normalisation cancels), computed in float64. When Var[R] = 0 (all
    masked returns equal, one token, or none) the ratio is undefined; this returns 0.0 ("nothing explained")
    rather than NaN or +-inf, so the metric stays loggable. Equality of returns is tested exactly, not against a
    variance threshold, so tiny but real spreads still give the true value.

    Shapes:
        values, returns, mask: (B, T). returns a Python float.
    """
    _check(mask, "values", values, returns=returns)
    with torch.no_grad():
        r = returns.detach().double()[mask]
        if r.numel() < 2 or bool((r == r[0]).all()):
            return 0.0
        err = r - values.detach().double()[mask]
        return float(1.0 - err.var(unbiased=False) / r.var(unbiased=False))


def yes_no_value(logits_yes: Tensor, logits_no: Tensor) -> Tensor:
    """Value read off the policy's own next-token logits: V = P(yes) / (P(yes) + P(no)) = sigmoid(l_yes - l_no).

    The "token" value head: the critic is a language model asked a yes/no question (e.g. "will this answer be
    correct?") and the value is the renormalised probability of " yes" among {" yes", " no"}; no new parameters.
    The softmax normaliser cancels, so only the logit difference matters, and sigmoid of the difference is exact
    and overflow-free. Train it with ``bce_value_loss`` on ``logits_yes - logits_no``.

    Shapes:
        logits_yes, logits_no: any matching shape, e.g. (B, T). returns the same shape, values in [0, 1].
    """
    if logits_yes.shape != logits_no.shape:
        raise ValueError(
            f"logits_no has shape {tuple(logits_no.shape)} but logits_yes has shape {tuple(logits_yes.shape)}"
        )
    return torch.sigmoid(logits_yes - logits_no)


def bce_value_loss(value_logit: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Binary cross-entropy of sigmoid(value_logit) toward soft targets in [0, 1], per token.

    L_t = -(y_t * log sigmoid(z_t) + (1 - y_t) * log(1 - sigmoid(z_t))) = softplus(z_t) - y_t * z_t,
    evaluated in that stable form (no log of a saturated probability). With ``value_logit = logits_yes -
    logits_no`` this trains the yes/no value head. A target outside [0, 1] on a masked-in token raises ValueError
    (padding may hold any placeholder). Zero where ``mask`` is False.

    Shapes:
        value_logit, target, mask: (B, T). returns per_token_loss (B, T).
    """
    _check(mask, "value_logit", value_logit, target=target)
    t = target.detach()[mask]
    if bool(((t < 0) | (t > 1)).any()):
        raise ValueError(
            f"target must lie in [0, 1] on masked-in tokens, got values in [{float(t.min())}, {float(t.max())}]"
        )
    zeros = torch.zeros_like(value_logit)
    z = torch.where(mask, value_logit, zeros)
    y = torch.where(mask, target.detach().to(z.dtype), zeros)
    loss = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    return torch.where(mask, loss, zeros)
