"""Stage 3, score: completions → a ``RewardBatch`` (rewards, validity, per-component values, error texts).

Rewards come from a ``RewardPool`` (timeouts, worker pool, per-row errors: a failed reward is ``valid=False``
with its reason, never a silent 0). DAPO's soft overlong punishment (arXiv 2503.14476, ``core.shaping``) is a
reward shaping, so it is applied here, before any group statistics, as its own component.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lit_rl.core.shaping import check_penalty_factor, overlong_penalty
from lit_rl.rewards.pool import RewardBatch, RewardPool
from lit_rl.rollout.engine import Completion


class OverlongShaping:
    """DAPO soft overlong punishment: a penalty falling linearly from 0 to −``factor`` over the last ``buffer``
    tokens of the ``max_new_tokens`` budget, added to every valid reward (component ``overlong_penalty``).

    Args:
        max_new_tokens: the generation budget L_max.
        buffer: L_cache, in [1, max_new_tokens].
        factor: >= 0, the penalty at the budget.
    """

    def __init__(self, max_new_tokens: int, buffer: int, factor: float = 1.0):
        if not 0 < buffer <= max_new_tokens:
            raise ValueError(
                f"overlong_buffer must be in [1, sampling.max_new_tokens={max_new_tokens}] or null, "
                f"got {buffer}"
            )
        check_penalty_factor(factor)
        self.max_new_tokens, self.buffer, self.factor = max_new_tokens, buffer, factor

    def __call__(self, rb: RewardBatch, lengths: list[int]) -> RewardBatch:
        """``rb`` with the penalty of each row's completion length (B,) added to its valid rewards."""
        pen = overlong_penalty(
            torch.tensor(lengths), self.max_new_tokens, self.buffer, self.factor
        )  # (B,) float64
        pen = torch.where(rb.valid, pen, torch.full_like(pen, float("nan")))
        total = torch.where(rb.valid, rb.total.double() + pen.nan_to_num(0.0), rb.total.double())
        return RewardBatch(
            total.to(rb.total.dtype),
            rb.valid,
            {**rb.components, "overlong_penalty": pen},
            rb.errors,
            rb.metrics,
            rb.extras,
        )


class Scorer:
    """Score N groups of G completions: decode, ``RewardPool.score`` row by row, optional overlong shaping.

    Args:
        rewards: the ``RewardPool``.
        decode: ``Completion -> str`` (the engine's tokenizer, special tokens skipped).
        shaping: ``OverlongShaping`` or None.
    """

    def __init__(
        self, rewards: RewardPool, decode: Callable[[Completion], str], shaping: OverlongShaping | None = None
    ):
        self.rewards, self.decode, self.shaping = rewards, decode, shaping

    def __call__(self, prompts: list, groups: list[list[Completion]]) -> RewardBatch:
        """Rewards of the N·G rows (row g*G + j = completion j of prompt g)."""
        G = len(groups[0]) if groups else 0
        texts = [self.decode(c) for group in groups for c in group]
        ids = [list(c.token_ids) for group in groups for c in group]
        rb = self.rewards.score([p for p in prompts for _ in range(G)], texts, completion_ids=ids)
        if self.shaping is not None:
            rb = self.shaping(rb, [len(c.token_ids) for group in groups for c in group])
        return rb
