"""``ToolEnv``: an ``Environment`` whose actions are tool calls, with the semantics of TRL's ``GRPOTrainer(tools=...,
environment_factory=..., max_tool_calling_iterations=...)``, so a TRL agent script's tools and environment
classes are used unchanged.

An episode (``AgentLoop`` builds one ``ToolEnv`` per episode from its ``env_factory``):

1. ``reset(prompt)``: a fresh ``environment_factory()`` instance (when given) is reset with the prompt record's
   columns as keyword arguments (``prompt``, ``answer`` when set, and every other column from ``metadata``: TRL
   passes the dataset row); a string it returns is appended to the task's last user message (the whole task when
   the prompt is empty: an environment that owns its data). The opening conversation is ``system`` (when given),
   the ``demonstration`` messages (e.g. user, assistant with ``tool_calls``, tool result, assistant answer), then
   the task. The tools are the ``tools`` functions plus the environment's public methods other than ``reset`` and
   ``get_reward`` (TRL's rule); their schemas reach the prompt through ``ChatRenderer`` (the template's
   ``tools=``, or the system-prompt fallback).
2. ``step(action_text)``: the action's ``<tool_call>`` blocks are run in order (``tools.ToolBox``: a malformed
   call, an unknown tool, bad arguments or a raising tool is an error result the model reads, and counted); the
   results are the next observation, ``tool`` messages. A reply without a call ends the episode, and so does the
   reply after ``max_tool_calling_iterations`` rounds of calls (its calls are not run; None = no limit, as in TRL;
   ``AgentLoop.max_turns`` still bounds the episode). A lit_rl addition: an environment whose ``done``
   attribute is True after a round of calls ends the episode there (a game won or lost), its results shown.
3. At the end the reward is ``reward(prompt, final_reply)`` (a lit_rl reward function, e.g. ``LastIntReward``)
   plus the environment's ``get_reward()`` when it has one (TRL sums its sources the same way). A reward that
   could not judge (``RewardResult(ok=False)``) or a ``get_reward`` that raises marks the episode an
   infrastructure error (masked and counted, never scored 0).

Per step ``info``: ``tool_calls`` and ``tool_errors/<kind>`` counts (``tools.ERROR_KINDS``), summed into the
``tools/*`` metrics by ``agent_loop.EnvRewards``; at the end ``success`` (1.0 when the reward is at least
``success_at``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from lit_rl.rollout.tools import ERROR_KINDS, Tool, ToolBox, parse_tool_calls, run_awaitable

_RESERVED = ("reset", "get_reward")


def environment_tools(env: Any) -> list[Callable[..., Any]]:
    """The public methods of an environment instance other than ``reset`` / ``get_reward`` (TRL's rule)."""
    return [
        m
        for name, m in inspect.getmembers(env, predicate=inspect.ismethod)
        if name not in _RESERVED and not name.startswith("_")
    ]


def prompt_columns(prompt: Any) -> dict[str, Any]:
    """A prompt record as the keyword arguments TRL gives ``reset``: the dataset row's columns."""
    if prompt is None:
        return {}
    if isinstance(prompt, str):
        return {"prompt": prompt}
    cols: dict[str, Any] = {"prompt": prompt.messages if prompt.messages is not None else prompt.prompt}
    if prompt.answer is not None:
        cols["answer"] = prompt.answer
    return {**cols, **{k: v for k, v in (prompt.metadata or {}).items() if k not in cols}}


def task_messages(prompt: Any) -> list[dict[str, Any]]:
    if prompt is None:
        return [{"role": "user", "content": ""}]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if prompt.messages is not None:
        return [dict(m) for m in prompt.messages]
    return [{"role": "user", "content": prompt.prompt or ""}]


class ToolEnv:
    """An environment driven by tool calls (module doc).

    Args:
        tools: functions (or ``Tool``) the model may call; TRL's ``tools``.
        environment_factory: builds the per-episode environment (``reset(**columns)``, optional ``get_reward()``,
            public methods as tools); TRL's ``environment_factory``.
        reward: ``fn(prompt, final_reply) -> float | RewardResult`` scoring the episode's last reply.
        max_tool_calling_iterations: rounds of tool calls at most (None: no limit); TRL's setting.
        system: the system message's text (None: none; the template's default, if it has one, applies).
        demonstration: messages placed before the task (a worked exchange the model can imitate).
        success_at: the reward from which an episode counts as a success (``info["success"]``).
        remind: a lit_rl addition for games: when set, a reply without a call does not end the episode while
            rounds remain; this user message answers it (and the reply counts as a round). None: TRL's rule.
    """

    def __init__(
        self,
        tools: Iterable[Callable[..., Any] | Tool] = (),
        environment_factory: Callable[[], Any] | None = None,
        reward: Callable[[Any, str], Any] | None = None,
        max_tool_calling_iterations: int | None = None,
        system: str | None = None,
        demonstration: list[dict[str, Any]] | None = None,
        success_at: float = 1.0,
        remind: str | None = None,
    ):
        if max_tool_calling_iterations is not None and max_tool_calling_iterations < 0:
            raise ValueError(
                f"max_tool_calling_iterations must be >= 0 or None, got {max_tool_calling_iterations}"
            )
        self.env = environment_factory() if environment_factory is not None else None
        if self.env is not None and not callable(getattr(self.env, "reset", None)):
            raise ValueError(
                "the environment built by environment_factory must define a callable reset (TRL's contract)"
            )
        has_env_reward = self.env is not None and callable(getattr(self.env, "get_reward", None))
        if reward is None and not has_env_reward:
            raise ValueError(
                "ToolEnv has no reward source: pass reward=fn(prompt, final_reply), or an environment_factory "
                "whose environment defines get_reward()"
            )
        self.box = ToolBox([*tools, *(environment_tools(self.env) if self.env is not None else [])])
        self.reward_fn, self.max_iter, self.success_at = reward, max_tool_calling_iterations, success_at
        self.remind = remind
        self.system, self.demonstration = system, [dict(m) for m in demonstration or []]
        self.prompt: Any = None
        self.rounds, self.done = 0, True

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.box.schemas

    def reset(self, prompt: Any = None) -> list[dict[str, Any]]:
        self.prompt, self.rounds, self.done = prompt, 0, False
        task = task_messages(prompt)
        if self.env is not None:
            obs = self.env.reset(**prompt_columns(prompt))
            if isinstance(obs, str):
                last = task[-1]
                task[-1] = {**last, "content": last["content"] + obs}
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + [dict(m) for m in self.demonstration] + task

    def step(self, action_text: str) -> tuple[str | list[dict[str, Any]], float, bool, dict[str, float]]:
        if self.done:
            raise RuntimeError("ToolEnv.step after the episode ended; call reset() first")
        calls = parse_tool_calls(action_text)
        last = self.max_iter is not None and self.rounds >= self.max_iter
        if not calls and self.remind is not None and not last:  # a game goes on: the reply was no move
            self.rounds += 1
            return self.remind, 0.0, False, {"tool_calls": 0.0, "reminders": 1.0}
        if not calls or last:
            return self._finish(action_text)
        self.rounds += 1
        results = [self.box.execute(c) for c in calls]
        info = {"tool_calls": float(len(calls))}
        for kind in ERROR_KINDS:
            n = sum(r.error == kind for r in results)
            if n:
                info[f"tool_errors/{kind}"] = float(n)
        messages = [r.message() for r in results]
        if self.env is not None and getattr(self.env, "done", False) is True:  # the environment ended it
            return self._finish(action_text, messages, info)
        return messages, 0.0, False, info

    def _finish(
        self, reply: str, obs: list[dict[str, Any]] | None = None, info: dict[str, float] | None = None
    ) -> tuple[list[dict[str, Any]], float, bool, dict[str, float]]:
        self.done = True
        total, info = 0.0, dict(info or {})
        try:
            if self.reward_fn is not None:
                r = self.reward_fn(self.prompt, reply)
                r = run_awaitable(r) if inspect.isawaitable(r) else r
                if getattr(r, "ok", True) is False:
                    info["infra_error"] = 1.0
                total += float(getattr(r, "score", r))
            if self.env is not None and callable(getattr(self.env, "get_reward", None)):
                r = self.env.get_reward()  # sync or async, as in TRL
                total += float(run_awaitable(r) if inspect.isawaitable(r) else r)
        except Exception:  # noqa: BLE001 - a reward that cannot judge is an infrastructure error, not a 0
            info["infra_error"] = 1.0
        info.setdefault("tool_calls", 0.0)  # a tool episode's metrics are logged even when no call was made
        info["success"] = float(total >= self.success_at)
        return list(obs or []), total, True, info
