"""The reward-function protocol.

A reward function is a plain callable ``fn(prompt: Prompt, completion: str) -> float | RewardResult``
(the habit TRL users have, typed). ``prompt`` is the whole record, so verifiers read ``prompt.answer`` or
``prompt.metadata``. Returning ``RewardResult`` lets a function report sub-scores (logged as
``reward/<name>/<key>``) or say that it could not judge the completion (``ok=False``: an infrastructure
failure of this reward for this row, never scored 0: the component is left out of the row's weighted sum, and
the row is masked out of the advantages when no other weighted reward scored it; ``error`` says why, and that
text travels with the row into ``Experience.reward_errors`` or, for a row that kept a reward, its
``reward_extras`` as ``"<name>/error"``; see ``lit_rl.rewards.pool``).

A ``None`` return means "this reward does not apply to this row" (TRL's convention): skipped in the weighted
sum. TRL-style batched functions ``fn(prompts, completions, **kwargs) -> list[float | None]`` are recognised by
``RewardPool`` and called once per batch (``lit_rl.rewards.adapters``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class RewardResult:
    score: float
    ok: bool = True  # False: the verifier failed (sandbox crashed, service down); the row is masked
    info: dict[str, float] = field(default_factory=dict)  # optional sub-scores, logged
    error: str | None = None  # with ok=False: why the verifier could not judge (shown to the user)


@dataclass(frozen=True)
class TrainerState:
    """What TRL-style rewards get as ``trainer_state``: the fields of TRL's ``TrainerState`` a reward reads, in
    lit_rl's terms (``RolloutCallback`` builds it before each rollout, ``from_trainer``).

    Fields:
        global_step: optimizer steps taken before this rollout (Lightning's ``trainer.global_step``; one per
            RL iteration unless ``ppo_epochs`` / ``minibatch_size`` make several).
        max_steps: the run's step budget in the same unit: ``trainer.max_steps``, else Lightning's estimate from
            ``max_epochs`` (``estimated_stepping_batches``); 0 when unbounded (as an unset TRL state).
        epoch: fractional epochs over the training prompts done (``current_epoch + batch / batches per epoch``).
        num_train_epochs: ``trainer.max_epochs``, else the epochs ``max_steps`` spans; 0 when unknown.
        log_history: one dict per finished RL iteration, ``{"step": global_step, "epoch": ..., <metric>: value}``
            with that iteration's rollout and reward metrics (what lit_rl logged; this rank's values). Starts
            empty in each process (a resumed run does not restore it).
    """

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = 0
    num_train_epochs: int = 0
    log_history: tuple[dict[str, float], ...] = ()

    @classmethod
    def from_trainer(cls, trainer: Any, batch_idx: int = 0, log_history: tuple = ()) -> TrainerState:
        """The state of a Lightning ``trainer`` before batch ``batch_idx`` of the current epoch."""
        per_epoch = _finite(getattr(trainer, "num_training_batches", None))
        epoch = trainer.current_epoch + (batch_idx / per_epoch if per_epoch else 0.0)
        max_steps = trainer.max_steps if (trainer.max_steps or -1) > 0 else 0
        if not max_steps:
            try:  # Lightning's estimate from max_epochs; inf / errors (no dataloader yet) leave 0
                max_steps = int(_finite(trainer.estimated_stepping_batches) or 0)
            except Exception:  # noqa: BLE001
                max_steps = 0
        epochs = trainer.max_epochs if (trainer.max_epochs or -1) > 0 else 0
        if not epochs and max_steps and per_epoch:
            epochs = math.ceil(max_steps / per_epoch)
        return cls(int(trainer.global_step), float(epoch), int(max_steps), int(epochs), tuple(log_history))


def _finite(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, prompt: Any, completion: str) -> float | RewardResult: ...


def as_result(value: Any) -> RewardResult:
    """Normalise a reward function's return value; raises TypeError for non-numbers / non-finite."""
    if isinstance(value, RewardResult):
        res = value
    # a number (a bool is an int: accepted as 0/1 deliberately) or a 0-d tensor / numpy scalar
    elif isinstance(value, (int, float)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        res = RewardResult(float(value))
    elif isinstance(value, (list, tuple)):
        raise TypeError(
            f"reward function returned a {type(value).__name__} of {len(value)} values for one completion; "
            "a per-row reward fn(prompt, completion) returns one float or RewardResult (a TRL-style "
            "batched function must name its parameters (prompts, completions, **columns))"
        )
    else:
        raise TypeError(
            f"reward function returned {type(value).__name__} {value!r:.80}; expected a float or RewardResult"
        )
    if res.ok and not math.isfinite(res.score):
        raise TypeError(f"reward function returned a non-finite score {res.score!r}")
    return res
