"""Learning-rate schedules a recipe names by ``class_path`` under ``model.init_args.lr_scheduler``.

Why not torch's ``CosineAnnealingLR``: its ``T_max`` is part of its state, so a run resumed with a larger
``trainer.max_steps`` (docs/guides/runs.md "Runs": resume and extend) keeps the first run's ``T_max``, and past
it the cosine climbs back up (at ``2·T_max`` the learning rate is the initial one again). ``CosineDecay`` keeps
only the step count in its state and takes ``total_steps`` from the config of the run that is running, so
extending a run spreads the rest of one decay over the new length, as transformers' schedules do when a run is
resumed.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class CosineDecay(torch.optim.lr_scheduler.LRScheduler):
    """lr_t = base · (m + (1 − m) · (1 + cos(π · min(t, T) / T)) / 2), t = optimizer steps taken, T = ``total_steps``,
    m = ``min_ratio``; constant at base · m from step T on.

    Args:
        total_steps: T, the step at which the decay ends (a recipe writes ``${trainer.max_steps}``); >= 1.
        min_ratio: m, the final learning rate as a fraction of the initial one, in [0, 1].
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, min_ratio: float = 0.0, last_epoch: int = -1
    ):
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(
                f"CosineDecay total_steps={total_steps!r}: must be an integer >= 1 (the step at which "
                "the decay ends; with trainer.max_steps: -1 set total_steps explicitly)"
            )
        if not 0.0 <= min_ratio <= 1.0:
            raise ValueError(
                f"CosineDecay min_ratio={min_ratio!r}: must be in [0, 1] (the final lr / initial lr)"
            )
        self.total_steps, self.min_ratio = total_steps, float(min_ratio)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The multiplier of the initial learning rate after ``step`` optimizer steps."""
        t = min(max(step, 0), self.total_steps) / self.total_steps
        return self.min_ratio + (1.0 - self.min_ratio) * (1.0 + math.cos(math.pi * t)) / 2.0

    def get_lr(self) -> list[float | torch.Tensor]:
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        # total_steps and min_ratio come from the config of the run that loads this state (see the module doc)
        return {k: v for k, v in super().state_dict().items() if k not in ("total_steps", "min_ratio")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the step count; the optimizer's restored learning rate was set under the saved run's
        ``total_steps``, so it is re-derived under this run's (bitwise the same value when they agree)."""
        super().load_state_dict(state_dict)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class WarmupLinearDecay(CosineDecay):
    """Linear warmup from 0, then linear decay to base · m at step T (TRL's and transformers' default
    schedule, ``lr_scheduler_type="linear"``); constant at base · m from step T on.

    With W warmup steps:

        factor(t) = t / W                                    for t < W,
        factor(t) = m + (1 − m) · (T − t) / max(T − W, 1)    for W ≤ t ≤ T,   and m for t > T.

    W is ``warmup_steps``, or ceil(``warmup_ratio`` · T) as transformers rounds it; W is then recomputed from
    the loading run's T, like T itself (the state is the step count only: see the module doc).

    Args:
        total_steps: T (a recipe writes ``${trainer.max_steps}``); >= 1.
        warmup_ratio: fraction of T spent warming up, in [0, 1) (TRL's ``warmup_ratio``).
        warmup_steps: W directly, an integer in [0, T) (TRL's ``warmup_steps``); not both.
        min_ratio: m, the final learning rate as a fraction of the initial one, in [0, 1] (transformers: 0).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        warmup_ratio: float = 0.0,
        warmup_steps: int = 0,
        min_ratio: float = 0.0,
        last_epoch: int = -1,
    ):
        name = "WarmupLinearDecay"
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(
                f"{name} total_steps={total_steps!r}: must be an integer >= 1 (the step at "
                "which the decay ends; with trainer.max_steps: -1 set total_steps explicitly)"
            )
        if not 0.0 <= warmup_ratio < 1.0:  # `not` also rejects NaN
            raise ValueError(
                f"{name} warmup_ratio={warmup_ratio!r}: must be in [0, 1) (a fraction of total_steps)"
            )
        steps_ok = isinstance(warmup_steps, int) and not isinstance(warmup_steps, bool)
        if not steps_ok or not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"{name} warmup_steps={warmup_steps!r}: must be an integer in [0, total_steps={total_steps})"
            )
        if warmup_ratio and warmup_steps:
            raise ValueError(
                f"{name} warmup_ratio={warmup_ratio} and warmup_steps={warmup_steps}: set one "
                "of them (the other stays 0)"
            )
        self.warmup = warmup_steps or math.ceil(warmup_ratio * total_steps)
        if not 0.0 <= min_ratio <= 1.0:
            raise ValueError(f"{name} min_ratio={min_ratio!r}: must be in [0, 1] (the final lr / initial lr)")
        super().__init__(optimizer, total_steps, min_ratio, last_epoch)

    def factor(self, step: int) -> float:
        t, T, W, m = max(step, 0), self.total_steps, self.warmup, self.min_ratio
        if t < W:
            return t / W
        return m + (1.0 - m) * max(T - t, 0) / max(T - W, 1)  # T = W (ceil of a ratio near 1): m at once

    def state_dict(self) -> dict[str, Any]:
        # like total_steps, the warmup length comes from the config of the run that loads this state
        return {k: v for k, v in super().state_dict().items() if k != "warmup"}
