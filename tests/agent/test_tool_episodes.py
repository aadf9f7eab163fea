"""Tool-calling episodes through AgentLoop (issue 54.1): observation tokens as the template renders them, bad
calls as observations and counted metrics, and TRL's documented tool / environment examples ported unchanged."""

from __future__ import annotations

import random

import pytest
import torch
from _scripted_engine import ScriptedEngine
from _tool_helpers import EOT, DatasetIncrementEnv, E, IncrementEnv, S, async_add, chars, multiply
from transformers import AutoTokenizer

from lit_rl.data.prompts import Prompt
from lit_rl.rewards import LastIntReward
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.tool_env import ToolEnv

SP = SamplingConfig(max_new_tokens=64)
ASSISTANT = [S, *chars("assistant\n")]  # the generation prompt


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _loop(tok, actions, env_factory, **kw):
    return AgentLoop(env_factory, ScriptedEngine(tok, actions), **kw)


# ---------------------------------------------------------------- observation tokens
def test_observation_ids_close_the_turn_then_render_the_observation(tok):
    loop = _loop(tok, [], lambda: None, max_obs_tokens=3)
    tool = [{"role": "tool", "name": "multiply", "content": "12"}]
    body = [S, *chars("tool\n12"), E, *chars("\n"), *ASSISTANT]
    # the action ended with the template's end of turn: only the newline after it is added
    assert loop.observation_ids(tok, tool, [*chars("hi"), E]) == [*chars("\n"), *body]
    # it ended with the tokenizer's eos (not the template's end of turn), or was cut: the whole end of turn
    assert loop.observation_ids(tok, tool, [*chars("hi"), EOT]) == [E, *chars("\n"), *body]
    assert loop.observation_ids(tok, tool, chars("hi")) == [E, *chars("\n"), *body]
    # a string is a user turn; a long content is cut to max_obs_tokens (3) and marked
    assert loop.observation_ids(tok, "12345", [E]) == [
        *chars("\n"),
        S,
        *chars("user\n123 [truncated]"),
        E,
        *chars("\n"),
        *ASSISTANT,
    ]
    assert loop.observation_ids(tok, [], [E]) == []  # an episode that ended on its answer: no tokens


# ---------------------------------------------------------------- bad calls are observations, counted
def _boom(x: int) -> int:
    """Always fails.

    Args:
        x: ignored.
    """
    raise RuntimeError("tool is down")


CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 347, "b": 829}}</tool_call>'
BAD = '<tool_call>oops</tool_call><tool_call>{"name": "divide", "arguments": {}}</tool_call>'
RAISE = '<tool_call>{"name": "_boom", "arguments": {"x": 1}}</tool_call>'
ANSWER = "It is 287663."


def test_bad_calls_are_observations_and_counted(tok):
    actions = [CALL, BAD, RAISE, ANSWER]
    env = lambda: ToolEnv([multiply, _boom], reward=LastIntReward())  # noqa: E731
    loop = _loop(tok, actions, env, max_turns=6)
    prompt = Prompt(prompt="What is 347 * 829?", answer="287663")
    (ep,) = loop.run([prompt], 1, SP)[0]
    assert [t.action_text for t in ep.turns] == actions and ep.done
    assert [t.obs_text for t in ep.turns] == [
        "287663",
        '{"error": "malformed tool call: not JSON (Expecting value at character 0)"}\n'
        '{"error": "unknown tool \'divide\'; tools: multiply, _boom"}',
        '{"error": "RuntimeError: tool is down"}',
        "",
    ]
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 0.0, 1.0]
    assert [t.info for t in ep.turns] == [
        {"tool_calls": 1.0},
        {"tool_calls": 2.0, "tool_errors/malformed": 1.0, "tool_errors/unknown_tool": 1.0},
        {"tool_calls": 1.0, "tool_errors/raised": 1.0},
        {"tool_calls": 0.0, "success": 1.0},
    ]
    # each tool result is a tool message closed by the template, then one generation prompt; the actions end
    # with the tiny tokenizer's eos, so each observation first closes the assistant turn
    err1 = '{"error": "malformed tool call: not JSON (Expecting value at character 0)"}'
    err2 = '{"error": "unknown tool \'divide\'; tools: multiply, _boom"}'
    err3 = '{"error": "RuntimeError: tool is down"}'

    def tool_turn(*contents):
        out = [E, *chars("\n")]
        for c in contents:
            out += [S, *chars("tool\n" + c), E, *chars("\n")]
        return out + ASSISTANT

    expected_obs = [tool_turn("287663"), tool_turn(err1, err2), tool_turn(err3), []]
    assert [t.obs_ids for t in ep.turns] == expected_obs
    m = EnvRewards()([prompt], [[ep]]).metrics
    n_actions = sum(len(a) + 1 for a in actions)  # one char token each + eos
    n_tokens = n_actions + sum(len(o) for o in expected_obs)
    assert {k: v for k, v in m.items() if k.startswith(("tools/", "rollout/"))} == {
        "rollout/turns_mean": 4.0,
        "rollout/episodes_done_frac": 1.0,
        "rollout/tokens_per_episode": float(n_tokens),
        "rollout/action_tokens_per_episode": float(n_actions),
        "tools/calls_per_episode": 4.0,
        "tools/valid_call_rate": 0.25,  # 1 of 4 calls ran
        "tools/errors/malformed": 1.0,
        "tools/errors/unknown_tool": 1.0,
        "tools/errors/bad_arguments": 0.0,
        "tools/errors/raised": 1.0,
        "rollout/success_frac": 1.0,
    }


