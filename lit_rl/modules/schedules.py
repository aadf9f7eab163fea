"""Learning-rate schedules a recipe names by ``class_path`` under ``model.init_args.lr_scheduler``.

Why not torch's ``CosineAnnealingLR``: its ``T_max`` is part of its state, so a run resumed with a larger
``trainer.max_steps`` (the README's "resume and extend") keeps the first run's ``T_max``, and past it the cosine
climbs back up (at ``2·T_max`` the learning rate is the initial one again). ``CosineDecay`` keeps only the step
count in its state and takes ``total_steps`` from the config of the run that is running, so extending a run
spreads the rest of one decay over the new length, as transformers' schedules do when a run is resumed.
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

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, min_ratio: float = 0.0,
                 last_epoch: int = -1):
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"CosineDecay total_steps={total_steps!r}: must be an integer >= 1 (the step at which "
                             "the decay ends; with trainer.max_steps: -1 set total_steps explicitly)")
        if not 0.0 <= min_ratio <= 1.0:
            raise ValueError(f"CosineDecay min_ratio={min_ratio!r}: must be in [0, 1] (the final lr / initial lr)")
        self.total_steps, self.min_ratio = total_steps, float(min_ratio)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The multiplier of the initial learning rate after ``step`` optimizer steps."""
        t = min(max(step, 0), self.total_steps) / self.total_steps
        return self.min_ratio + (1.0 - self.min_ratio) * (1.0 + math.cos(math.pi * t)) / 2.0

    def get_lr(self) -> list[float]:
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
