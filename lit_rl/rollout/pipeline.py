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
from dataclasses import dataclass, field
from typing import Any, Protocol

from lit_rl.data.experience import Experience
from lit_rl.rewards.pool import RewardBatch, RewardPool
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.build import ExperienceBuilder, rollout_metrics
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.filter import DynamicSampling, check_resample_tries, overlong_trainable, zero_std_frac
from lit_rl.rollout.generate import Generator, decode_with
from lit_rl.rollout.render import PromptRenderer, engine_context_len
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.score import OverlongShaping, Scorer, check_penalty_factor


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
                 group_size: int, refill: DynamicSampling | None = None, overlong_filter: bool = False,
                 sampling: SamplingConfig | None = None):
        self.render, self.generate, self.score, self.build = render, generate, score, build
        self.group_size, self.refill, self.overlong_filter = group_size, refill, overlong_filter
        # the rollout sampling settings (module temperature, evaluation budget, teacher rollouts read them)
        self.sampling = sampling if sampling is not None else getattr(generate, "sampling", None)

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



@dataclass
class RolloutConfig:
    """The flat rollout settings a config file writes (``RolloutCallback``'s stage arguments), checked here, in
    signature order, so the first bad one is named. ``build_pipeline`` turns them into stages.

    Fields: see ``RolloutCallback`` (``group_size``, ``sampling``, ``max_prompt_len``, ``overlong_prompts``,
    ``dynamic_sampling``, ``max_resample_tries``, ``overlong_filter``, ``overlong_buffer``,
    ``overlong_penalty_factor``, ``seed``).
    """

    group_size: int = 8
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_prompt_len: int = 512
    overlong_prompts: str = "truncate"
    dynamic_sampling: bool = False
    max_resample_tries: int = 3
    overlong_filter: bool = False
    overlong_buffer: int | None = None
    overlong_penalty_factor: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.sampling is None:
            self.sampling = SamplingConfig()
        PromptRenderer(self.max_prompt_len, self.overlong_prompts)  # its own checks: length, policy name
        check_resample_tries(self.max_resample_tries)
        if self.dynamic_sampling:
            DynamicSampling(self.group_size, self.max_resample_tries, self.seed)
        if self.overlong_buffer is not None:
            OverlongShaping(self.sampling.max_new_tokens, self.overlong_buffer, self.overlong_penalty_factor)
        check_penalty_factor(self.overlong_penalty_factor)


def build_pipeline(engine: EngineBase, rewards: RewardPool, config: RolloutConfig,
                   lock: threading.RLock | None = None) -> RolloutPipeline:
    """The single-turn pipeline of ``config``: render (the one owner of prompt length: ``max_prompt_len`` and
    the engine's context, read when rendering, minus the completion budget) → generate (``engine`` under
    ``lock``) → score (``rewards``, DAPO overlong shaping) → filter / refill → build (horizon = the budget)."""
    sp = config.sampling
    render = PromptRenderer(config.max_prompt_len, config.overlong_prompts,
                            context_len=lambda: engine_context_len(engine), max_new_tokens=sp.max_new_tokens,
                            chat_template_kwargs=sp.chat_template_kwargs)
    refill = (DynamicSampling(config.group_size, config.max_resample_tries, config.seed)
              if config.dynamic_sampling else None)
    shaping = (OverlongShaping(sp.max_new_tokens, config.overlong_buffer, config.overlong_penalty_factor)
               if config.overlong_buffer is not None else None)
    decode = decode_with(engine)
    return RolloutPipeline(
        render=render, generate=Generator(engine, config.group_size, sp, lock),
        score=Scorer(rewards, decode, shaping), build=ExperienceBuilder(engine, decode, horizon=sp.max_new_tokens),
        group_size=config.group_size, refill=refill, overlong_filter=config.overlong_filter, sampling=sp)
