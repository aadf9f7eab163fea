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
from typing import Any, ClassVar

import lightning.pytorch as pl

from lit_rl.callbacks._agree import agree
from lit_rl.callbacks._async import check_async_args
from lit_rl.callbacks._async_rollouts import AsyncRollouts
from lit_rl.callbacks._learner import datamodule_of, learner, one_callback, prompt_data
from lit_rl.callbacks._roles import RolloutProducer
from lit_rl.callbacks._weight_sync import WeightSync
from lit_rl.callbacks.eval import HeldoutEval
from lit_rl.callbacks.teachers import TeacherRouter
from lit_rl.core.settings import flat_settings, flat_values, split_settings
from lit_rl.core.steps import max_steps_message
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, PromptBatch
from lit_rl.errors import ConfigError
from lit_rl.learners.binding import Evaluator, RolloutBinding, RolloutBound, TeacherSource
from lit_rl.learners.policy import PolicyModule
from lit_rl.learners.protocols import experience_hooks
from lit_rl.rewards.base import TrainerState
from lit_rl.rewards.pool import RewardPool
from lit_rl.rollout.agent_loop import AgentGenerator, AgentLoop
from lit_rl.rollout.async_producer import AsyncProducer
from lit_rl.rollout.base import EngineBase, check_engine
from lit_rl.rollout.engine import Completion, HFEngine, SamplingConfig
from lit_rl.rollout.generate import Generator
from lit_rl.rollout.pipeline import RolloutPipeline, build_pipeline
from lit_rl.rollout.score import Scorer
from lit_rl.rollout.settings import FilterSettings, RolloutSettings, SyncSettings


