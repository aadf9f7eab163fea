"""Recognise the shape of a user's reward function at setup, adapt TRL-style ones, reject the rest.

Two shapes are accepted:

- per row (lit_rl's own): ``fn(prompt, completion) -> float | RewardResult``, called once per completion;
- TRL-style batched: ``fn(prompts, completions, **columns) -> list[float]`` (any function with a parameter
  named ``completions``). ``TRLRewardAdapter`` calls it with one-element lists per row, so the pool's per-call
  timeout and error masking apply row by row. ``prompts`` / ``completions`` are strings for text prompts and
  message lists for chat prompts (``[{"role": "assistant", "content": ...}]``), as TRL passes them; the
  columns are ``answer``, ``domain``, ``uid`` and every ``metadata`` key of the record (TRL passes the
  dataset's other columns the same way). A ``None`` score (TRL: "this reward does not apply") is reported
  as an error, not silently dropped.

Anything else (a function of one argument, three required arguments, ...) is refused when the pool is built,
with both expected signatures in the message -- before any generation, never a run of 100 % infra errors.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from lit_rl.rewards.base import RewardResult

EXPECTED = ("a reward is fn(prompt, completion) -> float | RewardResult (one call per completion), or TRL-style "
            "fn(prompts, completions, **columns) -> list[float]")


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
        return TRLRewardAdapter(fn)
    sig = _signature(fn)
    if sig is not None:
        try:
            sig.bind(object(), "")
        except TypeError as e:
            raise TypeError(f"RewardPool: reward {name!r} has signature {sig} and cannot be called as "
                            f"fn(prompt, completion) ({e}); {EXPECTED}") from None
    return fn


class TRLRewardAdapter:
    """Per-row wrapper of a TRL-style batched reward function (see module doc)."""

    def __init__(self, fn: Callable):
        self.fn = fn
        sig = _signature(fn)
        params = sig.parameters.values() if sig is not None else []
        self._takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._names = {p.name for p in params}
        # class attributes of the wrapped function (e.g. executor = "process") carry over
        self.executor = getattr(fn, "executor", None)

    def _columns(self, prompt: Any) -> dict[str, list]:
        cols: dict[str, Any] = {}
        for key in ("answer", "domain", "uid"):
            if hasattr(prompt, key):
                cols[key] = getattr(prompt, key)
        cols.update(getattr(prompt, "metadata", None) or (prompt if isinstance(prompt, dict) else {}))
        return {k: [v] for k, v in cols.items()}

    def __call__(self, prompt: Any, completion: str) -> float | RewardResult:
        messages = getattr(prompt, "messages", None)
        if messages is not None:  # conversational: TRL passes message lists
            p, c = messages, [{"role": "assistant", "content": completion}]
        else:
            p, c = getattr(prompt, "prompt", prompt), completion
        kw = {**self._columns(prompt), "prompts": [p], "completions": [c]}
        if not self._takes_any:  # pass only what the function names; TRL functions usually take **kwargs
            kw = {k: v for k, v in kw.items() if k in self._names}
        out = self.fn(**kw)
        if not isinstance(out, (list, tuple)) and not (hasattr(out, "__len__") and hasattr(out, "__getitem__")):
            raise TypeError(f"TRL-style reward returned {type(out).__name__}; expected a list with one score per "
                            "completion")
        if len(out) != 1:
            raise TypeError(f"TRL-style reward returned {len(out)} scores for 1 completion")
        if out[0] is None:
            return RewardResult(0.0, ok=False, error="TRL-style reward returned None (not applicable to this row)")
        return out[0]
