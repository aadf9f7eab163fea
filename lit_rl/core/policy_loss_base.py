"""The input side of the policy losses: the settings group (``PolicyLossSettings``), its keyword form
(``PolicyLossKwargs``, ``loss_settings``), the one-loss settings and their bounds (``LOSS_PARAMS``,
``loss_param_error``) and ``PolicyLossInputs`` with its checks.

Separate from ``core.policy_losses`` (the registry and the losses themselves) so that the declaration of what a
loss may read, which ``core.objective`` and ``PolicyConfig.validate`` also read, is one short file; the losses
module re-exports every name here, and that is the path to import them from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import torch
from torch import Tensor

from lit_rl.core.settings import setting

# The settings only one loss reads (declared in ``PolicyLossSettings``): field -> (that loss, the paper's
# value it takes when the setting is None, the lowest value allowed, whether the lowest value itself is
# allowed). Every other loss refuses a field that is set.
LOSS_PARAMS: dict[str, tuple[str, float, float, bool]] = {
    "sapo_tau_pos": ("sapo", 1.0, 0.0, False),
    "sapo_tau_neg": ("sapo", 1.05, 0.0, False),
    "vespo_k_pos": ("vespo", 2.0, 0.0, True),
    "vespo_lambda_pos": ("vespo", 3.0, 0.0, False),
    "vespo_k_neg": ("vespo", 3.0, 0.0, True),
    "vespo_lambda_neg": ("vespo", 2.0, 0.0, False),
}


def _check_finite_where(name: str, x: Tensor, mask: Tensor) -> None:
    # Padding may hold anything (often 0, sometimes -inf); only tokens that reach the loss must be finite.
    if not bool(torch.isfinite(x[mask]).all()):
        raise ValueError(f"{name} holds NaN or Inf on masked-in tokens; it would poison the loss")


@dataclass(frozen=True, kw_only=True)
class PolicyLossSettings:
    """The settings the policy losses read: the one declaration of each (``PolicyModule`` takes them flat
    through ``core.objective.ObjectiveSettings``, which extends this group)."""

    clip_low: float = setting(0.2, "Lower ratio clip: r >= 1 - clip_low (1.0 = no lower bound).")
    clip_high: float = setting(0.2, "Upper ratio clip: r <= 1 + clip_high (> clip_low = DAPO clip-higher).")
    dual_clip: float | None = setting(None, "c > 1 of dual-clip PPO (A < 0 loss capped at -c*A); null = off.")
    sapo_tau_pos: float | None = setting(
        None,
        "policy_loss sapo: gate temperature for A > 0; null = the paper's 1.0 (TRL sapo_temperature_pos).",
    )
    sapo_tau_neg: float | None = setting(
        None,
        "policy_loss sapo: gate temperature for A <= 0; null = the paper's 1.05 (TRL sapo_temperature_neg).",
    )
    vespo_k_pos: float | None = setting(
        None,
        "policy_loss vespo: Gamma-weight shape k of the sequence ratio for A >= 0; null = the paper's 2.",
    )
    vespo_lambda_pos: float | None = setting(
        None, "policy_loss vespo: Gamma-weight rate lambda for A >= 0; null = the paper's 3."
    )
    vespo_k_neg: float | None = setting(
        None, "policy_loss vespo: Gamma-weight shape k for A < 0; null = the paper's 3."
    )
    vespo_lambda_neg: float | None = setting(
        None, "policy_loss vespo: Gamma-weight rate lambda for A < 0; null = the paper's 2."
    )


class PolicyLossKwargs(TypedDict):
    """``PolicyLossSettings``'s fields as keyword arguments, typed one by one so that ``PolicyLossInputs(...,
    **loss_settings(s))`` type-checks. A TypedDict cannot be derived from a dataclass: mypy checks each
    value's type in ``loss_settings``, tests/core/test_policy_losses.py that the two list the same names."""

    clip_low: float
    clip_high: float
    dual_clip: float | None
    sapo_tau_pos: float | None
    sapo_tau_neg: float | None
    vespo_k_pos: float | None
    vespo_lambda_pos: float | None
    vespo_k_neg: float | None
    vespo_lambda_neg: float | None


