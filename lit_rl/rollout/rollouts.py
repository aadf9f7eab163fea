"""`Rollouts`: the batch handed from one rollout stage to the next.

The stages (``render`` → ``generate`` → ``score`` → ``filter/refill`` → ``build``, see ``pipeline.py``) pass one
group-major batch along: N prompts, G samples of each, N·G rows. Row ``g*G + j`` of every per-row field is
sample ``j`` of prompt ``g``, which is the order the engine returns and the order the Experience keeps.
Keeping prompts, their token ids, the samples and their rewards in one object lets the refill stage keep or
drop whole groups with one ``select`` instead of four parallel lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lit_rl.rewards.pool import RewardBatch


@dataclass
class Rollouts:
    """One group-major rollout batch.

    Fields (N prompts, G samples per prompt):
        prompts: N ``Prompt`` objects (those the render stage kept).
        prompt_ids: N rendered prompt token lists.
        groups: N lists of G samples: ``Completion`` (single turn) or ``Episode`` (agents).
        rewards: ``RewardBatch`` over the N·G rows (``total``/``valid``/components (N·G,)), None before scoring.
        generate_s: wall seconds spent generating these rows (refills add theirs).
    """

    prompts: list[Any]
    prompt_ids: list[list[int]]
    groups: list[list[Any]]
    rewards: RewardBatch | None = None
    generate_s: float = 0.0

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def scored(self) -> RewardBatch:
        """``rewards`` of a scored batch; reading it before the score stage is a pipeline error."""
        if self.rewards is None:
            raise RuntimeError(
                "Rollouts.rewards is None: the batch was not scored (RolloutPipeline's score stage)"
            )
        return self.rewards

    def select(self, idx: list[int]) -> Rollouts:
        """The groups ``idx`` (in that order) with their reward rows; reward-pool metrics are kept."""
        rb = self.rewards
        if rb is not None:
            G = len(rb.total) // max(len(self.prompts), 1)
            rows = torch.tensor([g * G + j for g in idx for j in range(G)], dtype=torch.long)
            rb = RewardBatch(
                rb.total[rows],
                rb.valid[rows],
                {k: v[rows] for k, v in rb.components.items()},
                [rb.errors[int(r)] for r in rows],
                rb.metrics,
                [rb.extras[int(r)] for r in rows] if rb.extras else [],
            )
        return Rollouts(
            [self.prompts[g] for g in idx],
            [self.prompt_ids[g] for g in idx],
            [self.groups[g] for g in idx],
            rb,
            self.generate_s,
        )

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """Groups of ``parts`` one after another. Reward components are those of the first part (the batch
        the parts were refilled for) and so are the reward-pool metrics; generation seconds add up."""
        first, scored = parts[0].scored, [p.scored for p in parts]
        rb = RewardBatch(
            total=torch.cat([r.total for r in scored]),
            valid=torch.cat([r.valid for r in scored]),
            components={k: torch.cat([r.components[k] for r in scored]) for k in first.components},
            errors=[e for r in scored for e in r.errors],
            metrics=first.metrics,
            extras=[x for r in scored for x in (r.extras or [{}] * len(r.total))]
            if any(r.extras for r in scored)
            else [],
        )
        return Rollouts(
            [x for p in parts for x in p.prompts],
            [x for p in parts for x in p.prompt_ids],
            [x for p in parts for x in p.groups],
            rb,
            sum(p.generate_s for p in parts),
        )

    def rows(self) -> list[Any]:
        """The N·G samples in row order."""
        return [s for group in self.groups for s in group]
