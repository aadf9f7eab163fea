"""Built-in synthetic tasks with fixed train / held-out splits (offline, checkable answers).

Each task yields ``Prompt`` records whose ``answer`` is the exact expected completion text (before eos).
Splits are fixed by a seed so the held-out prompts are never trained on.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from lit_rl.data import agent_tasks
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
def addition(
    max_operand: int = 9,
    heldout_frac: float = 0.2,
    seed: int = 1234,
    answer_width: int | None = None,
    max_sum: int | None = None,
    unary: bool = False,
    num_operands: int = 2,
    balance: bool = False,
    **_,
) -> tuple[list, list]:
    """``"a+b="`` → ``"<a+b>"`` for all operand pairs 0..max_operand; held-out pairs are never trained on.

    ``answer_width`` zero-pads answers to a fixed number of digits (``"3+5="`` → ``"08"``), so a policy can
    answer in exactly that many tokens without having to discover the end-of-sequence token. ``max_sum``
    keeps only pairs whose sum is at most that (``max_sum=9``: single-digit operands *and* results).
    ``unary=True`` writes the operands as tally marks (``"|||+|||||="`` → ``"8"``): every held-out pair then
    has a sum the model has seen written as other tallies, which is what lets a tiny model generalise to
    unseen pairs within minutes (with decimal operands it memorises the training pairs first).
    ``num_operands`` adds more terms (``"|+||+|||="`` → ``"6"``: 220 prompts with sums <= 9 instead of 55, so
    every sum has several training prompts). ``balance=True`` repeats training prompts so every answer is
    equally frequent (see ``_balance_by_answer``); held-out prompts are never repeated.
    """
    if num_operands < 2:
        raise ValueError(f"num_operands={num_operands!r} must be >= 2")
    pairs = [
        t
        for t in itertools.product(range(max_operand + 1), repeat=num_operands)
        if max_sum is None or sum(t) <= max_sum
    ]
    train, held = _split(pairs, heldout_frac, seed)

    def rec(*ops):
        s = sum(ops)
        ans = str(s) if answer_width is None else str(s).zfill(answer_width)
        text = "+".join(("|" * a) if unary else str(a) for a in ops) + "="
        return Prompt(prompt=text, answer=ans, domain="addition", uid="add-" + "-".join(map(str, ops)))

    train_recs = [rec(*p) for p in train]
    if balance:
        train_recs = _balance_by_answer(train_recs)
    return train_recs, [rec(*p) for p in held]


def _balance_by_answer(recs: list[Prompt]) -> list[Prompt]:
    """Repeat records so every answer has as many training entries as the most frequent one.

    With several operands the sums are far from uniform (3 operands <= 9: 41 prompts sum to 9, 3 to 1); a
    uniform draw then rarely shows small sums, and early RL drives them all to the answer of their more
    common neighbours with probability ~1 — a group of identical wrong answers has zero reward variance,
    so GRPO never corrects it. Equal answer frequencies keep every answer in play from the start.
    """
    by: dict[str, list[Prompt]] = {}
    for r in recs:
        by.setdefault(r.answer, []).append(r)
    target = max(len(v) for v in by.values())
    out: list[Prompt] = []
    for ans in sorted(by):
        group = by[ans]
        out.extend(group[i % len(group)] for i in range(target))
    return out


@_task("reverse")
def reverse(
    length: int = 3, alphabet: str = "abcde", heldout_frac: float = 0.2, seed: int = 1234, num: int = 125, **_
) -> tuple[list, list]:
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


@_task("chat_addition")
def chat_addition(
    low: int = 10,
    high: int = 99,
    heldout: int = 200,
    seed: int = 1234,
    template: str = "What is {a} + {b}? Reply with only the number.",
    system: str | None = None,
    **_,
) -> tuple[list, list]:
    """Chat prompts ``"What is A + B? Reply with only the number."`` (a user turn, rendered with the
    tokenizer's chat template) for every ordered pair A, B in ``low..high``; the answer is ``str(A + B)``.

    ``heldout`` pairs (a fixed, seeded choice) are never trained on: with the defaults 200 of the 8,100 pairs.
    The answer is the integer only; score it with a reward that reads the completion's last integer
    (``lit_rl.rewards.LastIntReward``), since an instruct model often writes ``"17 + 25 = 42"``.
    ``system`` adds a system turn first.
    """
    if not low <= high:
        raise ValueError(f"chat_addition: low={low} must be <= high={high}")
    pairs = list(itertools.product(range(low, high + 1), repeat=2))
    if not 1 <= heldout < len(pairs):
        raise ValueError(f"chat_addition: heldout={heldout} must be in [1, {len(pairs) - 1}]")
    train, held = _split(pairs, heldout / len(pairs), seed)

    def rec(a, b):
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": template.format(a=a, b=b)}
        ]
        return Prompt(messages=msgs, answer=str(a + b), domain="addition", uid=f"chatadd-{a}-{b}")

    return [rec(*p) for p in train], [rec(*p) for p in held]


def _chat(template: str, system: str | None, **fields) -> list[dict[str, str]]:
    """One user turn (after an optional system turn) filled from ``template``."""
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": template.format(**fields)}
    ]


def _held_count(task: str, heldout: int, total: int) -> float:
    if not 1 <= heldout < total:
        raise ValueError(f"{task}: heldout={heldout} must be in [1, {total - 1}]")
    return heldout / total


@_task("chat_multiply_digit")
def chat_multiply_digit(
    low: int = 10,
    high: int = 99,
    heldout: int = 100,
    seed: int = 1234,
    template: str = "What is {a} x {b}? Reply with only the number.",
    system: str | None = None,
    **_,
) -> tuple[list, list]:
    """Chat prompts ``"What is A x D? Reply with only the number."`` for A in ``low..high`` and a digit D in
    2..9 (domain ``multiplication``); the answer is ``str(A * D)``. ``heldout`` pairs (seeded) are never
    trained on: with the defaults 100 of the 720. Score with ``LastIntReward``."""
    if not low <= high:
        raise ValueError(f"chat_multiply_digit: low={low} must be <= high={high}")
    pairs = list(itertools.product(range(low, high + 1), range(2, 10)))
    train, held = _split(pairs, _held_count("chat_multiply_digit", heldout, len(pairs)), seed)

    def rec(a, b):
        return Prompt(
            messages=_chat(template, system, a=a, b=b),
            answer=str(a * b),
            domain="multiplication",
            uid=f"chatmul-{a}-{b}",
        )

    return [rec(*p) for p in train], [rec(*p) for p in held]


@_task("chat_compare")
def chat_compare(
    low: int = 10,
    high: int = 99,
    heldout: int = 200,
    seed: int = 1234,
    template: str = "Which is larger, {a} or {b}? Reply with only the number.",
    system: str | None = None,
    **_,
) -> tuple[list, list]:
    """Chat prompts ``"Which is larger, A or B? Reply with only the number."`` for every ordered pair of
    distinct A, B in ``low..high`` (domain ``compare``); the answer is ``str(max(A, B))``, first or second
    equally often. ``heldout`` pairs (seeded) are never trained on. Score with ``LastIntReward``."""
    if not low < high:
        raise ValueError(f"chat_compare: low={low} must be < high={high} (two distinct numbers)")
    pairs = [(a, b) for a, b in itertools.product(range(low, high + 1), repeat=2) if a != b]
    train, held = _split(pairs, _held_count("chat_compare", heldout, len(pairs)), seed)

    def rec(a, b):
        return Prompt(
            messages=_chat(template, system, a=a, b=b),
            answer=str(max(a, b)),
            domain="compare",
            uid=f"chatcmp-{a}-{b}",
        )

    return [rec(*p) for p in train], [rec(*p) for p in held]


@_task("chat_largest")
def chat_largest(
    count: int = 4,
    low: int = 10,
    high: int = 99,
    size: int = 8100,
    heldout: int = 200,
    seed: int = 1234,
    system: str | None = None,
    **_,
) -> tuple[list, list]:
    """Chat prompts ``"Which is the largest of A, B, C and D? Reply with only the number."`` (domain
    ``largest``): ``count`` distinct numbers in ``low..high``; the answer is ``str(max(...))``.

    The ordered tuples are too many to list (90^4 with the defaults), so ``size`` distinct ones are drawn with
    ``seed`` (8,100 by default, as many as ``chat_addition``'s pairs, so ``chat_mixed`` cuts neither) and
    ``heldout`` of them (seeded) are never trained on. Four numbers put a guess at 1/4; SmolLM2-135M-Instruct
    starts below 0.4 greedy. Score with ``LastIntReward``."""
    if count < 2:
        raise ValueError(f"chat_largest: count={count} must be >= 2")
    if high - low + 1 < count:
        raise ValueError(f"chat_largest: low..high={low}..{high} holds fewer than count={count} numbers")
    space = 1
    for k in range(count):
        space *= high - low + 1 - k
    if not 2 <= size <= space:
        raise ValueError(f"chat_largest: size={size} must be in [2, {space}] (distinct ordered tuples)")
    rng, seen = random.Random(seed), set[tuple[int, ...]]()
    while len(seen) < size:
        seen.add(tuple(rng.sample(range(low, high + 1), count)))
    tuples = sorted(seen)
    train, held = _split(tuples, _held_count("chat_largest", heldout, len(tuples)), seed)

    def rec(t):
        listed = ", ".join(map(str, t[:-1])) + f" and {t[-1]}"
        return Prompt(
            messages=_chat("Which is the largest of {n}? Reply with only the number.", system, n=listed),
            answer=str(max(t)),
            domain="largest",
            uid="chatmax-" + "-".join(map(str, t)),
        )

    return [rec(t) for t in train], [rec(t) for t in held]


# domain -> the single-domain task that makes its prompts (chat_mixed draws from these)
DOMAIN_TASKS = {
    "addition": "chat_addition",
    "multiplication": "chat_multiply_digit",
    "compare": "chat_compare",
    "largest": "chat_largest",
}


@_task("chat_mixed")
def chat_mixed(
    domains: list[str] | tuple[str, ...] = ("addition", "multiplication"),
    heldout: int = 64,
    seed: int = 1234,
    system: str | None = None,
    train_domains: list[str] | tuple[str, ...] | None = None,
    **_,
) -> tuple[list, list]:
    """The chat tasks of several ``domains`` in one prompt set, each ``Prompt.domain`` set (TeacherRouter
    routes by it; HeldoutEval logs ``eval/accuracy/<domain>``).

    Each domain's prompts come from its own task (``DOMAIN_TASKS``) called with the same ``heldout`` and
    ``seed``, so a domain's held-out prompts here are exactly those of its single-domain task: an expert
    trained on ``chat_multiply_digit`` with ``heldout: 64`` never saw the mixed task's held-out products.
    Training prompts are cut to the smallest domain's count (a seeded choice), so every domain is drawn
    equally often; the held-out set is ``heldout`` prompts per domain. ``train_domains`` (a subset of
    ``domains``) keeps the training prompts of those only, the held-out set still covering every domain: an
    expert trained on one domain is then measured on the others too (what it forgets).
    """
    domains = list(domains)
    unknown = [d for d in domains if d not in DOMAIN_TASKS]
    if unknown or not domains:
        raise ValueError(
            f"chat_mixed: domains={domains!r}; each must be one of {', '.join(DOMAIN_TASKS)} (at least one)"
        )
    if len(set(domains)) != len(domains):
        raise ValueError(f"chat_mixed: domains={domains!r} names a domain twice")
    trained = domains if train_domains is None else list(train_domains)
    if not trained or set(trained) - set(domains):
        raise ValueError(
            f"chat_mixed: train_domains={trained!r} must be a non-empty subset of domains={domains!r}"
        )
    splits = {d: TASKS[DOMAIN_TASKS[d]](heldout=heldout, seed=seed, system=system) for d in domains}
    n = min(len(splits[d][0]) for d in trained)
    rng = random.Random(seed)
    train = [p for d in domains if d in trained for p in rng.sample(splits[d][0], n)]
    return train, [p for d in domains for p in splits[d][1]]


# the tool-using agents' tasks (their own module: lit_rl.data.agent_tasks)
TASKS.update(
    {
        "agent_guess": agent_tasks.agent_guess,
        "agent_lookup": agent_tasks.agent_lookup,
        "agent_multiply": agent_tasks.agent_multiply,
    }
)


def get_task(name: str, **kwargs) -> tuple[list[Prompt], list[Prompt]]:
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not a built-in task; valid names: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)
