"""`RolloutPipeline`: prompts → scored, filtered ``Experience`` through five small stages.

::

    prompts ─► render ─► generate ─► score ─► filter / refill ─► build ─► (Experience, metrics)
              render.py  generate.py  score.py  filter.py          build.py
                         (engine)     (RewardPool, DAPO shaping)

The same pipeline serves every path: ``RolloutCallback`` runs it in the trainer thread (``mode="sync"``) or in
the async producer thread (``mode="async"``), and ``AgentRolloutCallback`` swaps the generate / score / build
stages for episode-based ones (``agent_loop.py``). Lightning is not imported here: the caller passes what the
trainer knows (tokenizer, training prompt pool, rank, iteration). The ExperienceHooks and advantages (steps 6-7
of the rollout contract) stay with the caller, because they need the learner in the trainer thread.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from lit_rl.data.experience import Experience
from lit_rl.rewards.pool import RewardBatch, RewardPool
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.build import ExperienceBuilder, rollout_metrics
from lit_rl.rollout.filter import DynamicSampling, overlong_trainable, zero_std_frac
from lit_rl.rollout.generate import Generator, decode_with
from lit_rl.rollout.render import PromptRenderer, engine_context_len
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.score import OverlongShaping, Scorer
from lit_rl.rollout.settings import FilterSettings, RolloutSettings


class GenerateStage(Protocol):
    @property
    def engine(
        self,
    ) -> EngineBase:  # the engine it generates with (RolloutCallback checks it is the callback's)
        ...

    def __call__(self, prompts: list, prompt_ids: list[list[int]]) -> tuple[list[list[Any]], float]: ...


class ScoreStage(Protocol):
    def __call__(self, prompts: list, groups: list[list[Any]]) -> RewardBatch: ...


class BuildStage(Protocol):
    next_group: int

    def __call__(
        self, batch: Rollouts, pad_id: int, trainable: Any = None, count: bool = True
    ) -> Experience: ...


class RolloutPipeline:
    """Compose the rollout stages.

    Args:
        render: ``PromptRenderer`` (its ``counters`` become ``rollout/prompts_*`` metrics).
        generate: ``(prompts, prompt_ids) -> (N groups of G samples, seconds)``.
        score: ``(prompts, groups) -> RewardBatch`` over the N·G rows.
        build: ``(Rollouts, pad_id, trainable) -> Experience``; holds the run-wide ``next_group``.
        settings: the ``RolloutSettings`` the stages were built from (``group_size``, ``sampling``: the
            module temperature, the evaluation budget and teacher rollouts read them through the callback).
        filters: ``FilterSettings``: ``dynamic_sampling`` makes the refill stage (``DynamicSampling``);
            ``overlong_filter``: rows cut off by the budget do not train (``Experience.trainable``).
    """

    def __init__(
        self,
        render: PromptRenderer,
        generate: GenerateStage,
        score: ScoreStage,
        build: BuildStage,
        settings: RolloutSettings,
        filters: FilterSettings | None = None,
    ):
        self.render, self.generate, self.score, self.build = render, generate, score, build
        self.settings, self.filters = settings, filters if filters is not None else FilterSettings()
        self.refill = DynamicSampling(settings, self.filters) if self.filters.dynamic_sampling else None

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """What outlives a batch: the render stage's counters and the build stage's run-wide group counter
        (checkpointed by the RolloutCallback under these keys)."""
        return {"counters": dict(self.render.counters), "next_group": self.build.next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.render.counters = dict(state["counters"])
        self.build.next_group = state["next_group"]

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
        trainable = (
            overlong_trainable([s.finish_reason for s in batch.rows()])
            if self.filters.overlong_filter
            else None
        )
        return self.build(batch, pad_id, trainable, count=count)

    def run(
        self, tokenizer, prompts: list, pool: list | None = None, rank: int = 0, iteration: int = 0
    ) -> tuple[Experience, dict[str, float]]:
        """Stages 1-5 for one batch of prompts: (Experience of N·G rows, rollout metrics).

        ``tokenizer`` renders prompts and gives the pad id; ``pool`` is where refills draw prompts from (the
        training prompts); ``rank`` and ``iteration`` key the refill stream.
        """
        metrics: dict[str, float] = {}
        batch = self.sample(tokenizer, prompts)
        metrics["rollout/zero_std_frac"] = zero_std_frac(batch.scored, self.settings.group_size)
        if self.refill is not None:
            batch, tries = self.refill(
                batch, lambda ps: self.sample(tokenizer, ps), pool, self.refill.rng(rank, iteration)
            )
            metrics["rollout/resample_tries"] = float(tries)
        exp = self.build_experience(batch, tokenizer.pad_token_id)
        metrics.update(rollout_metrics(exp, batch.scored))
        metrics["perf/generate_s"] = batch.generate_s
        metrics.update({f"rollout/{k}": float(v) for k, v in self.render.counters.items()})
        return exp, metrics


def build_pipeline(
    engine: EngineBase,
    rewards: RewardPool,
    settings: RolloutSettings,
    filters: FilterSettings | None = None,
    lock: threading.RLock | None = None,
) -> RolloutPipeline:
    """The single-turn pipeline of ``settings`` and ``filters``: render (the one owner of prompt length:
    ``max_prompt_len`` and the engine's context, read when rendering, minus the completion budget) →
    generate (``engine`` under ``lock``) → score (``rewards``, DAPO overlong shaping) → filter / refill →
    build (horizon = the budget)."""
    filters = filters if filters is not None else FilterSettings()
    sp = settings.sampling
    render = PromptRenderer(
        settings.max_prompt_len,
        settings.overlong_prompts,
        context_len=lambda: engine_context_len(engine),
        max_new_tokens=sp.max_new_tokens,
        chat_template_kwargs=sp.chat_template_kwargs,
    )
    shaping = (
        OverlongShaping(sp.max_new_tokens, filters.overlong_buffer, filters.overlong_penalty_factor)
        if filters.overlong_buffer is not None
        else None
    )
    decode = decode_with(engine)
    return RolloutPipeline(
        render=render,
        generate=Generator(engine, settings, lock),
        score=Scorer(rewards, decode, shaping),
        build=ExperienceBuilder(engine, decode, horizon=sp.max_new_tokens),
        settings=settings,
        filters=filters,
    )
