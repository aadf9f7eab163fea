"""Verifiable rewards: exact answers, math answers (``math-verify``), format shaping."""

from __future__ import annotations

import math
import re
import threading
from typing import Any

from lit_rl.rewards.base import RewardResult


def _answer_of(prompt: Any) -> str:
    ans = getattr(prompt, "answer", None)
    if ans is None:
        raise ValueError(f"prompt {getattr(prompt, 'uid', prompt)!r} has no 'answer' to verify against")
    return str(ans)


class ExactAnswerReward:
    """1.0 when the completion (whitespace-stripped) equals ``prompt.answer``, else 0.0."""

    name = "exact"

    def __call__(self, prompt: Any, completion: str) -> float:
        return float(completion.strip() == _answer_of(prompt).strip())


_INT = re.compile(r"-?\d+")


class LastIntReward:
    """1.0 when the last integer in the completion equals ``prompt.answer`` (an integer), else 0.0.

    For instruct models that answer in a sentence (``"17 + 25 = 42"`` scores 1 for 42). Thousands separators
    are not read (``"1,024"`` ends in 24); no integer at all scores 0. A gold answer that is not an integer is
    a data error (``ok=False``), not a wrong completion.
    """

    name = "last_int"

    def __call__(self, prompt: Any, completion: str) -> float | RewardResult:
        gold = _answer_of(prompt).strip()
        try:
            want = int(gold)
        except ValueError:
            return RewardResult(0.0, ok=False, error=f"gold answer {gold[:80]!r} is not an integer")
        found = _INT.findall(completion)
        return float(bool(found) and int(found[-1]) == want)  # a plain float: usable as HeldoutEval's scorer


class PrefixMatchReward:
    """Partial credit: fraction of the answer's characters matched from the left, scaled by ``weight``;
    a completion longer than the answer loses the excess (shaping for from-scratch tasks)."""

    name = "prefix"

    def __call__(self, prompt: Any, completion: str) -> float:
        ans, out = _answer_of(prompt).strip(), completion.strip()
        n = 0
        for a, b in zip(ans, out):
            if a != b:
                break
            n += 1
        excess = max(0, len(out) - len(ans))
        return max(0.0, (n - excess) / max(len(ans), 1))


class RegexFormatReward:
    """1.0 when the whole completion matches ``pattern`` (e.g. digits only), else 0.0."""

    name = "format"

    def __init__(self, pattern: str = r"\s*-?\d+\s*"):
        self.pattern = re.compile(pattern)

    def __call__(self, prompt: Any, completion: str) -> float:
        return float(self.pattern.fullmatch(completion) is not None)


class MathAnswerReward:
    r"""Math answer equivalence with ``math-verify`` (LaTeX / plain expressions; ``\boxed{}`` is extracted).

    Returns 1.0 if the completion's answer is mathematically equal to ``prompt.answer``. A parse failure of
    the *completion* is a wrong answer (0.0); a parse failure of the *gold answer* is an infrastructure
    error (``ok=False``): the data is broken, not the policy.

    Threads: math-verify enforces its timeout with ``signal.alarm``, which only works in a process's main
    thread, and refuses to run anywhere else. So the class declares ``executor = "process"`` (the default
    ``RewardPool(executor="auto")`` then scores it in forked worker processes, whose main thread runs the call
    and where the pool can kill a hung sympy call), and when it is called outside the main thread anyway
    (``executor: thread``) it switches math-verify's own timeout off and relies on the pool's ``timeout_s``.

    Args:
        timeout_s: math-verify's per-parse / per-comparison limit (main thread only); None: its defaults.
    """

    name = "math"
    executor = "process"  # read by RewardPool(executor="auto")

    def __init__(self, timeout_s: float | None = None):
        from math_verify import parse, verify  # core dependency; imported lazily to keep startup fast

        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"MathAnswerReward.timeout_s must be > 0 or None, got {timeout_s}")
        self._parse, self._verify = parse, verify
        self.timeout_s = timeout_s

    def _limits(self) -> tuple[dict, dict]:
        if threading.current_thread() is not threading.main_thread():
            return {"parsing_timeout": None}, {"timeout_seconds": None}  # the pool's timeout applies instead
        if self.timeout_s is None:
            return {}, {}
        t = max(1, math.ceil(self.timeout_s))  # signal.alarm counts whole seconds
        return {"parsing_timeout": t}, {"timeout_seconds": t}

    def __call__(self, prompt: Any, completion: str) -> RewardResult:
        parse_kw, verify_kw = self._limits()
        gold_text = _answer_of(prompt)
        # math-verify extracts LaTeX only inside delimiters: a bare "\\sqrt{4}" or "1/2" gold answer is wrapped
        delimited = any(d in gold_text for d in ("$", "\\boxed", "\\[", "\\("))
        gold = self._parse(gold_text if delimited else f"${gold_text}$", **parse_kw)
        if not gold:
            return RewardResult(
                0.0,
                ok=False,
                info={"gold_parse_error": 1.0},
                error=f"gold answer {gold_text[:80]!r} did not parse with math-verify",
            )
        pred = self._parse(completion, **parse_kw)
        if not pred:
            return RewardResult(0.0)
        return RewardResult(float(bool(self._verify(gold, pred, **verify_kw))))
