"""Where a reward's warning points: the failing reward's own ``def`` line (a user reading the warning wants
their function, not lit_rl's call site). Split from ``pool.py``, which calls it."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

from lit_rl.rewards.adapters import TRLRewardAdapter


def _reward_code(fn: Callable | None) -> Any:
    """The code object of a reward's own definition: a TRL-style reward's function (not its adapter), through
    ``functools.wraps`` decorators and partials, or a reward object's ``__call__``; None when it has none."""
    target: Any = fn.fn if isinstance(fn, TRLRewardAdapter) else fn
    for _ in range(10):  # unwrap a bounded chain of decorators / partials
        if isinstance(target, functools.partial):
            target = target.func
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        else:
            break
    code = getattr(target, "__code__", None)
    if code is None and callable(target):
        code = getattr(type(target).__call__, "__code__", None)
    return code


def warn_at_reward(message: str, fn: Callable | None, category: type[Warning], caller: str) -> None:
    """Warn with the location of the failing reward's definition, so the printed warning shows the user's
    ``def`` line; lit_rl's own call site (the rollout scorer) would say nothing about the cause. Without a
    reward to point at (every reward returned None), a location with no source line: ``<RewardPool>:0``, in the
    module ``caller`` (the pool's own ``__name__``)."""
    code = _reward_code(fn)
    target = fn.fn if isinstance(fn, TRLRewardAdapter) else fn
    module = getattr(target, "__module__", None) or getattr(type(target), "__module__", None) or caller
    if code is None:
        warnings.warn_explicit(message, category, "<RewardPool>", 0, module=module)
        return
    globs = getattr(sys.modules.get(module), "__dict__", None)  # lets linecache read the source of any loader
    warnings.warn_explicit(
        message,
        category,
        code.co_filename,
        code.co_firstlineno,
        module=module,
        module_globals=globs,
    )
