"""Per-group reward statistics shared by the group-baseline advantage estimators (grpo, dr_grpo, rloo)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)  # not a NamedTuple: its `count` field would shadow tuple.count
class GroupStats:
    """Per-group statistics over valid rows; ``inverse`` maps each row to its group index.

    Shapes:
        inverse: (B,) int64 in [0, n_groups); count, total, mean, std: (n_groups,) float;
        no_signal: (n_groups,) bool — singleton or zero-std group.
    """

    inverse: Tensor
    count: Tensor
    total: Tensor
    mean: Tensor
    std: Tensor
    no_signal: Tensor
    metrics: dict[str, Tensor | float]


def group_stats(scores: Tensor, valid: Tensor, group_ids: Tensor | None) -> GroupStats:
    """Vectorised per-group count, sum, mean and unbiased std of ``scores`` over valid rows.

    mean_g = Σ_{i∈g, valid} r_i / n_g;  std_g = sqrt(Σ_{i∈g, valid} (r_i − mean_g)² / (n_g − 1)).
    The unbiased (Bessel) std matches ``torch.std`` as used by TRL, veRL and OpenRLHF, so our GRPO
    advantages equal theirs; the GRPO paper (arXiv 2402.03300) does not say which it uses. n_g − 1
    never divides by zero: groups with n_g < 2 get std 0 and are flagged ``no_signal``.

    Shapes:
        scores: (B,) float, 0 on invalid rows; valid: (B,) bool; group_ids: (B,) int or None (one group).
    """
    B, dt, dev = scores.shape[0], scores.dtype, scores.device
    if group_ids is None:
        group_ids = torch.zeros(B, dtype=torch.long, device=dev)
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) dense group index
    n_groups = int(inverse.max()) + 1 if B > 0 else 0
    w = valid.to(dt)
    count = torch.zeros(n_groups, dtype=dt, device=dev).index_add_(0, inverse, w)
    total = torch.zeros(n_groups, dtype=dt, device=dev).index_add_(0, inverse, scores * w)
    mean = total / count.clamp_min(1)
    dev_sq = torch.where(valid, scores - mean[inverse], scores.new_zeros(())) ** 2
    sq = torch.zeros(n_groups, dtype=dt, device=dev).index_add_(0, inverse, dev_sq)
    std = (sq / (count - 1).clamp_min(1)).sqrt()
    inf = torch.full((), math.inf, dtype=dt, device=dev)
    hi = torch.full((n_groups,), -math.inf, dtype=dt, device=dev).scatter_reduce(
        0, inverse, torch.where(valid, scores, -inf), reduce="amax"
    )
    lo = torch.full((n_groups,), math.inf, dtype=dt, device=dev).scatter_reduce(
        0, inverse, torch.where(valid, scores, inf), reduce="amin"
    )
    singleton = count == 1
    zero_std = (count >= 2) & (hi == lo)
    n_zero = zero_std.sum().to(dt)  # float metrics in the working dtype (int / int would be float32)
    metrics: dict[str, Tensor | float] = {
        "adv/num_groups": float(n_groups),
        "adv/singleton_groups": singleton.sum(),
        "adv/zero_std_groups": n_zero,
        "adv/zero_std_frac": n_zero / max(n_groups, 1),
    }
    return GroupStats(inverse, count, total, mean, std, singleton | zero_std, metrics)
