"""Length-based reward shaping for completions cut off by the generation budget.

DAPO (arXiv 2503.14476, §3.4) treats truncated samples in two ways, both available here:

* overlong filtering: a truncated completion is masked out of the loss (it may be a correct start whose
  answer was cut; rewarding or punishing it adds noise) — a row-mask, done by the caller;
* soft overlong punishment, for a completion of |y| tokens, generation budget L_max and buffer L_cache:

      R_length(y) = 0                                  if |y| ≤ L_max − L_cache
                  = ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
                  = −1                                 if |y| > L_max

  added to the task reward (times ``factor``), so length pressure rises linearly over the last L_cache
  tokens instead of jumping at the cut.
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, cache: int, factor: float = 1.0) -> Tensor:
    """Soft overlong punishment ``factor · R_length`` per completion (DAPO eq. 13).

    Shapes:
        lengths: (B,) int or float token counts; returns (B,) float64, values in [−factor, 0].
    """
    if not 0 < cache <= max_len:
        raise ValueError(
            f"overlong buffer must satisfy 0 < cache <= max_len, got cache={cache}, max_len={max_len}"
        )
    n = lengths.to(torch.float64)
    start = float(max_len - cache)
    pen = torch.where(n <= start, torch.zeros_like(n), (start - n) / cache)
    return factor * torch.where(n > max_len, torch.full_like(n, -1.0), pen)


def check_penalty_factor(factor: float) -> None:
    """``overlong_penalty_factor`` must be >= 0 (NaN refused): checked even while the buffer is off."""
    if not factor >= 0:
        raise ValueError(f"overlong_penalty_factor must be >= 0, got {factor}")
