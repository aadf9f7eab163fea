"""One agent episode as the loops record it: its turns' sampled action tokens (with the log-probs and the policy
version of the weights that sampled each), the observation tokens as the engine saw them, and how it ended.

Shared by the schedules (``agent_async``: lock-step and asynchronous) and the loop that builds rows from them
(``agent_loop``); a module of its own so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    action_ids: list[int]
    action_logprobs: list[float]
    action_text: str
    obs_ids: list[int]
    obs_text: str
    reward: float
    info: dict[str, float] = field(default_factory=dict)
    # the policy version of the weights that sampled each action token (aligned with action_ids); None = not
    # recorded (a Turn built by hand): the engine's version when the rows are built
    action_versions: list[int] | None = None


@dataclass
class Episode:
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    done: bool = False  # the environment ended it (False: stopped by max_turns / max_context_tokens)
    # how it ended: "done", "max_turns", "max_context", or a fault that masks it ("timed_out", "env_error",
    # "over_budget", "cut": agent_async.py); "" while running
    status: str = ""
    error: str | None = None  # why a faulted episode is masked (the inspector's reward_errors)

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    @property
    def infra_error(self) -> bool:
        """Masked from the loss: the environment reported an infrastructure error, or the episode faulted."""
        return self.error is not None or any(t.info.get("infra_error", 0.0) for t in self.turns)


def as_messages(obs: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": obs}] if isinstance(obs, str) else list(obs)


def as_text(obs: str | list[dict[str, Any]]) -> str:
    """An observation as text (the ``Turn.obs_text`` the inspector shows; the raw-text renderer's input)."""
    if isinstance(obs, str):
        return obs
    return "\n".join(str(m.get("content", "")) for m in obs)
