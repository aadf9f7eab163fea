"""Tasks for the tool-using agents (``lit_rl.rollout.agent_envs``): fixed, seeded train / held-out splits.

- ``agent_multiply``: "What is A * B?" for ``digits``-digit A, B (3: 100..999, beyond a small model's mental
  arithmetic); ``answer`` the product, ``metadata`` A and B. ``train`` distinct pairs are drawn, and
  ``heldout`` more, never among them.
- ``agent_guess``: find a hidden number in ``lo..lo+width-1`` (``lo`` in 1..``max_lo``); ``answer`` the number,
  ``metadata`` ``lo``, ``hi``, ``target`` (``GuessGame.reset`` reads them). Every (lo, target) instance is
  listed; ``heldout`` of them (seeded) are never trained on.
"""

from __future__ import annotations

import random

from lit_rl.data.prompts import Prompt

MULTIPLY_TEMPLATE = "What is {a} * {b}?"
GUESS_TEMPLATE = (
    "I am thinking of a number from {lo} to {hi}. Find it: call guess with a number and I reply higher, lower "
    "or correct."
)


def _chat(text: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def agent_multiply(
    digits: int = 3,
    train: int = 5000,
    heldout: int = 200,
    seed: int = 1234,
    template: str = MULTIPLY_TEMPLATE,
    system: str | None = None,
    **_,
) -> tuple[list[Prompt], list[Prompt]]:
    """Products of two ``digits``-digit numbers (module doc); the answer is ``str(A * B)``."""
    if not 1 <= digits <= 6:
        raise ValueError(f"agent_multiply: digits={digits} must be in 1..6")
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    total = (hi - lo + 1) ** 2
    if train < 1 or heldout < 1 or train + heldout > total:
        raise ValueError(
            f"agent_multiply: train={train} and heldout={heldout} must be >= 1 and together at most {total}"
        )
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int]] = []
    while len(pairs) < train + heldout:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if p not in seen:
            seen.add(p)
            pairs.append(p)

    def rec(a: int, b: int) -> Prompt:
        return Prompt(
            messages=_chat(template.format(a=a, b=b), system),
            answer=str(a * b),
            domain="multiply",
            metadata={"a": a, "b": b},
            uid=f"agentmul-{a}-{b}",
        )

    return [rec(*p) for p in pairs[heldout:]], [rec(*p) for p in pairs[:heldout]]


def agent_guess(
    width: int = 30,
    max_lo: int = 70,
    heldout: int = 200,
    seed: int = 1234,
    template: str = GUESS_TEMPLATE,
    system: str | None = None,
    **_,
) -> tuple[list[Prompt], list[Prompt]]:
    """Hidden-number instances (module doc); the answer is ``str(target)``."""
    if width < 2 or max_lo < 1:
        raise ValueError(f"agent_guess: width={width} must be >= 2 and max_lo={max_lo} >= 1")
    items = [(lo, t) for lo in range(1, max_lo + 1) for t in range(lo, lo + width)]
    if not 1 <= heldout < len(items):
        raise ValueError(f"agent_guess: heldout={heldout} must be in [1, {len(items) - 1}]")
    random.Random(seed).shuffle(items)

    def rec(lo: int, target: int) -> Prompt:
        hi = lo + width - 1
        return Prompt(
            messages=_chat(template.format(lo=lo, hi=hi), system),
            answer=str(target),
            domain="guess",
            metadata={"lo": lo, "hi": hi, "target": target},
            uid=f"agentguess-{lo}-{target}",
        )

    return [rec(*p) for p in items[heldout:]], [rec(*p) for p in items[:heldout]]
