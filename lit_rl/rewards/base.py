"""The reward-function protocol.

A reward function is a plain callable ``fn(prompt: Prompt, completion: str) -> float | RewardResult``
(the habit TRL users have, typed). ``prompt`` is the whole record, so verifiers read ``prompt.answer`` or
``prompt.metadata``. Returning ``RewardResult`` lets a function report sub-scores (logged as
``reward/<name>/<key>``) or say that it could not judge the completion (``ok=False``: an infrastructure
failure, masked out of the advantages and counted — never scored 0; ``error`` says why, and that text
travels with the row into ``Experience.reward_errors``).

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
    """What TRL-style rewards get as ``trainer_state`` (the parts of TRL's ``TrainerState`` rewards read)."""

    global_step: int = 0
    epoch: int = 0


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, prompt: Any, completion: str) -> float | RewardResult: ...


def as_result(value: Any) -> RewardResult:
    """Normalise a reward function's return value; raises TypeError for non-numbers / non-finite."""
    if isinstance(value, RewardResult):
        res = value
    elif isinstance(value, bool):  # bool is an int subclass; accept it as 0/1 deliberately
        res = RewardResult(float(value))
    elif isinstance(value, (int, float)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        res = RewardResult(float(value))
    elif isinstance(value, (list, tuple)):
        raise TypeError(f"reward function returned a {type(value).__name__} of {len(value)} values for one completion; "
                        "a per-row reward fn(prompt, completion) returns one float or RewardResult (a TRL-style "
                        "batched function must name its parameters (prompts, completions, **columns))")
    else:
        raise TypeError(f"reward function returned {type(value).__name__} {value!r:.80}; expected a float or "
                        "RewardResult")
    if res.ok and not math.isfinite(res.score):
        raise TypeError(f"reward function returned a non-finite score {res.score!r}")
    return res
