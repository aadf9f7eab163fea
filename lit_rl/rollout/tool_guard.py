r"""Reward-hacking guard for tool environments: ``ToolGuard`` and the ``ToolEnv`` that takes one, ``GuardedToolEnv``.

``RepoGuard`` (``repo_guard.py``) protects repositories edited with plain-text commands; ``ToolGuard`` does the
same job for ``ToolEnv`` episodes, whose actions are tool calls. It is told what a shortcut looks like as
``ToolRule`` s -- a tool, optionally one of its arguments and a regular expression its value must match, and the
hack kind to report -- e.g. ``ToolRule("read_file", "answer_read", argument="path", pattern=r"(^|/)answer\.txt$")``
for an answer key left in the workspace (``hack_envs.LeakyCalculatorEnv``).

Per episode (``GuardedToolEnv`` drives it):

* ``reset()`` forgets what the last episode did;
* ``check(call, result)`` is shown every call that was run (after the tool ran: the guard sees what the model
  saw) and returns the kinds it matches. A call that failed (``result.error`` set: unknown file, bad arguments,
  ...) leaked nothing and matches no rule; a call the episode did not run (the reply after the last round of
  calls) is never shown;
* ``flag(kinds)`` is the step's info: ``{"hack_detected": 1.0, "hack/<kind>": 1.0}`` for kinds seen for the first
  time in the episode (``agent_loop.EnvRewards`` counts episodes with any as ``reward/hack_detected``);
* ``settle(reward)`` is the episode's paid reward: in ``mode="enforce"`` 0.0 once any rule matched, in
  ``mode="monitor"`` the reward unchanged (detection only: the hack rate of an undefended run, measured).

``GuardedToolEnv`` is a ``ToolEnv`` with ``guard=``: every executed call goes through ``check``, the step's info
carries ``flag``, and the final reward is ``settle``'d (``info["success"]`` follows the paid reward, and
``info["hack_paid_zero"]`` is 1.0 when enforcement took a non-zero reward away).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lit_rl.rollout.tool_env import ToolEnv
from lit_rl.rollout.tools import Tool, ToolCall, ToolResult

GUARD_MODES = ("monitor", "enforce")


@dataclass(frozen=True)
class ToolRule:
    """A call that counts as the hack ``kind``: a call of ``tool`` (any arguments when ``argument`` is None),
    whose ``argument`` value, as a string with surrounding space stripped, matches ``pattern`` (``re.search``;
    None: any value of that argument)."""

    tool: str
    kind: str
    argument: str | None = None
    pattern: str | None = None
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tool or not self.kind:
            raise ValueError(f"ToolRule needs a tool and a kind, got tool={self.tool!r} kind={self.kind!r}")
        if self.pattern is not None and self.argument is None:
            raise ValueError(
                f"ToolRule({self.tool!r}): pattern={self.pattern!r} needs the argument it matches"
            )
        if self.pattern is not None:
            object.__setattr__(self, "_regex", re.compile(self.pattern))

    def matches(self, call: ToolCall) -> bool:
        if call.name != self.tool:
            return False
        if self.argument is None:
            return True
        args = call.arguments or {}
        if self.argument not in args:
            return False
        return self._regex is None or bool(self._regex.search(str(args[self.argument]).strip()))


class ToolGuard:
    """Per-episode detection of shortcut tool calls and, in ``mode="enforce"``, a zero payment (module doc).

    Args:
        rules: the ``ToolRule`` s (at least one).
        mode: ``"enforce"`` (a detected episode is paid 0) or ``"monitor"`` (detected and counted, paid as is).
    """

    def __init__(self, rules: Iterable[ToolRule], mode: str = "enforce"):
        self.rules = tuple(rules)
        if not self.rules or not all(isinstance(r, ToolRule) for r in self.rules):
            raise ValueError(f"ToolGuard needs at least one ToolRule, got {self.rules!r}")
        if mode not in GUARD_MODES:
            raise ValueError(f"ToolGuard mode={mode!r}; valid values: {', '.join(GUARD_MODES)}")
        self.mode = mode
        self.seen: set[str] = set()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.kind for r in self.rules))

    def reset(self) -> None:
        self.seen = set()

    def check(self, call: ToolCall, result: ToolResult) -> set[str]:
        """The kinds this executed call matches (none when the call failed: nothing leaked)."""
        if result.error is not None:
            return set()
        return {r.kind for r in self.rules if r.matches(call)}

    def flag(self, kinds: set[str]) -> dict[str, float]:
        """Info for this step: the kinds seen for the first time in the episode."""
        unknown = kinds - set(self.kinds)
        if unknown:
            raise ValueError(f"unknown hack kinds {sorted(unknown)}; this guard's: {', '.join(self.kinds)}")
        new = kinds - self.seen
        self.seen |= new
        return {"hack_detected": 1.0, **{f"hack/{k}": 1.0 for k in sorted(new)}} if new else {}

    @property
    def hacked(self) -> bool:
        return bool(self.seen)

    def settle(self, reward: float) -> float:
        """The paid reward: 0.0 for a detected episode under ``enforce``, else ``reward``."""
        return 0.0 if self.mode == "enforce" and self.hacked else reward


class GuardedToolEnv(ToolEnv):
    """A ``ToolEnv`` whose executed calls a ``ToolGuard`` checks and whose reward it settles (module doc).

    Args:
        guard: the ``ToolGuard`` (None: a plain ``ToolEnv``).
        tools, environment_factory, reward, ...: ``ToolEnv``'s.
    """

    def __init__(
        self,
        tools: Iterable[Callable[..., Any] | Tool] = (),
        guard: ToolGuard | None = None,
        **tool_env_args: Any,
    ):
        super().__init__(tools, **tool_env_args)
        if guard is not None and not isinstance(guard, ToolGuard):
            raise TypeError(f"guard must be a ToolGuard or None, got {type(guard).__name__}")
        self.guard = guard
        self._step_kinds: set[str] = set()
        run = self.box.execute

        def execute(call: ToolCall) -> ToolResult:  # the only place a call runs: the guard sees each one
            result = run(call)
            if self.guard is not None:
                self._step_kinds |= self.guard.check(call, result)
            return result

        self.box.execute = execute  # type: ignore[method-assign]  # this instance's calls go through the guard

    def reset(self, prompt: Any = None) -> list[dict[str, Any]]:
        if self.guard is not None:
            self.guard.reset()
        return super().reset(prompt)

    def step(self, action_text: str) -> tuple[str | list[dict[str, Any]], float, bool, dict[str, float]]:
        self._step_kinds = set()
        obs, reward, done, info = super().step(action_text)
        if self.guard is None:
            return obs, reward, done, info
        info = {**info, **self.guard.flag(self._step_kinds)}
        if done:
            paid = self.guard.settle(reward)
            if paid != reward:
                info["hack_paid_zero"] = 1.0
                info["success"] = float(paid >= self.success_at)
            reward = paid
        return obs, reward, done, info
