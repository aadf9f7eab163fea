"""Coefficient controllers: the adaptive KL penalty and the adaptive entropy bonus.

Both are scalar feedback loops run once per RL iteration: they read one measured statistic (mean
KL to the reference, mean token entropy) and move one loss/reward coefficient. The pure update
rules are plain functions (easy to hand-check); the small classes around them hold the state a
resumed run must restore (``state_dict`` / ``load_state_dict``). Pure Python/torch, no Lightning.

Shapes: every quantity here is a scalar (Python float); no B/T/V tensors are involved.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "AdaptiveEntropyController",
    "AdaptiveKLController",
    "FixedController",
    "adaptive_entropy_update",
    "adaptive_kl_update",
]


def _finite(name: str, x: float) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def adaptive_kl_update(
    beta: float, kl: float, target: float, horizon: float, n_steps: int = 1, clip: float = 0.2
) -> float:
    """One step of the proportional KL controller of Ziegler et al. 2019 (arXiv 1909.08593, §2.2).

    Equation:  e = clip(KL / KL_target - 1, -clip, +clip);   β ← β · (1 + e · n_steps / horizon)

    β grows when the measured KL is above target (the policy drifts too fast) and shrinks when it is
    below; the error is clipped (0.2 in the paper) so one noisy batch cannot move β by more than a
    factor ``1 ± clip·n_steps/horizon``. ``n_steps`` is the number of samples (the paper) or steps
    since the previous update; lit_rl calls it once per RL iteration with ``n_steps`` = rows of the
    Experience. Departure: none, beyond the clip width being a parameter.

    Shapes: scalars in, a scalar out.

    Raises ValueError for non-finite ``kl``/``beta``, ``beta < 0``, ``target <= 0``, ``horizon <= 0``,
    ``n_steps < 0`` or ``clip < 0``.
    """
    beta, kl = _finite("beta", beta), _finite("kl", kl)
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if not target > 0:
        raise ValueError(f"target KL must be > 0, got {target}")
    if not horizon > 0:
        raise ValueError(f"horizon must be > 0, got {horizon}")
    if n_steps < 0 or clip < 0:
        raise ValueError(f"n_steps and clip must be >= 0, got n_steps={n_steps}, clip={clip}")
    err = min(max(kl / target - 1.0, -clip), clip)
    return beta * (1.0 + err * n_steps / horizon)


def adaptive_entropy_update(
    coef: float,
    entropy: float,
    low: float,
    high: float,
    step: float,
    coef_min: float = 0.0,
    coef_max: float = 0.1,
) -> float:
    """Band controller for the entropy-bonus coefficient α (loss term −α·H).

    Equation:  α ← clamp(α + step·[H < low] − step·[H > high], coef_min, coef_max)

    Below the band (entropy collapsing) the bonus grows; above it (entropy exploding) it shrinks;
    inside it α is unchanged. A negative ``coef_min`` lets α turn into an entropy *penalty* that
    actively pulls an exploding policy back. This is the band form of the adaptive entropy control
    of Skywork-OR1 (arXiv 2505.22312), which raises or lowers α by a fixed step toward one target
    entropy; departure: a dead band [low, high] instead of a single target, so α does not oscillate
    when the entropy sits near the target, and an explicit upper bound ``coef_max``.

    Shapes: scalars in, a scalar out.

    Raises ValueError for non-finite ``entropy``/``coef``, ``low > high``, ``step < 0`` or
    ``coef_min > coef_max``.
    """
    coef, entropy = _finite("coef", coef), _finite("entropy", entropy)
    if low > high:
        raise ValueError(f"entropy band needs low <= high, got low={low}, high={high}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if coef_min > coef_max:
        raise ValueError(f"coef_min={coef_min} must be <= coef_max={coef_max}")
    if entropy < low:
        coef += step
    elif entropy > high:
        coef -= step
    return min(max(coef, coef_min), coef_max)


class FixedController:
    """A constant coefficient with the controller interface (``value``, ``update`` is a no-op)."""

    def __init__(self, value: float):
        self.value = _finite("coefficient", value)

    def update(self, measured: float, n_steps: int = 1) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedController):
    """Stateful wrapper of :func:`adaptive_kl_update` (β starts at ``init_beta``)."""

    def __init__(self, init_beta: float, target: float, horizon: float = 10000.0, clip: float = 0.2):
        super().__init__(init_beta)
        adaptive_kl_update(init_beta, target, target, horizon, 0, clip)  # validate the settings now
        self.target, self.horizon, self.clip = float(target), float(horizon), float(clip)

    def update(self, measured: float, n_steps: int = 1) -> float:
        self.value = adaptive_kl_update(self.value, measured, self.target, self.horizon, n_steps, self.clip)
        return self.value


class AdaptiveEntropyController(FixedController):
    """Stateful wrapper of :func:`adaptive_entropy_update` (α starts at ``init_coef``)."""

    def __init__(
        self,
        init_coef: float,
        low: float,
        high: float,
        step: float,
        coef_min: float = 0.0,
        coef_max: float = 0.1,
    ):
        super().__init__(init_coef)
        adaptive_entropy_update(init_coef, low, low, high, step, coef_min, coef_max)  # validate
        if not coef_min <= init_coef <= coef_max:
            raise ValueError(
                f"init_coef={init_coef} must lie in [coef_min, coef_max] = [{coef_min}, {coef_max}]"
            )
        self.low, self.high, self.step = float(low), float(high), float(step)
        self.coef_min, self.coef_max = float(coef_min), float(coef_max)

    def update(self, measured: float, n_steps: int = 1) -> float:
        self.value = adaptive_entropy_update(
            self.value, measured, self.low, self.high, self.step, self.coef_min, self.coef_max
        )
        return self.value
