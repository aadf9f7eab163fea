"""`lit-rl explain-trl` on an agent recipe (issue 54.6): the rollout settings are the AgentRolloutCallback's (not
the unused `rollout` section's defaults) and the tool settings are compared with TRL's tool loop."""

from __future__ import annotations

from pathlib import Path

from lit_rl.cli.trl_diff import main

ROOT = Path(__file__).resolve().parents[2]
AGENT = "trainer.callbacks[AgentRolloutCallback].init_args.agent.init_args"


def test_explain_trl_reads_the_agent_callback_and_names_the_tool_settings(capsys):
    assert main(["-c", str(ROOT / "configs/agent_calculator.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "rollout.group_size: 4 here, 8 under TRL 1.16's num_generations=8" in lines
    assert "rollout.sampling.max_new_tokens: 40 here, 512 under TRL 1.16's max_completion_length=512" in lines
    assert not any(line.startswith("rollout.overlong_filter") for line in lines)
    assert lines[-5:-1] == [
        f"{AGENT}.env_factory.init_args.max_tool_calling_iterations: 2 here, None under TRL 1.16's "
        "max_tool_calling_iterations=None (no limit on rounds of calls)",
        f"{AGENT}.max_turns: 3 here (generations per episode), no such limit under TRL 1.16 "
        "(max_tool_calling_iterations + 1 generations)",
        f"{AGENT}: each action's budget is sampling.max_new_tokens=40 and an episode's context "
        "max_context_tokens=1024, observations cut at max_obs_tokens=32; under TRL 1.16 max_completion_length=512 "
        "bounds the whole episode (turns and tool results)",
        "tool calls: a malformed <tool_call> is an error observation here (counted in tools/errors/malformed); "
        "under TRL 1.16 it is read as plain text and ends the episode",
    ]


def test_explain_trl_without_an_agent_has_no_tool_lines(capsys):
    assert main(["-c", str(ROOT / "configs/grpo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "tool calls" not in out and "AgentRolloutCallback" not in out
