"""Tasks for the tool-using agents (``lit_rl.rollout.agent_envs``): fixed, seeded train / held-out splits.

- ``agent_multiply``: "What is A * B?" for ``digits``-digit A, B (3: 100..999, beyond a small model's mental
  arithmetic); ``answer`` the product, ``metadata`` A and B. ``train`` distinct pairs are drawn, and
  ``heldout`` more, never among them.
- ``agent_guess``: find a hidden number in ``lo..lo+width-1`` (``lo`` in 1..``max_lo``); ``answer`` the number,
  ``metadata`` ``lo``, ``hi``, ``target`` (``GuessGame.reset`` reads them). Every (lo, target) instance is
  listed; ``heldout`` of them (seeded) are never trained on.
- ``agent_lookup``: "What is the access code of the Varnholt archive?" about a made-up place (a name from
  ``NAME_HEADS`` x ``NAME_TAILS`` and a kind from ``KINDS``); ``answer`` its 4-digit code, ``metadata`` the
  place's ``title``, ``code`` and the instance's document store ``docs`` (``{id, title, text}``: the place and
  ``distractors`` others: the same name of another kind, another name of the same kind, unrelated ones), which
  ``LookupEnv``'s ``DocStore.reset`` reads. The held-out instances' names are never in a training instance
  (not as a distractor either): held-out facts are about places training never saw.
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


def _record(text: str, system: str | None, answer: object, domain: str, metadata: dict, uid: str) -> Prompt:
    """One instance: the task as a user turn (after ``system`` when given), its answer as a string."""
    return Prompt(messages=_chat(text, system), answer=str(answer), domain=domain, metadata=metadata, uid=uid)


def _split(items: list, heldout: int, rec) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out): the first ``heldout`` items are held out, the rest are trained on."""
    return [rec(*p) for p in items[heldout:]], [rec(*p) for p in items[:heldout]]


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
        return _record(
            template.format(a=a, b=b), system, a * b, "multiply", {"a": a, "b": b}, f"agentmul-{a}-{b}"
        )

    return _split(pairs, heldout, rec)


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
        meta = {"lo": lo, "hi": hi, "target": target}
        return _record(
            template.format(lo=lo, hi=hi), system, target, "guess", meta, f"agentguess-{lo}-{target}"
        )

    return _split(items, heldout, rec)


LOOKUP_TEMPLATE = "What is the access code of the {title}?"
# made-up place names (head + tail: 20 x 12 = 240) and kinds; none is a real place a model could know
NAME_HEADS = (
    "Varn", "Quel", "Dros", "Merr", "Tav", "Ost", "Belk", "Kor", "Fenn", "Lud",
    "Sarv", "Wex", "Gil", "Norr", "Pell", "Rim", "Thal", "Yor", "Zan", "Brav",
)  # fmt: skip
NAME_TAILS = ("holt", "mere", "vik", "by", "dale", "wick", "stead", "gard", "moor", "ton", "ford", "lund")
KINDS = ("archive", "observatory", "lighthouse", "library", "foundry", "museum", "mill", "vault")


def _doc(rng: random.Random, name: str, kind: str, code: int) -> dict[str, str]:
    """A document about one place: its title and a text with three numbers, the code between the others."""
    title = f"{name} {kind}"
    text = (
        f"The {title} was founded in {rng.randint(1650, 1990)}. Its access code is {code}. "
        f"It keeps {rng.randint(20, 900)} records."
    )
    return {"title": title, "text": text}


def agent_lookup(
    train: int = 1600,
    heldout: int = 200,
    heldout_names: int = 40,
    distractors: int = 4,
    seed: int = 1234,
    template: str = LOOKUP_TEMPLATE,
    system: str | None = None,
    **_,
) -> tuple[list[Prompt], list[Prompt]]:
    """Look-up instances, each with its own document store (module doc); the answer is the 4-digit code."""
    names = [h + t for h in NAME_HEADS for t in NAME_TAILS]
    if not 1 <= heldout_names < len(names):
        raise ValueError(f"agent_lookup: heldout_names={heldout_names} must be in [1, {len(names) - 1}]")
    if not 2 <= distractors <= 8:
        raise ValueError(f"agent_lookup: distractors={distractors} must be in 2..8")
    rng = random.Random(seed)
    rng.shuffle(names)
    pools = {"held": names[:heldout_names], "train": names[heldout_names:]}
    sizes = {"held": heldout, "train": train}
    for part, pool in pools.items():
        if not 1 <= sizes[part] <= len(pool) * len(KINDS):
            raise ValueError(
                f"agent_lookup: {part if part == 'train' else 'heldout'}={sizes[part]} must be in "
                f"[1, {len(pool) * len(KINDS)}] ({len(pool)} names x {len(KINDS)} kinds)"
            )

    def instance(pool: list[str], name: str, kind: str) -> tuple[str, int, list[dict[str, str]]]:
        code = rng.randint(1000, 9999)
        others = [(name, rng.choice([k for k in KINDS if k != kind]))]  # same name, another kind
        others.append((rng.choice([n for n in pool if n != name]), kind))  # same kind, another name
        while len(others) < distractors:
            o = (rng.choice(pool), rng.choice(KINDS))
            if o != (name, kind) and o not in others:
                others.append(o)
        docs = [_doc(rng, name, kind, code)] + [_doc(rng, n, k, rng.randint(1000, 9999)) for n, k in others]
        rng.shuffle(docs)
        ids = rng.sample(range(100, 1000), len(docs))
        return f"{name} {kind}", code, [{"id": f"D{i}", **d} for i, d in zip(ids, docs)]

    out = {}
    for part, pool in pools.items():
        pairs = [(n, k) for n in pool for k in KINDS]
        rng.shuffle(pairs)
        out[part] = [instance(pool, n, k) for n, k in pairs[: sizes[part]]]

    def rec(title: str, code: int, docs: list[dict[str, str]]) -> Prompt:
        meta = {"title": title, "code": code, "docs": docs}
        return _record(template.format(title=title), system, code, "lookup", meta, f"agentlookup-{title}")

    return _split(out["held"] + out["train"], heldout, rec)
