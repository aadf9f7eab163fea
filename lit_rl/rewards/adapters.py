"""Recognise the shape of a user's reward function at setup, adapt TRL-style ones, reject the rest.

Two shapes are accepted:

- per row (lit_rl's own): ``fn(prompt, completion) -> float | RewardResult | None``, called once per completion;
- TRL-style batched: any function naming one of TRL's arguments (``prompts``, ``completions``,
  ``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``), or taking ``**kwargs`` without fitting
  ``fn(prompt, completion)`` (e.g. ``def reward(completion_ids, **kwargs)``, ``def reward(solution, **kwargs)``).
  It is called **once per scoring call with the whole batch and everything by keyword**, as TRL's GRPOTrainer
  calls it: ``prompts`` / ``completions`` (strings for text prompts; message lists for chat prompts, the
  completion as ``[{"role": "assistant", "content": ...}]``), ``completion_ids`` (token ids), every dataset
  column under its original name (``answer`` and the column ``answer_key`` named, ``domain``, ``uid``, every
  other column; a row without a column gets ``None``), ``trainer_state`` (``TrainerState``), ``log_extra`` and
  ``log_metric`` (``RewardLog``). A function without ``**kwargs`` gets only the parameters it names. An
  ``async def`` function is awaited (``RewardPool`` gathers the async rewards of one call concurrently).

A ``None`` score (either shape) means "this reward does not apply to this row", as in TRL: it is left out of the
weighted sum; a row no reward applies to is unscored (NaN, masked and counted, never scored 0).

Anything else (a function of one argument, three required arguments, ...) is refused when the pool is built,
with both expected signatures in the message; a TRL-style function with a required parameter the data does not
have is refused at setup (``check_columns``) -- before any generation, never a run of 100 % infra errors.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lit_rl.rewards.base import TrainerState

EXPECTED = (
    "a reward is fn(prompt, completion) -> float | RewardResult (one call per completion), or TRL-style "
    "fn(prompts, completions, **kwargs) -> list[float] (one call per batch)"
)
# What every TRL-style call can receive besides the dataset's columns (TRL passes all of them by keyword).
ALWAYS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return None


def is_trl_style(fn: Callable) -> bool:
    """True when ``fn`` is meant to be called TRL's way (module doc): it names a TRL argument, or it takes
    ``**kwargs`` and cannot be called as ``fn(prompt, completion)``."""
    sig = _signature(fn)
    if sig is None:
        return False
    params = list(sig.parameters.values())
    if any(p.name in ALWAYS for p in params):
        return True
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return False
    try:
        sig.bind(object(), "")
        return False  # fn(prompt, completion, **kwargs): per row
    except TypeError:
        return True


def is_async(fn: Callable) -> bool:
    """``async def`` functions (also behind ``functools.partial``) and objects with an ``async def __call__``."""
    # a callable object's method, inherited ones too (a plain function's type has a non-async one)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def adapt_reward(name: str, fn: Callable) -> Callable:
    """``fn`` itself when it takes ``(prompt, completion)``, a ``TRLRewardAdapter`` for TRL-style functions;
    raises ``TypeError`` naming the reward and both accepted signatures otherwise."""
    if is_trl_style(fn):
        return TRLRewardAdapter(fn, name)
    sig = _signature(fn)
    if sig is not None:
        try:
            sig.bind(object(), "")
        except TypeError as e:
            raise TypeError(
                f"RewardPool: reward {name!r} has signature {sig} and cannot be called as "
                f"fn(prompt, completion) ({e}); {EXPECTED}"
            ) from None
    if is_async(fn):
        raise TypeError(
            f"RewardPool: reward {name!r} is an async per-row function; async rewards are TRL-style: "
            "async def fn(prompts, completions, **kwargs) -> list[float] (one call per batch)"
        )
    return fn


def record_columns(prompt: Any) -> dict[str, Any]:
    """A record's dataset columns as TRL passes them: ``answer``, ``domain``, ``uid`` and every other column
    (``metadata``), the answer also under its original column name (``PromptDataModule(answer_key=...)``)."""
    if isinstance(prompt, dict):
        return dict(prompt)
    cols: dict[str, Any] = {k: getattr(prompt, k) for k in ("answer", "domain", "uid") if hasattr(prompt, k)}
    cols.update(getattr(prompt, "metadata", None) or {})
    return cols


@dataclass
class BatchScores:
    """What one TRL-style call returns to ``RewardPool``: the scores and what the function logged. A plain
    dataclass so it crosses the pipe of a process worker (the log calls happen in that process)."""

    scores: list
    extra: dict[str, list] = field(default_factory=dict)  # log_extra: column -> one value per row
    metrics: dict[str, list[float]] = field(default_factory=dict)  # log_metric: name -> values of this call


class RewardLog:
    """``log_extra`` / ``log_metric`` of one call (TRL's semantics): ``log_extra(column, values)`` adds a column
    with one value per completion to the rollout records; ``log_metric(name, value)`` adds a scalar, averaged
    over the calls of one step. A wrong call raises, so it fails that reward's call with a clear message."""

    def __init__(self, rows: int):
        self.rows = rows
        self.extra: dict[str, list] = {}  # column -> one value per completion
        self.metrics: dict[str, list[float]] = {}  # name -> the values of this call

    def log_extra(self, column: str, values: list) -> None:
        if not isinstance(column, str) or not column:
            raise TypeError(f"log_extra: column must be a non-empty str, got {column!r}")
        values = list(values)
        if len(values) != self.rows:
            raise ValueError(
                f"log_extra({column!r}): {len(values)} values for {self.rows} completions; "
                "give one value per completion"
            )
        self.extra[column] = values

    def log_metric(self, name: str, value: float) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"log_metric: name must be a non-empty str, got {name!r}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"log_metric({name!r}): value {value!r} is not a finite number")
        self.metrics.setdefault(name, []).append(v)


class TRLRewardAdapter:
    """A TRL-style batched reward function, called once per batch (see module doc). ``batched`` tells
    ``RewardPool`` to call it with the whole batch; it returns a ``BatchScores`` with one score (or ``None``)
    per row. ``is_async``: ``RewardPool`` awaits ``acall`` instead of calling it."""

    batched = True

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn, self.name = fn, name or getattr(fn, "__name__", type(fn).__name__)
        sig = _signature(fn)
        params = list(sig.parameters.values()) if sig is not None else []
        positional = [
            p.name
            for p in params
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty
        ]
        if positional:  # TRL passes everything by keyword
            raise TypeError(
                f"RewardPool: reward {self.name!r} has positional-only parameters {positional}; a "
                "TRL-style reward is called with keyword arguments only"
            )
        self._takes_any = sig is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._names = {p.name for p in params}
        self.required = [
            p.name
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        self.is_async = is_async(fn)
        # class attributes of the wrapped function (e.g. executor = "process") carry over
        self.executor = getattr(fn, "executor", None)

    def check_columns(self, columns: set[str]) -> None:
        """Refuse a required parameter that no call would receive (``columns``: the data's column names)."""
        available = set(ALWAYS) | set(columns)
        missing = [n for n in self.required if n not in available]
        if missing:
            raise ValueError(
                f"reward {self.name!r}: required parameter {missing[0]!r} is neither passed by the "
                f"trainer nor a column of the data; available: {', '.join(sorted(available))}"
            )

    def _kwargs(
        self,
        prompts: list,
        completions: list[str],
        completion_ids: list | None,
        trainer_state: TrainerState | None,
        log: RewardLog,
    ) -> dict[str, Any]:
        ps: list[Any] = []  # prompt texts, or message lists
        cs: list[Any] = []  # completion texts, or assistant message lists
        for prompt, completion in zip(prompts, completions):
            messages = getattr(prompt, "messages", None)
            if messages is not None:  # conversational: TRL passes message lists
                ps.append(messages)
                cs.append([{"role": "assistant", "content": completion}])
            else:
                ps.append(getattr(prompt, "prompt", prompt))
                cs.append(completion)
        rows = [record_columns(p) for p in prompts]
        names = list(
            dict.fromkeys(k for r in rows for k in r)
        )  # a row without a column gets None (as datasets)
        kw: dict[str, Any] = {k: [r.get(k) for r in rows] for k in names}
        kw.update(
            prompts=ps,
            completions=cs,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
            log_extra=log.log_extra,
            log_metric=log.log_metric,
        )
        if kw["completion_ids"] is None:
            kw.pop("completion_ids")
        if not self._takes_any:  # pass only what the function names; TRL functions usually take **kwargs
            kw = {k: v for k, v in kw.items() if k in self._names}
        return kw

    def _result(self, out: Any, rows: int, log: RewardLog) -> BatchScores:
        if isinstance(out, (str, bytes)) or not (hasattr(out, "__len__") and hasattr(out, "__getitem__")):
            raise TypeError(
                f"TRL-style reward returned {type(out).__name__}; expected a list with one score (or "
                "None) per completion"
            )
        if len(out) != rows:
            raise TypeError(f"TRL-style reward returned {len(out)} scores for {rows} completions")
        return BatchScores(list(out), log.extra, log.metrics)

    def __call__(
        self,
        prompts: list,
        completions: list[str],
        completion_ids: list | None = None,
        trainer_state: TrainerState | None = None,
    ) -> BatchScores:
        log = RewardLog(len(completions))
        out = self.fn(**self._kwargs(prompts, completions, completion_ids, trainer_state, log))
        if inspect.isawaitable(out):  # a sync wrapper around a coroutine: this worker thread has no loop
            out = asyncio.run(_await(out))
        return self._result(out, len(completions), log)

    async def acall(
        self,
        prompts: list,
        completions: list[str],
        completion_ids: list | None = None,
        trainer_state: TrainerState | None = None,
    ) -> BatchScores:
        log = RewardLog(len(completions))
        out = await self.fn(**self._kwargs(prompts, completions, completion_ids, trainer_state, log))
        return self._result(out, len(completions), log)


async def _await(awaitable):
    return await awaitable
