"""Recognise the shape of a user's reward function at setup, adapt TRL-style ones, reject the rest.

Two shapes are accepted:

- per row (lit_rl's own): ``fn(prompt, completion) -> float | RewardResult | None``, called once per completion;
- TRL-style batched: ``fn(prompts, completions, **kwargs) -> list[float | None]`` (any function with a
  parameter named ``completions``), called **once per scoring call with the whole batch**, as TRL's
  GRPOTrainer calls it (reward models and batched verifiers depend on it). It receives what TRL passes:
  ``prompts`` / ``completions`` (strings for text prompts; message lists for chat prompts, the completion as
  ``[{"role": "assistant", "content": ...}]``), ``completion_ids`` (token ids), every dataset column under its
  original name (``answer`` and the column ``answer_key`` named, ``domain``, ``uid``, every other column;
  a row without a column gets ``None``) and ``trainer_state`` (``TrainerState``: ``global_step``, ``epoch``).
  A function without ``**kwargs`` gets only the parameters it names.

A ``None`` score (either shape) means "this reward does not apply to this row", as in TRL: it is skipped in the
weighted sum; a row no reward applies to has no reward (masked and counted, never scored 0).

Anything else (a function of one argument, three required arguments, ...) is refused when the pool is built,
with both expected signatures in the message; a TRL-style function with a required parameter the data does not
have is refused at setup (``check_columns``) -- before any generation, never a run of 100 % infra errors.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from lit_rl.rewards.base import TrainerState

EXPECTED = ("a reward is fn(prompt, completion) -> float | RewardResult (one call per completion), or TRL-style "
            "fn(prompts, completions, **kwargs) -> list[float] (one call per batch)")
# What every TRL-style call can receive besides the dataset's columns.
ALWAYS = ("prompts", "completions", "completion_ids", "trainer_state")


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return None


def is_trl_style(fn: Callable) -> bool:
    sig = _signature(fn)
    return sig is not None and "completions" in sig.parameters


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
            raise TypeError(f"RewardPool: reward {name!r} has signature {sig} and cannot be called as "
                            f"fn(prompt, completion) ({e}); {EXPECTED}") from None
    return fn


def record_columns(prompt: Any) -> dict[str, Any]:
    """A record's dataset columns as TRL passes them: ``answer``, ``domain``, ``uid`` and every other column
    (``metadata``), the answer also under its original column name (``PromptDataModule(answer_key=...)``)."""
    if isinstance(prompt, dict):
        return dict(prompt)
    cols: dict[str, Any] = {k: getattr(prompt, k) for k in ("answer", "domain", "uid") if hasattr(prompt, k)}
    cols.update(getattr(prompt, "metadata", None) or {})
    return cols


class TRLRewardAdapter:
    """A TRL-style batched reward function, called once per batch (see module doc). ``batched`` tells
    ``RewardPool`` to call it with the whole batch and expect one score (or ``None``) per row back."""

    batched = True

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn, self.name = fn, name or getattr(fn, "__name__", type(fn).__name__)
        sig = _signature(fn)
        params = list(sig.parameters.values()) if sig is not None else []
        self._takes_any = sig is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._names = {p.name for p in params}
        self.required = [p.name for p in params if p.default is inspect.Parameter.empty
                         and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        # class attributes of the wrapped function (e.g. executor = "process") carry over
        self.executor = getattr(fn, "executor", None)

    def check_columns(self, columns: set[str]) -> None:
        """Refuse a required parameter that no call would receive (``columns``: the data's column names)."""
        available = set(ALWAYS) | set(columns)
        missing = [n for n in self.required if n not in available]
        if missing:
            raise ValueError(f"reward {self.name!r}: required parameter {missing[0]!r} is neither passed by the "
                             f"trainer nor a column of the data; available: {', '.join(sorted(available))}")

    def __call__(self, prompts: list, completions: list[str], completion_ids: list | None = None,
                 trainer_state: TrainerState | None = None) -> list:
        ps, cs = [], []
        for prompt, completion in zip(prompts, completions):
            messages = getattr(prompt, "messages", None)
            if messages is not None:  # conversational: TRL passes message lists
                ps.append(messages)
                cs.append([{"role": "assistant", "content": completion}])
            else:
                ps.append(getattr(prompt, "prompt", prompt))
                cs.append(completion)
        rows = [record_columns(p) for p in prompts]
        names = list(dict.fromkeys(k for r in rows for k in r))  # a row without a column gets None (as datasets)
        kw: dict[str, Any] = {k: [r.get(k) for r in rows] for k in names}
        kw.update(prompts=ps, completions=cs, completion_ids=completion_ids, trainer_state=trainer_state)
        if kw["completion_ids"] is None:
            kw.pop("completion_ids")
        if not self._takes_any:  # pass only what the function names; TRL functions usually take **kwargs
            kw = {k: v for k, v in kw.items() if k in self._names}
        out = self.fn(**kw)
        if isinstance(out, (str, bytes)) or not (hasattr(out, "__len__") and hasattr(out, "__getitem__")):
            raise TypeError(f"TRL-style reward returned {type(out).__name__}; expected a list with one score (or "
                            "None) per completion")
        if len(out) != len(completions):
            raise TypeError(f"TRL-style reward returned {len(out)} scores for {len(completions)} completions")
        return list(out)
