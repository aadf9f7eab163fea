"""Built-in synthetic tasks with fixed train / held-out splits (offline, checkable answers).

Each task yields ``Prompt`` records whose ``answer`` is the exact expected completion text (before eos).
Splits are fixed by a seed so the held-out prompts are never trained on.
"""
from __future__ import annotations

import random
from typing import Callable

from lit_rl.data.prompts import Prompt

TASKS: dict[str, Callable[..., tuple[list[Prompt], list[Prompt]]]] = {}


def _task(name):
    def deco(fn):
        TASKS[name] = fn
        return fn

    return deco


def _split(items: list, heldout_frac: float, seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    items = list(items)
    rng.shuffle(items)
    n_held = max(1, round(len(items) * heldout_frac))
    return items[n_held:], items[:n_held]


@_task("addition")
def addition(max_operand: int = 9, heldout_frac: float = 0.2, seed: int = 1234, answer_width: int | None = None,
             max_sum: int | None = None, unary: bool = False, **_) -> tuple[list, list]:
    """``"a+b="`` → ``"<a+b>"`` for all operand pairs 0..max_operand; held-out pairs are never trained on.

    ``answer_width`` zero-pads answers to a fixed number of digits (``"3+5="`` → ``"08"``), so a policy can
    answer in exactly that many tokens without having to discover the end-of-sequence token. ``max_sum``
    keeps only pairs whose sum is at most that (``max_sum=9``: single-digit operands *and* results).
    ``unary=True`` writes the operands as tally marks (``"|||+|||||="`` → ``"8"``): every held-out pair then
    has a sum the model has seen written as other tallies, which is what lets a tiny model generalise to
    unseen pairs within minutes (with decimal operands it memorises the training pairs first).
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)
             if max_sum is None or a + b <= max_sum]
    train, held = _split(pairs, heldout_frac, seed)

    def rec(a, b):
        ans = str(a + b) if answer_width is None else str(a + b).zfill(answer_width)
        text = f"{'|' * a}+{'|' * b}=" if unary else f"{a}+{b}="
        return Prompt(prompt=text, answer=ans, domain="addition", uid=f"add-{a}-{b}")

    return [rec(*p) for p in train], [rec(*p) for p in held]


@_task("reverse")
def reverse(length: int = 3, alphabet: str = "abcde", heldout_frac: float = 0.2, seed: int = 1234,
            num: int = 125, **_) -> tuple[list, list]:
    """``"rev abc:"`` → ``"cba"``: string reversal over a small alphabet (a second domain for routing)."""
    rng = random.Random(seed)
    words: set[str] = set()
    limit = len(alphabet) ** length
    while len(words) < min(num, limit):
        words.add("".join(rng.choice(alphabet) for _ in range(length)))
    train, held = _split(sorted(words), heldout_frac, seed)

    def rec(w):
        return Prompt(prompt=f"rev {w}:", answer=w[::-1], domain="reverse", uid=f"rev-{w}")

    return [rec(w) for w in train], [rec(w) for w in held]


def get_task(name: str, **kwargs) -> tuple[list[Prompt], list[Prompt]]:
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not a built-in task; valid names: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)
