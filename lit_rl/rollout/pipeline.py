"""`RolloutPipeline`: prompts → scored, filtered ``Experience`` through five small stages.

::

    prompts ─► render ─► generate ─► score ─► filter / refill ─► build ─► (Experience, metrics)
              render.py  generate.py  score.py  filter.py          build.py
                         (engine)     (RewardPool, DAPO shaping)

The same pipeline serves every path: ``RolloutCallback`` runs it in the trainer thread (``mode="sync"``) or in
the async producer thread (``mode="async"``), and ``AgentRolloutCallback`` swaps the generate / score / build
stages for episode-based ones (``rollout/agent.py``). Lightning is not imported here: the caller passes what the
trainer knows (tokenizer, training prompt pool, rank, iteration). The ExperienceHooks and advantages (steps 6-7
of the rollout contract) stay with the caller, because they need the learner in the trainer thread.
"""
from __future__ import annotations

from typing import Any, Protocol

from lit_rl.data.experience import Experience
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.build import rollout_metrics
from lit_rl.rollout.filter import DynamicSampling, overlong_trainable, zero_std_frac
from lit_rl.rollout.render import PromptRenderer
from lit_rl.rollout.rollouts import Rollouts


class GenerateStage(Protocol):
    def __call__(self, prompts: list, prompt_ids: list[list[int]]) -> tuple[list[list[Any]], float]: ...


class ScoreStage(Protocol):
    def __call__(self, prompts: list, groups: list[list[Any]]) -> RewardBatch: ...


class BuildStage(Protocol):
    next_group: int

    def __call__(self, batch: Rollouts, pad_id: int, trainable: Any = None, count: bool = True) -> Experience: ...


class RolloutPipeline:
    """Compose the rollout stages.

    Args:
        render: ``PromptRenderer`` (its ``counters`` become ``rollout/prompts_*`` metrics).
        generate: ``(prompts, prompt_ids) -> (N groups of G samples, seconds)``.
        score: ``(prompts, groups) -> RewardBatch`` over the N·G rows.
        build: ``(Rollouts, pad_id, trainable) -> Experience``; holds the run-wide ``next_group``.
        group_size: G.
        refill: ``DynamicSampling`` or None (off).
        overlong_filter: rows cut off by the budget do not train (``Experience.trainable``).
    """

    def __init__(self, render: PromptRenderer, generate: GenerateStage, score: ScoreStage, build: BuildStage,
                 group_size: int, refill: DynamicSampling | None = None, overlong_filter: bool = False):
        self.render, self.generate, self.score, self.build = render, generate, score, build
        self.group_size, self.refill, self.overlong_filter = group_size, refill, overlong_filter

    def generate_and_score(self, prompts: list, prompt_ids: list[list[int]]) -> Rollouts:
        """Stages 2-3 on already rendered prompts (held-out evaluation renders its own)."""
        groups, seconds = self.generate(prompts, prompt_ids)
        return Rollouts(list(prompts), prompt_ids, groups, self.score(prompts, groups), seconds)

    def sample(self, tokenizer, prompts: list) -> Rollouts:
        """Stages 1-3: render (length policy, counted), generate, score."""
        kept, ids = self.render(tokenizer, prompts)
        return self.generate_and_score(kept, ids)

    def build_experience(self, batch: Rollouts, pad_id: int, count: bool = True) -> Experience:
        """Stages 4-5 after any refill: the overlong filter's ``trainable`` mask (N·G,), then the Experience.
        ``count=False`` (evaluation) numbers the groups from 0 and leaves the run-wide group counter alone."""
        trainable = overlong_trainable([s.finish_reason for s in batch.rows()]) if self.overlong_filter else None
        return self.build(batch, pad_id, trainable, count=count)

    def run(self, tokenizer, prompts: list, pool: list | None = None, rank: int = 0,
            iteration: int = 0) -> tuple[Experience, dict[str, float]]:
        """Stages 1-5 for one batch of prompts: (Experience of N·G rows, rollout metrics).

        ``tokenizer`` renders prompts and gives the pad id; ``pool`` is where refills draw prompts from (the
        training prompts); ``rank`` and ``iteration`` key the refill stream.
        """
        metrics: dict[str, float] = {}
        batch = self.sample(tokenizer, prompts)
        metrics["rollout/zero_std_frac"] = zero_std_frac(batch.rewards, self.group_size)
        if self.refill is not None:
            batch, tries = self.refill(batch, lambda ps: self.sample(tokenizer, ps), pool,
                                       self.refill.rng(rank, iteration))
            metrics["rollout/resample_tries"] = float(tries)
        exp = self.build_experience(batch, tokenizer.pad_token_id)
        metrics.update(rollout_metrics(exp, batch.rewards))
        metrics["perf/generate_s"] = batch.generate_s
        metrics.update({f"rollout/{k}": float(v) for k, v in self.render.counters.items()})
        return exp, metrics