@flat_settings((RolloutSettings, FilterSettings, SyncSettings), before=2)
class RolloutCallback(RolloutProducer):
    """Generate, score and annotate rollouts for every training batch.

    The stages are a ``RolloutPipeline``: pass one (``pipeline=``; e.g. ``agent_loop.agent_pipeline``, what
    ``AgentRolloutCallback`` does), or the flat settings below, which ``rollout.pipeline.build_pipeline`` turns
    into one. Each setting is declared once, in its group (``lit_rl.rollout.settings``: ``RolloutSettings``,
    ``FilterSettings``, ``SyncSettings``); the callback keeps the groups (``settings``, ``filters``, ``sync``)
    and every reader takes the value from them. With a pipeline, its ``settings`` and ``filters`` are used:
    a flat setting of those groups beside it would be ignored, so one that differs from its default is
    refused; ``rewards`` is then optional (its score stage's pool is used when it has one).

    Args:
        engine: an ``EngineBase`` subclass (``HFEngine`` default, ``VLLMEngine``, ``VLLMServerEngine``).
        rewards: a ``RewardPool``, or reward functions (one, a list, or a dict name → fn) wrapped in one.
        pipeline: a ``RolloutPipeline`` to run instead of the one the flat settings describe.
    """

    settings_groups: ClassVar[tuple[type, ...]]  # set by @flat_settings

    def __init__(
        self,
        engine: EngineBase | None = None,
        rewards: RewardPool | Callable | list[Callable] | dict[str, Callable] | None = None,
        *,
        pipeline: RolloutPipeline | None = None,
        **settings: Any,
    ):
        if pipeline is None and rewards is None:
            raise ValueError("RolloutCallback.rewards is required: a RewardPool or reward function(s)")
        rollout, filters, self.sync = split_settings("RolloutCallback", type(self).settings_groups, settings)
        if pipeline is not None:
            _check_pipeline_args(pipeline, engine, settings)
            rollout, filters = pipeline.settings, pipeline.filters
        self.settings, self.filters = rollout, filters
        check_async_args(self.sync, rollout, engine)
        # Async generation overlaps updates, so its engine needs its own copy of the weights.
        self.engine = (
            check_engine(engine) if engine is not None else HFEngine(share_weights=self.sync.mode == "sync")
        )
        if rewards is not None and not isinstance(rewards, RewardPool):
            rewards = RewardPool(rewards)
        # a given pipeline's reward stage (a Scorer) holds its pool; the agent path's scores with its environment
        score = pipeline.score if pipeline is not None else None
        self.rewards = (
            rewards if rewards is not None else (score.rewards if isinstance(score, Scorer) else None)
        )
        # validation's evaluator when the trainer has no HeldoutEval callback (made once: a second setup by
        # this callback binds an equal binding)
        self._default_eval: HeldoutEval = self._make_default_eval()
        self._bound: RolloutBinding | None = None  # what setup bound, released at teardown
        self._log_history: list[
            dict[str, float]
        ] = []  # TrainerState.log_history: one dict per finished iteration
        if pipeline is None:
            # generation, weight loads and evaluation use the engine one at a time
            self.engine_lock = threading.RLock()
            assert self.rewards is not None  # required without a pipeline (checked first)
            pipeline = build_pipeline(self.engine, self.rewards, rollout, filters, self.engine_lock)
        else:  # the pipeline's generator already holds a lock: the callback's pushes and evaluation share it
            gen = pipeline.generate
            self.engine_lock = gen.lock if isinstance(gen, (Generator, AgentGenerator)) else threading.RLock()
        self.pipeline = pipeline
        self.weight_sync = WeightSync(self.engine, self.sync.sync_every, self.engine_lock)
        self._async = AsyncRollouts(rollout, self.sync, self.engine_lock)

    def _make_default_eval(self) -> HeldoutEval:
        return HeldoutEval()

    @property
    def _producer(self) -> AsyncProducer | None:
        return self._async.producer

    @property
    def _async_state(self) -> dict[str, int]:
        return self._async.state

    # ------------------------------------------------------------------ setup
    def binding(
        self,
        evaluator: Evaluator | None = None,
        teacher_router: TeacherSource | None = None,
        steps_per_iteration: int | None = None,
    ) -> RolloutBinding:
        """The frozen ``RolloutBinding`` this callback hands the learner (``setup``; tests build one here):
        its engine, lock, settings, pipeline and rewards, with ``evaluator`` (None: this callback's default)."""
        return RolloutBinding(
            engine=self.engine,
            settings=self.settings,
            pipeline=self.pipeline,
            lock=self.engine_lock,
            evaluator=evaluator if evaluator is not None else self._default_eval,
            eval_generate=self.eval_generate,
            apply_pending=self._async.apply_pending,
            rewards=self.rewards,
            steps_per_iteration=steps_per_iteration,
            teacher_router=teacher_router,
            agent=self._agent_loop(),
        )

    def _agent_loop(self) -> AgentLoop | None:
        return None  # AgentRolloutCallback's is its agent

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Explicit wiring (every stage): one frozen RolloutBinding handed to the learner by its one method
        # ``bind_rollout``; the module, evaluation, teacher rollouts and engines read what they need from it.
        # The evaluator and the teacher router are the trainer's callbacks of those types (typed, not probed);
        # without a HeldoutEval callback validation uses this callback's default evaluator.
        if not isinstance(pl_module, RolloutBound):
            raise TypeError(
                f"RolloutCallback trains a lit_rl learner (PolicyModule or a subclass), got "
                f"{type(pl_module).__name__}"
            )
        evaluator = one_callback(trainer, HeldoutEval, "HeldoutEval")
        router = one_callback(trainer, TeacherRouter, "TeacherRouter")
        steps = self._check_fit(trainer, pl_module) if stage == "fit" else None
        self._bound = self.binding(evaluator, router, steps)
        pl_module.bind_rollout(self._bound)
        if stage == "fit" and self.sync.mode == "async":
            self._async.check_setup(trainer, pl_module)

    def _check_fit(self, trainer: pl.Trainer, pl_module: RolloutBound) -> int | None:
        """Fit-only setup: refuse what cannot train before the weights load, bind the engine; returns the
        optimizer steps one iteration takes (None: unknown or varies)."""
        group_size = self.settings.group_size
        if isinstance(pl_module, PolicyModule):  # a group-relative advantage needs groups of two or more
            pl_module.check_group_size(group_size)
        self.engine.bind(pl_module, self.settings)
        # a TRL-style reward's required parameter the data lacks: one line now (before the weights load), not
        # an error on every row at the first rollout
        # (a user's own LightningDataModule has no prompt set or batch size of lit_rl's to check)
        prompt_dm = prompt_data(trainer)
        try:
            if self.rewards is not None:  # the agent path scores with its environment
                self.rewards.check_columns(prompt_dm.train_prompts if prompt_dm is not None else [])
        except ValueError as e:
            raise ConfigError(f"rollout.rewards: {e}") from None
        prompts_per_step = prompt_dm.batch_size if prompt_dm is not None else None
        # a lit_rl learner's optimizer-step settings (another LightningModule has no minibatch plan to check)
        step = pl_module.config.step if isinstance(pl_module, PolicyModule) else None
        mb = step.minibatch_size if step is not None else None
        rows = prompts_per_step * group_size if prompts_per_step else 0  # per rank: each draws its prompts
        if rows and mb and rows % mb:
            raise ValueError(
                f"minibatch_size={mb} does not divide the rollout batch of {rows} rows "
                f"(data.batch_size={prompts_per_step} prompts x group_size={group_size})"
            )
        if not (rows and step is not None and isinstance(pl_module, PolicyModule)):
            return None
        steps = pl_module.optimizer_steps_per_iteration(rows)
        # the progress bar's total (iterations) is exact from the start: max_steps / steps (progress.py)
        why = steps and max_steps_message(trainer.max_steps, rows, step.ppo_epochs, step.minibatch_size)
        if why:
            raise ConfigError(why)
        return steps

    def _release(self, pl_module: pl.LightningModule) -> None:
        if self._bound is not None and isinstance(pl_module, RolloutBound):
            pl_module.release_rollout(self._bound)
        self._bound = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release(pl_module)
        self._async.stop()
        if self.rewards is not None:
            self.rewards.close()
        self.engine.teardown()  # engines owning processes (launched vLLM servers) stop them

    # -------------------------------------------------------------- rollouts
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: PromptBatch, batch_idx: int
    ) -> None:
        if self.rewards is not None:  # what TRL-style rewards get as trainer_state (rewards/base.py)
            self.rewards.trainer_state = TrainerState.from_trainer(
                trainer, batch_idx, tuple(self._log_history)
            )
        # steps 1-5 end with an agreement: one rank's error raises on every rank before any rank enters the
        # collectives of steps 6-7 or the training step (callbacks/_agree.py)
        if self.sync.mode == "async":
            exp, metrics = agree(
                trainer, "the rollout", lambda: self._async.take(self._builder(trainer, pl_module))
            )
        else:
            exp, metrics = agree(
                trainer, "the rollout", lambda: self._build(trainer, pl_module, batch.prompts)
            )
        self._annotate(trainer, pl_module, exp, metrics)
        batch.experience, batch.metrics = exp, metrics

    def _build(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prompts: list[Prompt],
        iteration: int | None = None,
    ) -> tuple[Experience, dict[str, float]]:
        """Steps 1-5: prompts → scored Experience (the async producer runs this in its thread). ``iteration``
        keys the refill stream: the module's current one (sync), or the one the producer's item is for (async:
        never read from the module in the producer thread, where it depends on how far the trainer got)."""
        dm = prompt_data(trainer)
        pool = dm.train_prompts if dm is not None else None
        module = learner(pl_module, "RolloutCallback")
        if iteration is None:
            iteration = module.iteration
        exp, metrics = self.pipeline.run(
            module.tokenizer, prompts, pool=pool, rank=trainer.global_rank, iteration=iteration
        )
        metrics.update(self.engine.metrics())  # engine-side counters, e.g. VLLMServerEngine's server errors
        return exp, metrics

    def _builder(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> Callable[[list[Prompt], int], tuple[Experience, dict[str, float]]]:
        """``_build`` as the async producer calls it: ``(prompts, refill iteration)``."""
        return lambda prompts, iteration: self._build(trainer, pl_module, prompts, iteration=iteration)

    def _annotate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exp: Experience, metrics: dict[str, float]
    ) -> None:
        """Steps 6-7, always in the trainer thread with the current learner."""
        module = learner(pl_module, "RolloutCallback")
        module.on_experience(trainer, module, exp)
        for hook in experience_hooks(trainer):
            hook.on_experience(trainer, module, exp)
        metrics.update(module.compute_advantages(exp))

    def eval_generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Generate with the learner's latest pushed weights, safely while an async producer runs (evaluation)."""
        with self.engine_lock:
            self._async.apply_pending()
            return self.engine.generate(prompt_ids, n, sampling)

    # ----------------------------------------------------------- weight sync
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        metrics = batch.metrics
        self._log_history.append(
            {
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
                **{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
            }
        )
        self.weight_sync.after_iteration(trainer, pl_module, self._async if self._async.running else None)
        self._async.end_iteration()
        _log_iteration_step(trainer, pl_module, on_step=True)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:  # the sanity pass's baseline is logged at step 0 by the module itself
            _log_iteration_step(trainer, pl_module, on_step=False)

    # ----------------------------------------------------------------- async
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._async.stop()  # a producer left from an earlier fit
        is_async = self.sync.mode == "async"
        module = learner(pl_module, "RolloutCallback")
        self.weight_sync.first_push(trainer, module.model, self._async.state["version"] if is_async else None)
        if is_async:
            self._async.start(
                datamodule_of(trainer),  # checked at setup (AsyncRollouts.check_setup)
                module.iteration,
                self._builder(trainer, pl_module),
                self.weight_sync.load,
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._async.stop()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._release(pl_module)  # Lightning runs no teardown hook after an exception
        self._async.stop()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The sync schedule, the render counters, the run-wide group counter, the engine's version and state
        (``engine``: this rank's; ``engine_ranks``: every rank's, each restored to its own rank); async: the
        learner's version, the prompt position after the last *trained* batch and the counters.
        Experiences queued or in flight are not saved: a resumed run regenerates them from those prompts."""
        engine = self.engine.state_dict()
        return {
            **self.weight_sync.state_dict(),
            **self.pipeline.state_dict(),
            "policy_version": self.engine.policy_version,
            "async": self._async.state_dict(),
            "engine": engine,
            "engine_ranks": _every_rank(engine),
        }

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


def _check_pipeline_args(pipeline: RolloutPipeline, engine, settings: dict[str, Any]) -> None:
    """A given pipeline carries its own rollout and filter settings: flat ones beside it would be silently
    ignored, so one that differs from its declared default is refused (a default is indistinguishable from
    not given: it is what a recipe's section holds when it sets nothing)."""
    defaults = {**flat_values(RolloutSettings()), **flat_values(FilterSettings())}
    given = sorted(k for k, v in settings.items() if k in defaults and v != defaults[k])
    if given:
        raise ValueError(
            f"RolloutCallback: pipeline= carries its own settings, so {', '.join(given)} would "
            "be ignored; set them on the pipeline's RolloutSettings / FilterSettings, or drop "
            "pipeline="
        )
    gen_engine = pipeline.generate.engine
    if engine is not None and gen_engine is not engine:
        raise ValueError("RolloutCallback: engine is not the engine the pipeline generates with")


def _log_iteration_step(trainer: pl.Trainer, pl_module: pl.LightningModule, on_step: bool) -> None:
    """Every logger's x-axis is the RL iteration (1-based, what the progress bar, the rollout files and
    ``rollouts/metrics.jsonl`` show): Lightning uses a logged ``step`` as the logging step, else its own
    0-based batch count, which is one behind. ``lit_rl.runs.checkpoint_log_step`` relies on this numbering."""
    if isinstance(pl_module, PolicyModule):  # another LightningModule keeps Lightning's own step
        pl_module.log(
            "step",
            float(pl_module.iteration),
            on_step=on_step,
            on_epoch=not on_step,
            batch_size=1,
            sync_dist=trainer.world_size > 1,
        )
