"""``lit-rl explain-trl`` for agent runs (an ``AgentRolloutCallback`` in ``trainer.callbacks``): its rollout
settings are read where the agent recipe writes them, and the tool settings are compared with TRL's
``GRPOTrainer(tools=..., environment_factory=...)`` and ``max_tool_calling_iterations``.

TRL's side (1.16, ``GRPOTrainer._tool_call_loop``): no limit on rounds of tool calls unless
``max_tool_calling_iterations`` is set; ``max_completion_length`` bounds an episode's whole completion (every
turn and tool result), and a tool result that would pass it ends the episode; a malformed ``<tool_call>`` is
parsed as plain text, which ends the episode without telling the model.
"""

from __future__ import annotations

from typing import Any

AGENT_CALLBACK = "AgentRolloutCallback"
HF_ENGINE = "lit_rl.rollout.engine.HFEngine"


def _agent_args(cfg: dict) -> dict | None:
    for cb in (cfg.get("trainer") or {}).get("callbacks") or []:
        if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("." + AGENT_CALLBACK):
            return cb.get("init_args") or {}
    return None


def with_agent_rollout(cfg: dict) -> dict:
    """``cfg`` with the agent callback's rollout settings (group size, sampling, ...) and its loop's engine as its
    ``rollout`` section (where explain-trl reads them); unchanged without an agent callback."""
    args = _agent_args(cfg)
    if args is None:
        return cfg
    loop = ((args.get("agent") or {}).get("init_args")) or {}
    rollout = {k: v for k, v in args.items() if k != "agent"}  # the flat rollout settings
    rollout["engine"] = loop.get("engine") or {"class_path": HF_ENGINE}
    return {**cfg, "rollout": rollout}


def agent_lines(cfg: dict, version: str) -> list[str]:
    """The agent settings whose TRL counterpart differs (an empty list without an agent callback)."""
    args = _agent_args(cfg)
    if args is None:
        return []
    loop = ((args.get("agent") or {}).get("init_args")) or {}
    env = loop.get("env_factory")
    env_args: dict[str, Any] = (env.get("init_args") or {}) if isinstance(env, dict) else {}
    pre = f"trainer.callbacks[{AGENT_CALLBACK}].init_args.agent.init_args"
    lines = []
    if "max_tool_calling_iterations" in env_args and env_args["max_tool_calling_iterations"] is not None:
        lines.append(
            f"{pre}.env_factory.init_args.max_tool_calling_iterations: {env_args['max_tool_calling_iterations']!r} "
            f"here, None under TRL {version}'s max_tool_calling_iterations=None (no limit on rounds of calls)"
        )
    turns = loop.get("max_turns", 4)
    lines.append(
        f"{pre}.max_turns: {turns!r} here (generations per episode), no such limit under TRL {version} "
        "(max_tool_calling_iterations + 1 generations)"
    )
    budget = (args.get("sampling") or {}).get("max_new_tokens")
    lines.append(
        f"{pre}: each action's budget is sampling.max_new_tokens={budget!r} and an episode's context "
        f"max_context_tokens={loop.get('max_context_tokens', 2048)!r}, observations cut at "
        f"max_obs_tokens={loop.get('max_obs_tokens', 256)!r}; under TRL {version} max_completion_length=512 "
        "bounds the whole episode (turns and tool results)"
    )
    lines.append(
        f"tool calls: a malformed <tool_call> is an error observation here (counted in tools/errors/malformed); "
        f"under TRL {version} it is read as plain text and ends the episode"
    )
    return lines
