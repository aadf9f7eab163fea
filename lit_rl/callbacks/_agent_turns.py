"""Per-turn records of an episode row for the ``RolloutInspector`` (``row["turns"]``).

An episode row's completion alternates action tokens (``loss_mask``) and observation tokens
(``extras["obs_mask"]``, ``rollout/agent_loop.py``). Each turn is one run of action tokens and the observation
run after it: its ``action`` text and the ``observation`` text as the engine wrote and read them (special
tokens included: the end of turn, the template's markers), the ``tool_calls`` parsed from the action (name and
arguments, or the parse error), its ``reward`` (r_k on the action's last token: ``token_rewards``, the row's reward
for the last action) and its ``advantage`` (mean over the action's tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from lit_rl.data.experience import Experience
from lit_rl.rollout.tools import parse_tool_calls


def _runs(kinds: list[str]) -> list[tuple[str, int, int]]:
    """Maximal runs of equal kinds: (kind, start, end)."""
    out: list[tuple[str, int, int]] = []
    for t, k in enumerate(kinds):
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1], t + 1)
        else:
            out.append((k, t, t + 1))
    return out


def turn_records(exp: Experience, i: int, tokenizer=None, max_text_chars: int = 4000) -> list[dict[str, Any]]:
    """The turns of row ``i`` (module doc); texts are None without a tokenizer. Shapes read: ``loss_mask``,
    ``extras["obs_mask"]``, ``completion_ids``, ``token_rewards``, ``advantages`` (B, C)."""
    obs = exp.extras["obs_mask"][i]
    act = exp.loss_mask[i]
    kinds = ["a" if bool(a) else "o" if bool(o) else "." for a, o in zip(act.tolist(), obs.tolist())]
    ids = exp.completion_ids[i].tolist()
    runs = [r for r in _runs(kinds) if r[0] != "."]
    turns: list[dict[str, Any]] = []
    last_action = max((k for k, r in enumerate(runs) if r[0] == "a"), default=-1)

    def text(s: int, e: int) -> str | None:
        return (
            None
            if tokenizer is None
            else tokenizer.decode(ids[s:e], skip_special_tokens=False)[:max_text_chars]
        )

    for k, (kind, s, e) in enumerate(runs):
        if kind == "o":
            if turns:  # the observation after an action (one run each)
                turns[-1]["observation"] = text(s, e)
            continue
        reward = float(exp.token_rewards[i, e - 1]) if exp.token_rewards is not None else 0.0
        if k == last_action and bool(exp.valid[i]):
            reward += float(exp.rewards[i])
        adv = None
        if exp.advantages is not None:
            adv = float(exp.advantages[i, s:e].double().mean())
        action = text(s, e)
        calls = None if action is None else [_call(c) for c in parse_tool_calls(action)]
        turns.append(
            {
                "turn": len(turns) + 1,
                "action": action,
                "tool_calls": calls,
                "observation": None,
                "reward": reward if torch.isfinite(torch.tensor(reward)) else None,
                "advantage": adv,
                "action_tokens": e - s,
            }
        )
    return turns


def _call(c) -> dict[str, Any]:
    return {"error": c.error} if c.error is not None else {"name": c.name, "arguments": c.arguments}
