# ruff: noqa: D212  (TRL's examples are kept verbatim, docstrings included)
"""Shared pieces of the tool tests: TRL's documented tool examples (copied verbatim from TRL's GRPO guide,
"Agent Training": the issue asks that they port unchanged), a tool-capable ChatML template written for these
tests, and the char tokenizer's id rule."""

from __future__ import annotations

import random

from lit_rl.models.tiny import EOS_ID, IM_END_ID, IM_START_ID

# -------------------------------------------------- TRL's examples, verbatim (docs/source/grpo_trainer.md)


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class DatasetIncrementEnv:  # TRL's second IncrementEnv ("Providing an external dataset"), renamed only
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


# ---------------------------------------------------------------- a ChatML template that renders tools
# Written for these tests (Hermes-style): schemas in the system turn, assistant tool_calls as <tool_call> blocks.
TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n' }}{%- for t in tools %}{{- t | tojson + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content %}{{- m.content }}{%- endif %}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{{- '<tool_call>\\n' + {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "{{- '\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chars(text: str) -> list[int]:
    r"""The char tokenizer's ids (lit_rl.models.tiny_tokenizer): "\\n" is 5, printable ASCII 0x20..0x7E are
    6..100 in order."""
    return [5 if c == "\n" else ord(c) - 0x20 + 6 for c in text]


S, E, EOT = IM_START_ID, IM_END_ID, EOS_ID


# ---------------------------------------------------------------- engines that record what they were given
from lit_rl.rollout.base import EngineBase  # noqa: E402
from lit_rl.rollout.engine import Completion  # noqa: E402


class Recording(EngineBase):
    """Wraps an engine and records every ``generate`` call: (the prompt ids it was given, the completions)."""

    def __init__(self, inner: EngineBase):
        self.inner, self.calls = inner, []

    @property
    def tokenizer(self):  # type: ignore[override]
        return self.inner.tokenizer

    def bind(self, module, rollout=None) -> None:
        self.inner.bind(module, rollout)

    def update_weights(self, named_tensors) -> None:
        self.inner.update_weights(named_tensors)

    def generate(self, prompt_ids, n, sampling):
        out = self.inner.generate(prompt_ids, n, sampling)
        self.calls.append(([list(p) for p in prompt_ids], [[list(c.token_ids) for c in g] for g in out]))
        return out


class IdsEngine(EngineBase):
    """Call k answers every context with the token ids ``actions[k]`` as given (log-prob -0.5 each): sampled
    ids that are not the tokenizer's own split of their text."""

    def __init__(self, tokenizer, actions: list[list[int]]):
        self.tokenizer, self.actions, self.k = tokenizer, actions, 0

    def bind(self, module, rollout=None) -> None:
        pass

    def update_weights(self, named_tensors) -> None:
        self.policy_version += 1

    def generate(self, prompt_ids, n, sampling):
        ids = list(self.actions[self.k])
        self.k += 1
        return [[Completion(ids, [-0.5] * len(ids), "stop") for _ in range(n)] for _ in prompt_ids]
