"""Stage 4, filter / refill: which rows train, and DAPO dynamic sampling.

- **Overlong filter** (DAPO, arXiv 2503.14476): a completion cut off by ``max_new_tokens`` (finish reason
  ``length``) keeps its reward in its group's statistics but does not train: ``Experience.trainable`` False.
- **Dynamic sampling** (DAPO): a group whose valid rewards are all equal has zero advantage and teaches
  nothing. Such groups are dropped and replaced by groups of freshly drawn prompts until the batch again holds
  as many informative groups as it had prompts. A short batch would give ranks unequal rows, so after
  ``max_resample_tries`` extra generations without filling it the step raises.

Refill prompts come from a stream keyed by (seed, rank, iteration): ranks never draw the same refill prompts,
and a resumed run draws exactly what the uninterrupted one drew, with no RNG state to checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from lit_rl.core.seeds import run_seed
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.settings import FilterSettings, RolloutSettings


def overlong_trainable(finish_reasons: list[str]) -> torch.Tensor:
    """(B,) bool: False exactly on rows the generation budget cut off (finish reason ``length``)."""
    return torch.tensor([f != "length" for f in finish_reasons], dtype=torch.bool)


def informative_groups(rb: RewardBatch, G: int) -> list[int]:
    """Indices of the groups (rows g*G .. g*G+G-1) with at least two valid rewards that are not all equal."""
    out = []
    for g in range(len(rb.total) // G):
        r = rb.total[g * G : (g + 1) * G][rb.valid[g * G : (g + 1) * G]]
        if len(r) >= 2 and float(r.max() - r.min()) > 0:
            out.append(g)
    return out


def zero_std_frac(rb: RewardBatch, G: int) -> float:
    """Fraction of the groups that are not informative (metric ``rollout/zero_std_frac``)."""
    n = len(rb.total) // G
    return 1.0 - len(informative_groups(rb, G)) / max(n, 1)


class DynamicSampling:
    """Refill zero-variance groups from newly drawn prompts.

    Args:
        settings: the rollout settings: ``group_size`` (G >= 2: a group of one has no reward variance) and
            ``seed`` (part of the refill stream's key; None = the run's seed).
        filters: ``max_resample_tries``, extra generations per step before giving up (>= 0, checked by
            ``FilterSettings``).
    """

    def __init__(self, settings: RolloutSettings, filters: FilterSettings):
        if settings.group_size < 2:
            raise ValueError("dynamic_sampling needs group_size >= 2 (a group of one has no reward variance)")
        self.settings, self.max_resample_tries = settings, filters.max_resample_tries
        self.seed = run_seed(settings.seed)  # resolved once, when the pipeline is built

    def rng(self, rank: int, iteration: int) -> random.Random:
        """The refill stream of one rank at one iteration."""
        return random.Random(f"lit_rl.refill:{self.seed}:{rank}:{iteration}")

    def __call__(
        self, batch: Rollouts, sample: Callable[[list], Rollouts], pool: list | None, rng: random.Random
    ) -> tuple[Rollouts, int]:
        """(a batch of ``len(batch)`` informative groups, extra generations used).

        ``sample(prompts)`` runs render → generate → score on new prompts; they are drawn with ``rng`` from
        ``pool`` (the training prompts; ``batch.prompts`` when None). Kept groups come first, then the
        refilled ones in draw order; generation seconds of every try add up in ``generate_s``.
        """
        G, target = self.settings.group_size, len(batch)
        pool = pool or batch.prompts
        parts = [batch.select(informative_groups(batch.scored, G))]
        have, tries = len(parts[0]), 0
        while have < target and tries < self.max_resample_tries:
            tries += 1
            new = sample([rng.choice(pool) for _ in range(target - have)])
            parts.append(
                new.select(informative_groups(new.scored, G))
            )  # appended even when empty: its seconds count
            have += len(parts[-1])
        if have < target:
            raise RuntimeError(
                f"dynamic_sampling: after max_resample_tries={self.max_resample_tries} extra generations only "
                f"{have} of {target} groups had reward variance (the rest were all-equal rewards); the batch "
                "cannot be filled to its size, which every rank must keep. Raise max_resample_tries, or turn "
                "dynamic_sampling off while the task is too hard or too easy for the model"
            )
        merged = Rollouts.concat(parts)
        return merged.select(list(range(target))), tries
