"""Verifiable rewards: exact answers, math answers (``math-verify``), format shaping."""
from __future__ import annotations

import re
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
    """Math answer equivalence with ``math-verify`` (LaTeX / plain expressions; ``\\boxed{}`` is extracted).

    Returns 1.0 if the completion's answer is mathematically equal to ``prompt.answer``. A parse failure of
    the *completion* is a wrong answer (0.0); a parse failure of the *gold answer* is an infrastructure
    error (``ok=False``): the data is broken, not the policy.
    """

    name = "math"

    def __init__(self, timeout_s: float | None = None):
        from math_verify import parse, verify  # core dependency; imported lazily to keep startup fast

        self._parse, self._verify = parse, verify
        self.timeout_s = timeout_s

    def __call__(self, prompt: Any, completion: str) -> RewardResult:
        kw = {} if self.timeout_s is None else {"parsing_timeout": self.timeout_s}
        gold_text = _answer_of(prompt)
        gold = self._parse(gold_text if "$" in gold_text or "\\" in gold_text else f"${gold_text}$", **kw)
        if not gold:
            return RewardResult(0.0, ok=False, info={"gold_parse_error": 1.0})
        pred = self._parse(completion, **kw)
        if not pred:
            return RewardResult(0.0)
        return RewardResult(float(bool(self._verify(gold, pred))))
