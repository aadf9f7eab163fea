"""A failing reward's ``RewardErrorWarning`` points at the reward (its file and the line of its ``def``), so the
printed warning shows the user's function, not the lit_rl line that called the pool (in a run: the rollout
scorer's ``rb = self.rewards.score(...)``)."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from lit_rl.rewards import RewardErrorWarning, RewardPool

REWARDS = """\
import math


def accuracy(completions, **kwargs):
    return [1.0 for _ in completions]


def fragile(completions, solution, **kwargs):
    return [1.0 / (len(c) - len(c)) for c in completions]


class PerRow:
    def __call__(self, prompt, completion):
        return math.log(-1.0)
"""


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    path = tmp_path / "user_rewards.py"
    path.write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_rewards", raising=False)
    yield importlib.import_module("user_rewards"), str(path)
    sys.modules.pop("user_rewards", None)


def _warnings(pool: RewardPool, n: int = 2) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        pool.score([{"prompt": "q", "solution": "1"}] * n, ["a"] * n)
    pool.close()
    return [w for w in rec if issubclass(w.category, RewardErrorWarning)]


def test_a_trl_reward_that_raises_is_shown_at_its_def(rewards_module):
    mod, path = rewards_module
    pool = RewardPool({"acc": mod.accuracy, "fragile": mod.fragile}, max_invalid_frac=None)
    (w,) = _warnings(pool)
    assert (w.filename, w.lineno) == (path, 8)  # def fragile(...)
    shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    assert shown.splitlines()[1].strip() == "def fragile(completions, solution, **kwargs):"


def test_a_per_row_reward_object_is_shown_at_its_call(rewards_module):
    mod, path = rewards_module
    pool = RewardPool({"row": mod.PerRow()}, max_invalid_frac=None)
    (w,) = _warnings(pool)
    assert (w.filename, w.lineno) == (path, 13)  # def __call__(self, prompt, completion)
    assert "2/2 rows have no reward" in str(w.message)
