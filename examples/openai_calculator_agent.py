"""A calculator agent written against the ``openai`` client: nothing of lit_rl in its loop but the task's pieces.

``calculator_agent(base_url, prompt) -> reward`` is what ``lit_rl.rollout.agent_program.ProgramLoop`` runs per
episode (``configs/agent_openai_calculator.yaml``): it talks to ``base_url`` as to any OpenAI-compatible
server, calls the ``calculator`` tool the model asks for, sends the results back as ``tool`` messages, and
scores the final reply (1.0 when its last integer is the product). The task is the one of
``lit_rl.rollout.agent_envs.CalculatorEnv``: the same system message, worked exchange and tool, so the two
paths can be compared.
"""

from __future__ import annotations

import json

from openai import OpenAI
from transformers.utils import get_json_schema

from lit_rl.rewards.verifiers import LastIntReward
from lit_rl.rollout.agent_envs import CALCULATOR_DEMOS, CALCULATOR_SYSTEM, calculator

TOOLS = [get_json_schema(calculator)]


def demonstration(k: int) -> list[dict]:
    """The first ``k`` worked exchanges of ``CalculatorEnv`` in OpenAI's message form (call ids, arguments as
    JSON strings)."""
    out: list[dict] = []
    for d, demo in enumerate(CALCULATOR_DEMOS[:k]):
        for m in demo:
            if m.get("tool_calls"):
                fn = m["tool_calls"][0]["function"]
                call = {
                    "id": f"demo{d}",
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": json.dumps(fn["arguments"])},
                }
                out.append({"role": "assistant", "content": m["content"] or None, "tool_calls": [call]})
            elif m["role"] == "tool":
                out.append({"role": "tool", "tool_call_id": f"demo{d}", "content": m["content"]})
            else:
                out.append(dict(m))
    return out


def calculator_agent(base_url: str, prompt, demonstrations: int = 1, max_rounds: int = 2) -> float:
    """One episode: up to ``max_rounds`` rounds of tool calls, then the reply is scored."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    messages = [
        {"role": "system", "content": CALCULATOR_SYSTEM},
        *demonstration(demonstrations),
        *prompt.messages,
    ]
    reply = None
    for _ in range(max_rounds + 1):
        reply = (
            client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        )
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as e:  # noqa: BLE001 - a bad call is answered, as a real tool runner would
                result = json.dumps({"error": f"{type(e).__name__}: {e}"})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return float(LastIntReward()(prompt, (reply.content if reply is not None else None) or ""))
