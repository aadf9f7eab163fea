"""`RolloutBinding`: what the rollout side hands the learner, once, at setup.

(docs/architecture.md "Layout", its "Wiring" table.)

The rollout callback builds one frozen ``RolloutBinding`` in its ``setup`` and hands it over through the one
method ``bind_rollout`` of the learner (``RolloutBound``, a base of ``PolicyModule``). Everything the learner, its
validation, the held-out evaluation and teacher distillation read from the rollout side is a field of it: the
engine and its lock, the rollout settings (the sampling temperature and processing the training log-probs must
match are read from ``settings.sampling`` and held nowhere else), the pipeline, the reward pool, the held-out
evaluator, the optimizer steps one iteration takes and, in a distillation run, the teacher router. No callback
writes any other attribute onto the module.

One binding per fit/validate: a second, different binding while one is held (two rollout callbacks in one
trainer) is an error; the callback releases its binding at ``teardown`` (or on an exception), after which a new
one may be bound, and the released one stays readable (the module keeps its sampling temperature after fit).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from lit_rl.core.processed import LogitProcessing
from lit_rl.rollout.engine import Completion, SamplingConfig

if TYPE_CHECKING:  # annotations only: the learner floor never needs these at import time
    from lit_rl.rewards.pool import RewardPool
    from lit_rl.rollout.agent_loop import AgentLoop
    from lit_rl.rollout.base import EngineBase
    from lit_rl.rollout.pipeline import RolloutPipeline
    from lit_rl.rollout.settings import RolloutSettings


class Evaluator(Protocol):
    """The held-out evaluator the learner's validation loop drives (``HeldoutEval``, ``AgentEval``)."""

    history: list[dict[str, float]]

    def start(self, pl_module: Any) -> None: ...

    def score_batch(self, trainer: Any, pl_module: Any, prompts: list) -> None: ...

    def finish(self, trainer: Any, pl_module: Any) -> dict[str, float]: ...


class TeacherSource(Protocol):
    """What ``DistillModule`` asks of the teacher router (``lit_rl.callbacks.teachers.TeacherRouter``)."""

    def check_teachers(self, module: Any, full_vocab_loss: str | None) -> None: ...

    def teacher_logits(self, module: Any, micro: Any, loss: str = ...) -> Any: ...

    def teacher_heads(self, module: Any, micro: Any, loss: str = ...) -> list[tuple[list[int], Any]]: ...

    def teacher_rollouts(
        self, module: Any, prompts: list, sampling: Any, rewards: Any
    ) -> tuple[Any, dict]: ...


EvalGenerate = Callable[[list[list[int]], int, SamplingConfig], list[list[Completion]]]


@dataclass(frozen=True)
class RolloutBinding:
    """The rollout side of one run, as the learner sees it (module doc). Built by ``RolloutCallback.binding``.

    Fields:
        engine: the ``EngineBase`` that generates (weights pushed to it by the callback).
        settings: the rollout's ``RolloutSettings`` (``group_size``, ``sampling``).
        pipeline: the ``RolloutPipeline`` (evaluation renders and scores with it).
        lock: held while the engine generates, loads weights or is evaluated with.
        evaluator: the held-out evaluator (the user's ``HeldoutEval`` callback, or the callback's default).
        eval_generate: generate with the learner's latest pushed weights, safe beside an async producer.
        apply_pending: load the newest pushed weights into the engine now (an async producer's pending push).
        rewards: the ``RewardPool`` (None on the agent path, which scores with its environment).
        steps_per_iteration: optimizer steps one iteration takes (None: unknown, or varies).
        teacher_router: the ``TeacherRouter`` of a distillation run, else None.
        agent: the ``AgentLoop`` of an agent run, else None.
    """

    engine: EngineBase
    settings: RolloutSettings
    pipeline: RolloutPipeline
    lock: AbstractContextManager[Any]
    evaluator: Evaluator
    eval_generate: EvalGenerate
    apply_pending: Callable[[], None]
    rewards: RewardPool | None = None
    steps_per_iteration: int | None = None
    teacher_router: TeacherSource | None = None
    agent: AgentLoop | None = None

    @property
    def sampling(self) -> SamplingConfig:
        return self.settings.sampling


# What an unbound learner computes log-probs with (a forward outside a run, e.g. a test): the defaults of
# the sampling settings, temperature 1 and no processing.
_UNBOUND_SAMPLING = SamplingConfig()


class RolloutBound:
    """The learner's side of the binding (mixin of ``PolicyModule``): ``bind_rollout`` / ``release_rollout``,
    and typed reads of what was bound."""

    _rollout: RolloutBinding | None = None
    _rollout_held: bool = False  # between bind_rollout and release_rollout

    def bind_rollout(self, binding: RolloutBinding) -> None:
        """Take the rollout side's binding (``RolloutCallback.setup``). The same binding again is a no-op; a
        different one while one is held is an error (two rollout callbacks in one trainer)."""
        if not isinstance(binding, RolloutBinding):
            raise TypeError(f"bind_rollout takes a RolloutBinding, got {type(binding).__name__}")
        held = self._rollout
        if self._rollout_held and held is not None and held != binding:
            raise RuntimeError(
                f"{type(self).__name__} is already bound to a rollout (engine {type(held.engine).__name__}); "
                "a second, different binding came at setup: use one RolloutCallback per trainer"
            )
        self._rollout, self._rollout_held = binding, True

    def release_rollout(self, binding: RolloutBinding) -> None:
        """End the binding's hold (teardown, exception); it stays readable. Another binding is left alone."""
        if self._rollout is binding:
            self._rollout_held = False

    @property
    def bound_rollout(self) -> RolloutBinding | None:
        """The binding, or None before any rollout callback's setup."""
        return self._rollout

    @property
    def rollout(self) -> RolloutBinding:
        """The binding; an error naming the missing callback when there is none."""
        if self._rollout is None:
            raise RuntimeError(
                f"{type(self).__name__} has no rollout binding: add lit_rl.callbacks.RolloutCallback (the "
                "`rollout:` section) to trainer.callbacks; its setup hands the module its engine, sampling "
                "settings and evaluator"
            )
        return self._rollout

    @property
    def sampling(self) -> SamplingConfig:
        """The rollout's sampling settings (the defaults while unbound)."""
        return self._rollout.settings.sampling if self._rollout is not None else _UNBOUND_SAMPLING

    @property
    def temperature(self) -> float:
        """The temperature training log-probs are computed at: the sampler's (1 for greedy)."""
        return self.sampling.logprob_temperature

    @property
    def processing(self) -> LogitProcessing:
        """The sampler's distribution-changing settings (ratios against the processed sampler, ``core.processed``)."""
        return self.sampling.processing
