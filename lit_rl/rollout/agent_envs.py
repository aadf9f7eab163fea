"""Two tool environments a small model can learn on, where using the tool is needed to succeed (issue 54.3).

- ``CalculatorEnv`` (task ``agent_multiply``): "What is 347 * 829?". The tool ``calculator(expression)``
  evaluates arithmetic (``+ - * / // % **`` and parentheses, parsed with ``ast``, never ``eval``); the reward
  is 1 when the final reply's last integer is the product (``LastIntReward``). A 135M model cannot multiply
  3-digit numbers in its head: right answers come from calling the tool and copying its result.
- ``GuessEnv`` (task ``agent_guess``): find a hidden number in ``lo..hi`` with the tool ``guess(number)``, which
  replies ``higher``, ``lower`` or ``correct``; the episode ends on ``correct`` or when ``max_guesses`` are
  spent, and the reward (the game's ``get_reward``) is 1 when it was found. It needs several turns and the
  feedback: ``max_guesses`` 6 for a range of 30 leaves random guessing at 0.2 and binary search at 1.

Both are ``ToolEnv``: the tools reach the prompt through the chat template or the system-prompt fallback, and
bad calls are observations and counted metrics. ``demonstrations=k`` puts k worked exchanges before the task
(user, assistant call, tool result, ..., assistant answer), the signal a small instruct model needs to write its
first valid calls (issue 54.3: SmolLM2 writes no valid call from the system prompt alone).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from lit_rl.data.agent_tasks import GUESS_TEMPLATE
from lit_rl.rewards.verifiers import LastIntReward
from lit_rl.rollout.tool_env import ToolEnv

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "347 * 829" (numbers, + - * / // % ** and parentheses).

    Returns:
        The value of the expression.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression[:60]!r}") from e
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _BINOPS[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


CALCULATOR_SYSTEM = "Use the calculator tool for arithmetic, then reply with the number."
# Worked exchanges with 3-digit operands, the first ``demonstrations`` of them go before the task. SmolLM2
# (temperature 1, 32 held-out prompts, transformers' generate) wrote a valid call in 16 replies and the exact
# expression in 14 after both, in 5 and 2 after the first alone.
CALCULATOR_DEMOS = [
    [
        {"role": "user", "content": "What is 123 * 456?"},
        _call("calculator", expression="123 * 456"),
        {"role": "tool", "name": "calculator", "content": "56088"},
        {"role": "assistant", "content": "56088"},
    ],
    [
        {"role": "user", "content": "What is 705 * 318?"},
        _call("calculator", expression="705 * 318"),
        {"role": "tool", "name": "calculator", "content": "224190"},
        {"role": "assistant", "content": "224190"},
    ],
]


class CalculatorEnv(ToolEnv):
    """``calculator`` tool, reward ``LastIntReward`` on the final reply (module doc).

    Args:
        demonstrations: how many worked exchanges of ``CALCULATOR_DEMOS`` go before the task (0, 1 or 2).
        system: the system message (None: none).
        max_tool_calling_iterations: rounds of calls before the next reply is the last.
    """

    def __init__(
        self,
        demonstrations: int = 1,
        system: str | None = CALCULATOR_SYSTEM,
        max_tool_calling_iterations: int = 2,
    ):
        if not 0 <= demonstrations <= len(CALCULATOR_DEMOS):
            raise ValueError(f"demonstrations={demonstrations}; valid values: 0..{len(CALCULATOR_DEMOS)}")
        super().__init__(
            tools=[calculator],
            reward=LastIntReward(),
            max_tool_calling_iterations=max_tool_calling_iterations,
            system=system,
            demonstration=[m for demo in CALCULATOR_DEMOS[:demonstrations] for m in demo],
        )


class GuessGame:
    """The hidden number (a TRL-style environment: ``reset(**columns)``, a public tool method, ``get_reward``).

    ``done`` is True once the number is found or ``max_guesses`` are spent (``ToolEnv`` then ends the episode).
    """

    def __init__(self, max_guesses: int = 6):
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be >= 1, got {max_guesses}")
        self.max_guesses = max_guesses
        self.lo = self.hi = self.target = self.guesses = 0
        self.found = self.done = False

    def reset(self, lo: int, hi: int, target: int, **_: Any) -> None:
        self.lo, self.hi, self.target = int(lo), int(hi), int(target)
        self.guesses, self.found, self.done = 0, False, False

    def guess(self, number: int) -> str:
        """Guess the hidden number.

        Args:
            number: Your guess.

        Returns:
            "higher" if the hidden number is larger, "lower" if it is smaller, "correct" if it is the number.
        """
        if self.done:
            return "no guesses left"
        self.guesses += 1
        number = int(number)
        if number == self.target:
            reply = "correct"
            self.found = True
        else:
            reply = "higher" if self.target > number else "lower"
        self.done = self.found or self.guesses >= self.max_guesses
        return reply

    def get_reward(self) -> float:
        return float(self.found)


GUESS_SYSTEM = "Find the hidden number with the guess tool. Halve the range with each guess."
# SmolLM2 with the demonstration (greedy, 64 held-out games) made one guess and then replied with a number: with
# the episode ending there (TRL's rule) it found none, sampled at temperature 1 none either
GUESS_REMIND = "The number is still hidden. Call guess with your next guess."
GUESS_DEMOS = [
    [
        {"role": "user", "content": GUESS_TEMPLATE.format(lo=1, hi=8)},
        _call("guess", number=4),
        {"role": "tool", "name": "guess", "content": "higher"},
        _call("guess", number=6),
        {"role": "tool", "name": "guess", "content": "lower"},
        _call("guess", number=5),
        {"role": "tool", "name": "guess", "content": "correct"},
        {"role": "assistant", "content": "5"},
    ],
    [
        {"role": "user", "content": GUESS_TEMPLATE.format(lo=10, hi=17)},
        _call("guess", number=13),
        {"role": "tool", "name": "guess", "content": "lower"},
        _call("guess", number=11),
        {"role": "tool", "name": "guess", "content": "higher"},
        _call("guess", number=12),
        {"role": "tool", "name": "guess", "content": "correct"},
        {"role": "assistant", "content": "12"},
    ],
]


class GuessEnv(ToolEnv):
    """``guess`` tool over a ``GuessGame``; reward 1 when found within ``max_guesses`` (module doc).

    Args:
        max_guesses: guesses per episode (also the rounds of calls).
        demonstrations: how many worked games of ``GUESS_DEMOS`` (searches of 1..8 and 10..17) go before the task.
        system: the system message (None: none).
        remind: the user message answering a reply without a guess (the game goes on; ``ToolEnv.remind``);
            None ends the episode there (TRL's rule). Such a reply counts against ``max_guesses`` rounds.
    """

    def __init__(
        self,
        max_guesses: int = 6,
        demonstrations: int = 1,
        system: str | None = GUESS_SYSTEM,
        remind: str | None = GUESS_REMIND,
    ):
        if not 0 <= demonstrations <= len(GUESS_DEMOS):
            raise ValueError(f"demonstrations={demonstrations}; valid values: 0..{len(GUESS_DEMOS)}")
        super().__init__(
            environment_factory=lambda: GuessGame(max_guesses),
            max_tool_calling_iterations=max_guesses,
            system=system,
            demonstration=[m for demo in GUESS_DEMOS[:demonstrations] for m in demo],
            remind=remind,
        )