def loss_settings(settings: PolicyLossSettings) -> PolicyLossKwargs:
    """The ``PolicyLossSettings`` fields of ``settings`` (or of a group extending it) as keyword arguments."""
    return PolicyLossKwargs(
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        dual_clip=settings.dual_clip,
        sapo_tau_pos=settings.sapo_tau_pos,
        sapo_tau_neg=settings.sapo_tau_neg,
        vespo_k_pos=settings.vespo_k_pos,
        vespo_lambda_pos=settings.vespo_lambda_pos,
        vespo_k_neg=settings.vespo_k_neg,
        vespo_lambda_neg=settings.vespo_lambda_neg,
    )


@dataclass(frozen=True)
class PolicyLossInputs(PolicyLossSettings):
    """Everything a policy loss may need, one row per completion, with its settings (keyword-only,
    ``PolicyLossSettings``).

    Shapes:
        logprobs:         (B, T) log pi_theta(y_t) of the sampled tokens under the policy being trained (grad).
        old_logprobs:     (B, T) log pi_old(y_t), the policy the PPO ratio is taken against (detached here).
        advantages:       (B, T) per-token advantages (a per-row advantage broadcast over T is the usual case).
        mask:             (B, T) bool, True on completion tokens that count in the loss.
        rollout_logprobs: (B, T) or None, logprobs reported by the rollout engine (the behaviour policy); only
                          ``reinforce`` reads it.
        is_weights:       (B, T) or None, non-negative per-token weights (rollout-mismatch correction such as
                          TIS/MIS from ``lit_rl.core.importance``); detached and multiplied onto the per-token loss.

    ``clip_low`` / ``clip_high`` give the ratio interval [1 - clip_low, 1 + clip_high] (asymmetric "clip-higher",
    DAPO arXiv 2503.14476). ``clip_low`` may be 1.0: the lower bound is then 0, which a ratio can never cross, so
    1.0 is the clean way to say "no lower bound" (CISPO, arXiv 2506.13585, uses a large eps_low for the same
    effect). ``dual_clip`` is c > 1 of dual-clip PPO (arXiv 1912.09729), or None. ``sapo_tau_pos`` /
    ``sapo_tau_neg`` are the gate temperatures of ``sapo``, ``vespo_k_*`` / ``vespo_lambda_*`` the Gamma
    weight of ``vespo`` (``LOSS_PARAMS``: None = the paper's value); every other loss refuses them.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    rollout_logprobs: Tensor | None = None
    is_weights: Tensor | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` on inconsistent shapes, a non-bool mask, bad clip settings or
        non-finite values on masked-in tokens (run on construction).

        Shapes:
            every tensor field must be (B, T), the shape of ``logprobs``.
        """
        if self.logprobs.dim() != 2:
            raise ValueError(f"logprobs must be (B, T), got shape {tuple(self.logprobs.shape)}")
        if not isinstance(self.mask, Tensor) or self.mask.dtype != torch.bool:
            got = self.mask.dtype if isinstance(self.mask, Tensor) else type(self.mask).__name__
            raise TypeError(f"mask must be a torch.bool tensor, got {got}")
        shape = self.logprobs.shape
        for name in ("old_logprobs", "advantages", "mask", "rollout_logprobs", "is_weights"):
            x = getattr(self, name)
            if x is not None and x.shape != shape:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)} but logprobs has shape {tuple(shape)}; they must match"
                )
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"clip_low must be in [0, 1] (1.0 = no lower bound), got {self.clip_low}")
        if not (self.clip_high > 0.0 and math.isfinite(self.clip_high)):
            raise ValueError(f"clip_high must be a finite number > 0, got {self.clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"dual_clip must be None or > 1, got {self.dual_clip}")
        for name in LOSS_PARAMS:
            if (why := loss_param_error(name, getattr(self, name))) is not None:
                raise ValueError(why)
        for name in ("logprobs", "old_logprobs", "advantages", "rollout_logprobs", "is_weights"):
            x = getattr(self, name)
            if x is not None:
                _check_finite_where(name, x.detach(), self.mask)
        if self.is_weights is not None and bool((self.is_weights.detach()[self.mask] < 0).any()):
            raise ValueError("is_weights must be >= 0 on masked-in tokens")


def loss_param_error(field: str, value: float | None) -> str | None:
    """Why ``value`` is not a valid ``field`` of ``LOSS_PARAMS`` (None: it is valid, or unset)."""
    _, _, low, inclusive = LOSS_PARAMS[field]
    if value is None or (math.isfinite(value) and (value >= low if inclusive else value > low)):
        return None
    return f"{field} must be None or a finite number {'>=' if inclusive else '>'} {low:g}, got {value}"
