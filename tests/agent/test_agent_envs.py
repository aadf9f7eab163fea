"""The learning environments (issue 54.3): the calculator and the hidden number, their tasks' held-out splits,
and episodes played by scripts through AgentLoop (the tiny model's tokenizer)."""

from __future__ import annotations

import pytest
from _scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from lit_rl.data.tasks import get_task
from lit_rl.rollout.agent_envs import CalculatorEnv, GuessEnv, GuessGame, calculator
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards
from lit_rl.rollout.engine import SamplingConfig

SP = SamplingConfig(max_new_tokens=64)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize(
    "expr, value",
    [
        ("347 * 829", "287663"),
        ("(2 + 3) / 2", "2.5"),
        ("10 / 5", "2"),
        ("-7 // 2", "-4"),
        ("2 ** 10", "1024"),
    ],
)
def test_calculator_evaluates_arithmetic(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize(
    "expr, message",
    [
        ("__import__('os')", "unsupported expression element: Call"),
        ("True + 1", "unsupported expression element: Constant"),
        ("347 x 829", "not an arithmetic expression"),
        ("2 ** 100", "exponent 100 is larger than 64"),
        ("1" * 201, "longer than 200 characters"),
    ],
)
def test_calculator_refuses_anything_else(expr, message):
    with pytest.raises(ValueError, match=message):
        calculator(expr)


def test_tasks_hold_out_instances_never_trained_on():
    train, held = get_task("agent_multiply")
    assert (len(train), len(held)) == (5000, 200)
    assert not {p.uid for p in train} & {p.uid for p in held}
    p = held[0]
    a, b = p.metadata["a"], p.metadata["b"]
    assert 100 <= a <= 999 and 100 <= b <= 999 and p.answer == str(a * b)
    assert p.messages == [{"role": "user", "content": f"What is {a} * {b}?"}]
    train, held = get_task("agent_guess")
    assert (len(train), len(held)) == (70 * 30 - 200, 200)
    assert not {p.uid for p in train} & {p.uid for p in held}
    m = held[0].metadata
    assert (
        m["hi"] - m["lo"] == 29 and m["lo"] <= m["target"] <= m["hi"] and held[0].answer == str(m["target"])
    )
    with pytest.raises(ValueError, match="heldout=2100 must be in"):
        get_task("agent_guess", heldout=2100)


def _call(name, **args):
    import json

    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def test_calculator_episode(tok):
    _, held = get_task("agent_multiply")
    p = held[0]
    a, b = p.metadata["a"], p.metadata["b"]
    actions = [_call("calculator", expression=f"{a} * {b}"), f"The answer is {a * b}."]
    loop = AgentLoop(CalculatorEnv, ScriptedEngine(tok, actions), max_turns=3)
    (ep,) = loop.run([p], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == [str(a * b), ""] and ep.total_reward == 1.0
    # the demonstration and the fallback description are in the prompt, before the task
    prompt = tok.decode(ep.prompt_ids)
    assert (
        prompt.index('"name": "calculator"') < prompt.index("What is 123 * 456?") < prompt.index(f"{a} * {b}")
    )
    assert prompt.count("<tool_call>") == 2  # the fallback's format line and the demonstration's call
    assert "705 * 318" not in prompt  # one demonstration by default; CalculatorEnv(demonstrations=2) has both
    # without the tool: a guess in the head is wrong (and the episode ends on it)
    loop = AgentLoop(lambda: CalculatorEnv(demonstrations=0), ScriptedEngine(tok, ["12345"]), max_turns=3)
    (ep,) = loop.run([p], 1, SP)[0]
    assert ep.total_reward == 0.0 and "123 * 456" not in tok.decode(ep.prompt_ids)


@pytest.mark.parametrize(
    "guesses, replies, reward",
    [
        ([55, 40, 47, 44, 45], ["lower", "higher", "lower", "higher", "correct"], 1.0),
        ([1, 2, 3, 4, 5, 6], ["higher"] * 6, 0.0),  # six guesses spent
    ],
    ids=["found", "budget_spent"],
)
def test_guess_episode_ends_on_correct_or_the_budget(tok, guesses, replies, reward):
    from lit_rl.data.prompts import Prompt

    p = Prompt(
        messages=[{"role": "user", "content": "from 30 to 59"}], metadata={"lo": 30, "hi": 59, "target": 45}
    )
    actions = [_call("guess", number=g) for g in guesses] + ["never reached"]
    loop = AgentLoop(GuessEnv, ScriptedEngine(tok, actions), max_turns=8)
    (ep,) = loop.run([p], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == replies and ep.done
    assert [t.reward for t in ep.turns] == [0.0] * (len(guesses) - 1) + [reward]
    m = EnvRewards()([p], [[ep]]).metrics
    assert m["rollout/success_frac"] == reward and m["tools/calls_per_episode"] == len(guesses)
    assert m["tools/valid_call_rate"] == 1.0


def test_calculator_demonstrations_are_counted():
    assert [len(CalculatorEnv(demonstrations=k).demonstration) for k in (0, 1, 2)] == [0, 4, 8]
    with pytest.raises(ValueError, match="demonstrations=3; valid values: 0..2"):
        CalculatorEnv(demonstrations=3)
    assert [len(GuessEnv(demonstrations=k).demonstration) for k in (0, 1, 2)] == [0, 8, 16]
    with pytest.raises(ValueError, match="demonstrations=3; valid values: 0..2"):
        GuessEnv(demonstrations=3)


def test_guess_game_alone():
    g = GuessGame(max_guesses=2)
    g.reset(lo=1, hi=8, target=5)
    assert [g.guess(4), g.guess(6), g.guess(5)] == ["higher", "lower", "no guesses left"]
    assert g.done and g.get_reward() == 0.0
    with pytest.raises(ValueError, match="max_guesses must be >= 1"):
        GuessGame(0)
