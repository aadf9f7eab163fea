"""docs/guides/agents.md "Agents": its python block runs as written, and the loop it builds plays an episode with TRL's
tool (scripted actions on the tiny model's tokenizer)."""

from __future__ import annotations

import re
from pathlib import Path

from _docs import section
from _scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from lit_rl.data.prompts import Prompt
from lit_rl.rollout.engine import SamplingConfig

ROOT = Path(__file__).resolve().parents[2]
SECTION = section("docs/guides/agents.md", "# Agents")


def test_readme_agents_block_runs(tiny_model_dir):
    (block,) = re.findall(r"```python\n(.*?)```", SECTION, re.DOTALL)
    ns: dict = {}
    exec(compile(block, "docs/guides/agents.md", "exec"), ns)  # noqa: S102 - the guide's own code, as a user runs it
    rollout, agent = ns["rollout"], ns["agent"]
    assert rollout.agent is agent and rollout.settings.group_size == 4
    assert rollout.settings.sampling.max_new_tokens == 48
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    agent.engine = ScriptedEngine(
        tok, ['<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>', "42"]
    )
    (ep,) = agent.run([Prompt(prompt="What is 6 * 7?", answer="42")], 1, SamplingConfig(max_new_tokens=48))[0]
    assert [t.obs_text for t in ep.turns] == ["42", ""] and ep.total_reward == 1.0