def test_max_tool_calling_iterations_ends_on_the_next_reply(tok):
    """TRL: after max_tool_calling_iterations rounds the next reply is the last, its calls not run."""
    env = lambda: ToolEnv([multiply], reward=LastIntReward(), max_tool_calling_iterations=1)  # noqa: E731
    loop = _loop(tok, [CALL, CALL, ANSWER], env, max_turns=6)
    (ep,) = loop.run([Prompt(prompt="q", answer="287663")], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == ["287663", ""] and ep.done
    assert ep.total_reward == 0.0  # the final reply was the call, whose last integer is 829


def test_reward_that_cannot_judge_is_an_infra_error_not_zero(tok):
    env = lambda: ToolEnv([multiply], reward=LastIntReward())  # noqa: E731
    loop = _loop(tok, [ANSWER], env)
    eps = loop.run([Prompt(prompt="q", answer="not a number")], 1, SP)
    batch = EnvRewards()([None], eps)
    assert batch.valid.tolist() == [False] and torch.isnan(batch.total).all()
    assert batch.metrics["reward/infra_errors"] == 1.0


def test_toolenv_refuses_a_run_without_reward_or_reset():
    with pytest.raises(ValueError, match="no reward source"):
        ToolEnv([multiply])
    with pytest.raises(ValueError, match="must define a callable reset"):
        ToolEnv([multiply], environment_factory=object, reward=LastIntReward())
    with pytest.raises(ValueError, match="max_tool_calling_iterations must be >= 0"):
        ToolEnv([multiply], reward=LastIntReward(), max_tool_calling_iterations=-1)


# ---------------------------------------------------------------- TRL's examples, unchanged
def test_trl_tools_list_ports_unchanged(tok):
    """TRL's ``tools=[multiply, async_add]`` example: both schemas reach the prompt (the tiny template has no
    tools: the system-prompt fallback), the sync and the async tool both answer."""
    actions = [
        '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
        '<tool_call>{"name": "async_add", "arguments": {"a": 40, "b": 2}}</tool_call>',
        "42",
    ]
    env = lambda: ToolEnv(tools=[multiply, async_add], reward=LastIntReward())  # noqa: E731
    loop = _loop(tok, actions, env)
    (ep,) = loop.run([Prompt(prompt="6*7 and 40+2?", answer="42")], 1, SP)[0]
    prompt = tok.decode(ep.prompt_ids)
    assert '{"name": "multiply", "description": "Multiplies two integers."' in prompt
    assert '{"name": "async_add", "description": "Asynchronously adds two integers."' in prompt
    assert ep.turns[0].obs_text == "42\n42" and ep.total_reward == 1.0


def test_trl_environment_factory_ports_unchanged(tok):
    """TRL's self-sampling ``IncrementEnv``: ``reset()``'s string is the prompt, ``increment`` is a tool,
    ``reset`` / ``get_reward`` are not, and ``get_reward`` is the reward."""
    random.seed(0)
    target = random.randint(1, 6)
    random.seed(0)
    actions = [f'<tool_call>{{"name": "increment", "arguments": {{"step": {target}}}}}</tool_call>', "done"]
    loop = _loop(tok, actions, lambda: ToolEnv(environment_factory=IncrementEnv), max_turns=4)
    (ep,) = loop.run([Prompt(prompt="")], 1, SP)[0]
    prompt = tok.decode(ep.prompt_ids)
    assert prompt.endswith(
        f"<|im_start|>user\nIncrement the counter by {target}.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert '"name": "increment"' in prompt and '"name": "reset"' not in prompt and "get_reward" not in prompt
    assert ep.turns[0].obs_text == str(target) and [t.reward for t in ep.turns] == [0.0, 1.0]


@pytest.mark.parametrize("step, reward", [(3, 1.0), (2, 0.0)])
def test_trl_environment_with_dataset_columns_ports_unchanged(tok, step, reward):
    """TRL's dataset variant: the row's ``target`` column reaches ``reset(target=...)``; ``reset`` returns None,
    so the dataset's prompt is the task."""
    actions = [f'<tool_call>{{"name": "increment", "arguments": {{"step": {step}}}}}</tool_call>', "ok"]
    loop = _loop(tok, actions, lambda: ToolEnv(environment_factory=DatasetIncrementEnv))
    row = Prompt.from_dict(
        {"prompt": [{"role": "user", "content": "Increment the counter to 3."}], "target": 3}, index=0
    )
    (ep,) = loop.run([row], 1, SP)[0]
    assert tok.decode(ep.prompt_ids).endswith(
        "<|im_start|>user\nIncrement the counter to 3.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ep.total_reward == reward


def test_inspector_shows_each_turn(tok):
    """RolloutInspector's row for an episode: per turn the action and observation as the engine wrote and read
    them, the parsed tool calls, the turn's reward (r_k; the row's reward on the last action) and the mean
    advantage over the action's tokens."""
    from lit_rl.callbacks.inspector import row_records

    env = lambda: ToolEnv([multiply, _boom], reward=LastIntReward())  # noqa: E731
    loop = _loop(tok, [CALL, BAD, ANSWER], env, max_turns=6)
    prompt = Prompt(prompt="What is 347 * 829?", answer="287663")
    exp = loop.to_experience([prompt], loop.run([prompt], 1, SP), pad_id=0)
    exp.advantages = torch.arange(exp.completion_len, dtype=torch.float32)[
        None
    ].clone()  # advantage t at token t
    (row,) = row_records(exp, tokenizer=tok)
    turns = row["turns"]
    assert [t["action"] for t in turns] == [f"{x}<|endoftext|>" for x in (CALL, BAD, ANSWER)]
    assert (
        turns[0]["observation"] == "<|im_end|>\n<|im_start|>tool\n287663<|im_end|>\n<|im_start|>assistant\n"
    )
    assert turns[2]["observation"] is None  # the episode ended on its answer: no observation tokens
    assert [t["tool_calls"] for t in turns] == [
        [{"name": "multiply", "arguments": {"a": 347, "b": 829}}],
        [
            {"error": "malformed tool call: not JSON (Expecting value at character 0)"},
            {"name": "divide", "arguments": {}},
        ],
        [],
    ]
    assert [t["reward"] for t in turns] == [0.0, 0.0, 1.0]
    a = [len(x) + 1 for x in (CALL, BAD, ANSWER)]  # action tokens: one per char + eos
    # observation tokens: end of turn (2) + per result <|im_start|>tool\n ... <|im_end|>\n (8 + content) + the
    # generation prompt (11); contents "287663" (6), the two errors (75, 58)
    o = [2 + (8 + 6) + 11, 2 + (8 + 75) + (8 + 58) + 11]
    assert [t["action_tokens"] for t in turns] == a
    starts = [0, a[0] + o[0], a[0] + o[0] + a[1] + o[1]]
    # the advantage at token t is t: an action's mean is its first position + (length - 1) / 2
    assert [t["advantage"] for t in turns] == [s + (n - 1) / 2 for s, n in zip(starts, a)]


def test_remind_keeps_a_game_going_until_the_rounds_are_spent(tok):
    """ToolEnv(remind=...): a reply without a call is answered by the reminder (a user turn) while rounds remain,
    and counts as a round; the reply after the last round ends the episode as in TRL."""
    env = lambda: ToolEnv(  # noqa: E731
        [multiply], reward=LastIntReward(), max_tool_calling_iterations=2, remind="Use the tool."
    )
    loop = _loop(tok, ["no call", CALL, "287663"], env, max_turns=6)
    (ep,) = loop.run([Prompt(prompt="q", answer="287663")], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == ["Use the tool.", "287663", ""] and ep.done
    assert [t.info for t in ep.turns] == [
        {"tool_calls": 0.0, "reminders": 1.0},
        {"tool_calls": 1.0},
        {"tool_calls": 0.0, "success": 1.0},
    ]
    assert ep.turns[0].obs_ids == [
        E,
        *chars("\n"),
        S,
        *chars("user\nUse the tool."),
        E,
        *chars("\n"),
        *ASSISTANT,
    ]
    loop = _loop(
        tok, ["a", "b", "c"], env, max_turns=6
    )  # two reminders spend both rounds; the third reply ends it
    (ep,) = loop.run([Prompt(prompt="q", answer="287663")], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == ["Use the tool.", "Use the tool.", ""] and ep.total_reward == 0.0
