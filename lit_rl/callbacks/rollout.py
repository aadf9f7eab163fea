"""`RolloutCallback`: turns each batch of prompts into an annotated `Experience` before the training step.

The callback wires the rollout pipeline (``lit_rl/rollout/pipeline.py``) to Lightning's hooks and assembles the
rollout state a checkpoint saves; its hooks delegate the weight-sync schedule to ``callbacks/_weight_sync.py``
(``WeightSync``) and the async producer to ``callbacks/_async_rollouts.py`` (``AsyncRollouts``).

Order inside ``on_train_batch_start`` (documented contract, docs/architecture.md "Data flow of one RL iteration"):
  1. render + length-check prompts → 2. ``engine.generate`` (n = group_size) → 3. rewards (RewardPool)
  → 4. overlong filter, optional dynamic sampling (refill zero-variance groups) → 5. ``Experience``
  (steps 1-5: ``RolloutPipeline.run``, Lightning-free) → 6. ExperienceHooks: the module's own (old log-probs,
  critic values), then every callback implementing ``on_experience`` in ``trainer.callbacks`` order
  → 7. advantages (``module.compute_advantages``).
After the optimizer steps (``on_train_batch_end``) weights are pushed to the engine every ``sync_every``
optimizer steps (``WeightSync``: which step pushes, the first push, the route).

``mode="async"``: steps 1-5 run in a background producer thread (``rollout/async_producer.py``) that draws its
own prompt batches and generates with a snapshot of the weights while the trainer updates; the trainer thread
takes finished Experiences in order, checks their staleness (never more than ``max_staleness`` weight pushes
behind the learner) and runs steps 6-7 with the current learner, so old log-probs, reference log-probs and
critic values are always the learner's.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from lit_rl.callbacks._agree import agree
from lit_rl.callbacks._async import check_async_args
from lit_rl.callbacks._async_rollouts import AsyncRollouts
from lit_rl.callbacks._roles import RolloutProducer
from lit_rl.callbacks._weight_sync import WeightSync
from lit_rl.callbacks.eval import HeldoutEval
from lit_rl.core.names import OverlongPrompts, RolloutMode, StalePolicy
from lit_rl.core.seeds import run_seed
from lit_rl.core.steps import max_steps_message
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt
from lit_rl.errors import ConfigError
from lit_rl.modules.protocols import experience_hooks
from lit_rl.rewards.base import TrainerState
from lit_rl.rewards.pool import RewardPool
from lit_rl.rollout.async_producer import AsyncProducer
from lit_rl.rollout.base import EngineBase, check_engine
from lit_rl.rollout.engine import Completion, HFEngine, SamplingConfig
from lit_rl.rollout.pipeline import RolloutConfig, RolloutPipeline, build_pipeline


class RolloutCallback(RolloutProducer):
    """Generate, score and annotate rollouts for every training batch.

    The stages are a ``RolloutPipeline``: pass one (``pipeline=``; e.g. ``agent_loop.agent_pipeline``, what
    ``AgentRolloutCallback`` does), or the flat settings below, which ``rollout.pipeline.build_pipeline`` turns
    into one (``RolloutConfig``; every ``configs/*.yaml`` writes these). With a pipeline, ``group_size`` and
    ``sampling`` are the pipeline's, ``rewards`` is optional (its score stage's pool is used when it has one)
    and the other stage settings must stay at their defaults.

    Args:
        engine: an ``EngineBase`` subclass (``HFEngine`` default, ``VLLMEngine``, ``VLLMServerEngine``).
        rewards: a ``RewardPool``, or reward functions (one, a list, or a dict name → fn) wrapped in one.
        group_size: completions per prompt (G).
        sampling: temperature / top-p / top-k / max_new_tokens.
        sync_every: push weights to the engine every this many optimizer steps.
        max_prompt_len: prompts longer than this many tokens are handled per ``overlong_prompts``.
        overlong_prompts: ``truncate`` (keep the last tokens) | ``drop`` (counted) | ``error``.
        dynamic_sampling: DAPO (arXiv 2503.14476): drop groups whose rewards have zero variance and refill
            from freshly drawn prompts until the batch again holds ``data.batch_size`` informative groups; after
            ``max_resample_tries`` extra generations without filling it the step raises (a short batch would
            give ranks unequal rows). Each rank draws refill prompts from its own stream, keyed by
            (seed, rank, iteration), so a resumed run draws the same ones.
        overlong_filter: DAPO overlong filtering: completions cut off by ``max_new_tokens`` (finish reason
            ``length``) keep their reward in their group's statistics but do not train (``Experience.trainable``).
        overlong_buffer: DAPO soft overlong punishment: a penalty falling linearly from 0 to
            −``overlong_penalty_factor`` over the last ``overlong_buffer`` tokens of the generation budget, added
            to every valid reward (component ``overlong_penalty``; ``core.shaping``). None = off.
        mode: ``sync`` (generate, then train, every iteration) | ``async`` (a background producer generates
            while the trainer updates; needs an engine that generates from its own copy of the weights, e.g.
            ``HFEngine(share_weights=False)``, the default engine in async mode, or ``VLLMEngine``).
        max_staleness: async: a row generated by weights more than this many weight pushes behind the learner
            is never trained on. 0 reproduces sync exactly (the producer waits for every push).
        queue_size: async: most finished rows waiting for the trainer; at least one iteration
            (``data.batch_size x group_size``). None = ``max_staleness + 1`` iterations.
        stale_policy: async: what happens to a too-stale Experience: ``drop`` (take the next one) or
            ``regenerate`` (same prompts, current weights); both counted (``async/dropped``,
            ``async/regenerated``, in rows).
        pipeline: a ``RolloutPipeline`` to run instead of the one the flat settings describe.
    """

    def __init__(
        self,
        engine: EngineBase | None = None,
        rewards: RewardPool | Callable | list[Callable] | dict[str, Callable] | None = None,
        group_size: int = 8,
        sampling: SamplingConfig | None = None,
        sync_every: int = 1,
        max_prompt_len: int = 512,
        overlong_prompts: OverlongPrompts = "truncate",
        dynamic_sampling: bool = False,
        max_resample_tries: int = 3,
        overlong_filter: bool = False,
        overlong_buffer: int | None = None,
        overlong_penalty_factor: float = 1.0,
        seed: int | None = None,
        mode: RolloutMode = "sync",
        max_staleness: int = 1,
        queue_size: int | None = None,
        stale_policy: StalePolicy = "drop",
        pipeline: RolloutPipeline | None = None,
    ):
        if pipeline is None and rewards is None:
            raise ValueError("RolloutCallback.rewards is required: a RewardPool or reward function(s)")
        if pipeline is not None:
            _check_pipeline_args(pipeline, engine, group_size, sampling, max_prompt_len, overlong_prompts,
                                 dynamic_sampling, max_resample_tries, overlong_filter, overlong_buffer,
                                 overlong_penalty_factor)
            group_size, sampling = pipeline.group_size, pipeline.sampling or sampling
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        seed = run_seed(seed)  # None: the run's seed_everything (lit_rl.core.seeds)
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        # The flat settings as given (configs/*.yaml and CLI round trips read them); the pipeline is built from
        # them once (rollout.pipeline.build_pipeline), so changing one after construction changes nothing.
        self.config = RolloutConfig(group_size, sampling or SamplingConfig(), max_prompt_len, overlong_prompts,
                                    dynamic_sampling, max_resample_tries, overlong_filter, overlong_buffer,
                                    overlong_penalty_factor, seed)
        self.sampling = self.config.sampling
        check_async_args(mode, max_staleness, queue_size, stale_policy, group_size, engine)
        self.mode, self.max_staleness, self.queue_size, self.stale_policy = mode, max_staleness, queue_size, stale_policy
        # Async generation overlaps updates, so its engine needs its own copy of the weights.
        self.engine = check_engine(engine) if engine is not None else HFEngine(share_weights=mode == "sync")
        if rewards is not None and not isinstance(rewards, RewardPool):
            rewards = RewardPool(rewards)
        self.rewards = rewards if rewards is not None else getattr(getattr(pipeline, "score", None), "rewards", None)
        self.group_size = group_size
        self.max_prompt_len, self.overlong, self.seed = max_prompt_len, overlong_prompts, seed
        self.dynamic_sampling, self.max_resample_tries = dynamic_sampling, max_resample_tries
        self.overlong_filter, self.overlong_buffer = overlong_filter, overlong_buffer
        self.overlong_penalty_factor = overlong_penalty_factor
        self._default_eval: HeldoutEval | None = None
        self._log_history: list[dict[str, float]] = []  # TrainerState.log_history: one dict per finished iteration
        if pipeline is None:
            # generation, weight loads and evaluation use the engine one at a time
            self.engine_lock = threading.RLock()
            pipeline = build_pipeline(self.engine, self.rewards, self.config, self.engine_lock)
        else:  # the pipeline's generator already holds a lock: the callback's pushes and evaluation share it
            self.engine_lock = getattr(pipeline.generate, "lock", None) or threading.RLock()
        self.pipeline = pipeline
        self.weight_sync = WeightSync(self.engine, sync_every, self.engine_lock)
        self._async = AsyncRollouts(group_size, max_staleness, queue_size, stale_policy, self.engine_lock)

    # The schedule's and the producer's state, under the names the callback had before they moved out.
    sync_every = property(lambda self: self.weight_sync.sync_every,
                          lambda self, v: setattr(self.weight_sync, "sync_every", v))
    last_sync_step = property(lambda self: self.weight_sync.last_sync_step,
                              lambda self, v: setattr(self.weight_sync, "last_sync_step", v))

    @property
    def _producer(self) -> AsyncProducer | None:
        return self._async.producer

    @property
    def _async_state(self) -> dict[str, int]:
        return self._async.state

    # ------------------------------------------------------------------ setup
    def setup(self, trainer, pl_module, stage: str) -> None:
        # Explicit wiring (every stage): the module, evaluation, teacher rollouts and engines read what they need
        # from ``module.rollout_source`` instead of searching trainer.callbacks; a validation without a
        # HeldoutEval callback uses a default evaluator (HeldoutEval.setup hands its own, whatever the order).
        pl_module.rollout_source = self
        if getattr(pl_module, "heldout_eval", None) is None:
            self._default_eval = pl_module.heldout_eval = HeldoutEval()
        if stage != "fit":
            return
        from lit_rl.core.advantages import check_group_size

        hp = getattr(pl_module, "hparams", None)
        check_group_size(getattr(hp, "advantage", None), self.group_size, getattr(hp, "rl_coef", None))
        pl_module.temperature = self.sampling.logprob_temperature
        pl_module.processing = self.sampling.processing  # the sampler's distribution for ratios (core.processed)
        self.engine.bind(pl_module, group_size=self.group_size, max_new_tokens=self.sampling.max_new_tokens)
        dm = getattr(trainer, "datamodule", None)
        # a TRL-style reward's required parameter the data lacks: one line now (before the weights load), not
        # an error on every row at the first rollout
        try:
            if self.rewards is not None:  # the agent path scores with its environment
                self.rewards.check_columns(getattr(dm, "train_prompts", None) or [])
        except ValueError as e:
            raise ConfigError(f"rollout.rewards: {e}") from None
        prompts_per_step = getattr(dm, "batch_size", None)
        mb = getattr(pl_module.hparams, "minibatch_size", None)
        if prompts_per_step and mb:
            rows = prompts_per_step * self.group_size * 1  # per rank: each rank draws its own prompts
            if rows % mb:
                raise ValueError(
                    f"minibatch_size={mb} does not divide the rollout batch of {rows} rows "
                    f"(data.batch_size={prompts_per_step} prompts x group_size={self.group_size})")
        per_iteration = getattr(pl_module, "optimizer_steps_per_iteration", None)
        if prompts_per_step and per_iteration is not None:
            rows = prompts_per_step * self.group_size
            steps = per_iteration(rows)
            # the progress bar's total (iterations) is exact from the start: max_steps / steps (progress.py)
            pl_module.steps_per_iteration = steps
            hp = pl_module.hparams
            why = steps and max_steps_message(trainer.max_steps, rows, hp.get("ppo_epochs", 1),
                                              hp.get("minibatch_size"))
            if why:
                raise ConfigError(why)
        if self.mode == "async":
            self._async.check_setup(trainer, pl_module)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if getattr(pl_module, "heldout_eval", None) is self._default_eval:
            pl_module.heldout_eval = None
        self._default_eval = None
        self._async.stop()
        if self.rewards is not None:
            self.rewards.close()
        self.engine.teardown()  # engines owning processes (launched vLLM servers) stop them

    # -------------------------------------------------------------- rollouts
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.rewards is not None:  # what TRL-style rewards get as trainer_state (rewards/base.py)
            self.rewards.trainer_state = TrainerState.from_trainer(trainer, batch_idx, tuple(self._log_history))
        # steps 1-5 end with an agreement: one rank's error raises on every rank before any rank enters the
        # collectives of steps 6-7 or the training step (callbacks/_agree.py)
        if self.mode == "async":
            exp, metrics = agree(trainer, "the rollout", lambda: self._async.take(self._builder(trainer, pl_module)))
        else:
            exp, metrics = agree(trainer, "the rollout", lambda: self._build(trainer, pl_module, batch.prompts))
        self._annotate(trainer, pl_module, exp, metrics)
        batch.experience, batch.metrics = exp, metrics

    def _build(self, trainer, pl_module, prompts: list[Prompt],
               iteration: int | None = None) -> tuple[Experience, dict[str, float]]:
        """Steps 1-5: prompts → scored Experience (the async producer runs this in its thread). ``iteration``
        keys the refill stream: the module's current one (sync), or the one the producer's item is for (async:
        never read from the module in the producer thread, where it depends on how far the trainer got)."""
        pool = getattr(getattr(trainer, "datamodule", None), "train_prompts", None)
        if iteration is None:
            iteration = getattr(pl_module, "iteration", 0)
        exp, metrics = self.pipeline.run(pl_module.tokenizer, prompts, pool=pool, rank=trainer.global_rank,
                                         iteration=iteration)
        metrics.update(self.engine.metrics())  # engine-side counters, e.g. VLLMServerEngine's server errors
        return exp, metrics

    def _builder(self, trainer, pl_module) -> Callable[[list[Prompt], int], tuple[Experience, dict[str, float]]]:
        """``_build`` as the async producer calls it: ``(prompts, refill iteration)``."""
        return lambda prompts, iteration: self._build(trainer, pl_module, prompts, iteration=iteration)

    def _annotate(self, trainer, pl_module, exp: Experience, metrics: dict[str, float]) -> None:
        """Steps 6-7, always in the trainer thread with the current learner."""
        pl_module.on_experience(trainer, pl_module, exp)
        for hook in experience_hooks(trainer):
            hook.on_experience(trainer, pl_module, exp)
        metrics.update(pl_module.compute_advantages(exp))

    def eval_generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        """Generate with the learner's latest pushed weights, safely while an async producer runs (evaluation)."""
        with self.engine_lock:
            self._async.apply_pending()
            return self.engine.generate(prompt_ids, n, sampling)

    # ----------------------------------------------------------- weight sync
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        metrics = getattr(batch, "metrics", None) or {}
        self._log_history.append({"step": trainer.global_step, "epoch": trainer.current_epoch, **{
            k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}})
        self.weight_sync.after_iteration(trainer, pl_module, self._async if self._async.running else None)
        self._async.end_iteration()
        _log_iteration_step(trainer, pl_module, on_step=True)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:  # the sanity pass's baseline is logged at step 0 by the module itself
            _log_iteration_step(trainer, pl_module, on_step=False)

    # ----------------------------------------------------------------- async
    def on_train_start(self, trainer, pl_module) -> None:
        self._async.stop()  # a producer left from an earlier fit
        is_async = self.mode == "async"
        self.weight_sync.first_push(trainer, pl_module.model, self._async.state["version"] if is_async else None)
        if is_async:
            self._async.start(trainer.datamodule, getattr(pl_module, "iteration", 0),
                              self._builder(trainer, pl_module), self.weight_sync.load)

    def on_train_end(self, trainer, pl_module) -> None:
        self._async.stop()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._async.stop()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The sync schedule, the render counters, the run-wide group counter, the engine's version and state
        (``engine``: this rank's; ``engine_ranks``: every rank's, each restored to its own rank); async: the learner's version, the prompt position after the last *trained* batch and the counters.
        Experiences queued or in flight are not saved: a resumed run regenerates them from those prompts."""
        engine = self.engine.state_dict()
        return {**self.weight_sync.state_dict(), **self.pipeline.state_dict(),
                "policy_version": self.engine.policy_version,
                "async": self._async.state_dict(),
                "engine": engine, "engine_ranks": _every_rank(engine)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight_sync.load_state_dict(state)
        self.pipeline.load_state_dict(state)
        self.engine.policy_version = state["policy_version"]
        self._async.load_state_dict(state.get("async", {}))
        engine = _this_rank(state.get("engine_ranks")) or state.get("engine")
        if engine:
            self.engine.load_state_dict(engine)


def _every_rank(mine: dict) -> list[dict]:
    """Every rank's engine state, gathered so rank 0 (which writes the checkpoint) holds them all: each rank's
    seed cursor / call count is its own (refills make them differ). A collective; ``state_dict`` runs on every
    rank (Lightning dumps the checkpoint on all of them)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return [mine]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def _this_rank(states: list[dict] | None) -> dict | None:
    """This rank's entry of ``engine_ranks``; None when absent (older checkpoint) or saved by another number of
    ranks (then every rank takes rank 0's ``engine``, as before)."""
    import torch.distributed as dist

    from lit_rl.rollout.base import global_rank

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return states[global_rank()] if states and len(states) == world else None


_STAGE_DEFAULTS = {"max_prompt_len": 512, "overlong_prompts": "truncate", "dynamic_sampling": False,
                   "max_resample_tries": 3, "overlong_filter": False, "overlong_buffer": None,
                   "overlong_penalty_factor": 1.0}


def _check_pipeline_args(pipeline, engine, group_size, sampling, *stage_args) -> None:
    """A given pipeline owns its stages: flat stage settings beside it would be silently ignored, so refuse them."""
    given = {k: v for (k, d), v in zip(_STAGE_DEFAULTS.items(), stage_args) if v != d}
    if given:
        raise ValueError(f"RolloutCallback: pipeline= builds its own stages, so {', '.join(sorted(given))} would be "
                         "ignored; set them on the pipeline (rollout.pipeline.RolloutConfig + build_pipeline) or "
                         "drop pipeline=")
    if group_size not in (8, pipeline.group_size):
        raise ValueError(f"RolloutCallback: group_size={group_size} differs from the pipeline's {pipeline.group_size}")
    if sampling is not None and pipeline.sampling is not None and sampling != pipeline.sampling:
        raise ValueError("RolloutCallback: sampling differs from the pipeline's; pass one of them")
    gen_engine = getattr(pipeline.generate, "engine", None) or getattr(getattr(pipeline.generate, "agent", None),
                                                                       "engine", None)
    if engine is not None and gen_engine is not None and gen_engine is not engine:
        raise ValueError("RolloutCallback: engine is not the engine the pipeline generates with")


def _log_iteration_step(trainer, pl_module, on_step: bool) -> None:
    """Every logger's x-axis is the RL iteration (1-based, what the progress bar, the rollout files and
    ``rollouts/metrics.jsonl`` show): Lightning uses a logged ``step`` as the logging step, else its own
    0-based batch count, which is one behind. ``lit_rl.runs.checkpoint_log_step`` relies on this numbering."""
    it = getattr(pl_module, "iteration", None)
    if it is not None:
        pl_module.log("step", float(it), on_step=on_step, on_epoch=not on_step, batch_size=1,
                      sync_dist=trainer.world_size > 1)
