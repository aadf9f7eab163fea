"""RetryRepoEnv with scripted policies: correct fix, wrong fixes, test tampering, partial fractions, tools."""

from __future__ import annotations

import shutil

import pytest
from _timing import FINISH_S

from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits
from lit_rl.rollout.env import RETRY_FIXED, RETRY_SOURCE, Environment, RetryRepoEnv

WRONG_DEFAULT_KEPT = RETRY_SOURCE.replace(
    'config.get("retries") or DEFAULT_RETRIES', 'config.get("retries", DEFAULT_RETRIES)'
)  # None -> None: 3/4
WRONG_ZERO_DEFAULT = RETRY_SOURCE.replace(
    'config.get("retries") or DEFAULT_RETRIES', 'config.get("retries", 0)'
)  # {} -> 0, None -> None: 2/4


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(cpu_s=2, memory_mb=300), timeout_s=FINISH_S)


def _env(sandbox, mode="binary"):
    # binary mode stops at the first failing test (the score is 0 either way); partial runs all four. The
    # budget is FINISH_S: with 5 s, one stalled interpreter start on a loaded machine left later tests unrun
    # (partial 0.25 instead of 0.875); nothing here hangs, so only the scores are tested, not the speed.
    return RetryRepoEnv(
        mode, verifier=CodeTestsReward(mode, timeout_s=FINISH_S, sandbox=sandbox, fail_fast=mode == "binary")
    )


def _play(env, actions):
    env.reset()
    out = [env.step(a) for a in actions]
    return out[-1]


def test_is_an_environment(sandbox):
    assert isinstance(_env(sandbox), Environment)


def test_correct_fix_scores_one(sandbox):
    obs, reward, done, info = _play(_env(sandbox), ["write_file retry.py\n" + RETRY_FIXED, "submit"])
    assert (obs, reward, done, info) == (
        "submitted: 4/4 tests passed",
        1.0,
        True,
        {"passed": 8.0, "total": 8.0, "infra_error": 0.0},
    )


# partial = passed / 8 over the 4 visible tests and the 4 held-out checks (hand-counted per source):
# unfixed fails zero and zero-with-other-keys; default_kept fails None; zero_default fails {}, None, other-keys-only
@pytest.mark.parametrize(
    "source, partial",
    [(RETRY_SOURCE, 0.75), (WRONG_DEFAULT_KEPT, 0.875), (WRONG_ZERO_DEFAULT, 0.625)],
    ids=["unfixed", "default_kept", "zero_default"],
)
def test_wrong_fixes_score_zero_binary_and_fraction_partial(sandbox, source, partial):
    actions = ["write_file retry.py\n" + source, "submit"]
    assert _play(_env(sandbox), actions)[1:3] == (0.0, True)
    assert _play(_env(sandbox, "partial"), actions)[1] == partial


@pytest.mark.parametrize(
    "tamper",
    [
        ["delete_file tests/test_retry.py"],
        ["write_file tests/test_retry.py\ndef test_ok():\n    assert True\n"],
        [
            (
                "write_file conftest.py\nimport pytest\n@pytest.hookimpl(tryfirst=True)\n"
                "def pytest_runtest_call(item):\n    return True\n"
            ),
            "write_file tests/conftest.py\nraise SystemExit(0)\n",
        ],
    ],
)
def test_editing_or_deleting_tests_scores_zero(sandbox, tamper):
    # the bug is left in place; only the repository's tests are tampered with
    assert _play(_env(sandbox), [*tamper, "submit"])[1:3] == (0.0, True)
    assert _play(_env(sandbox, "partial"), [*tamper, "submit"])[1] == 0.75  # the verifier's own 8 tests ran


def test_run_tests_reports_per_test_without_reward(sandbox):
    obs, reward, done, info = _play(_env(sandbox, "partial"), ["run_tests"])
    assert obs.split("\n") == [
        "test_zero_disables_retries: FAILED",
        "test_missing_uses_default: PASSED",
        "test_explicit_value_kept: PASSED",
        "test_none_uses_default: PASSED",
        "3/4 tests passed",
    ]
    assert (reward, done, info["passed"]) == (0.0, False, 3.0)


def test_tools_and_bad_actions(sandbox):
    env = _env(sandbox)
    first = env.reset()
    assert first.startswith("Fix the retry setting") and first.endswith(
        "Files: README.md, retry.py, tests/test_retry.py"
    )
    assert env.step("read_file retry.py") == (RETRY_SOURCE, 0.0, False, {})
    assert env.step("read_file nope.py")[0] == "error: no such file nope.py"
    for bad in ("read_file ../../etc/passwd", "read_file /etc/passwd", "write_file", "delete_file ."):
        assert env.step(bad)[0].startswith("error: ") and env.step(bad)[1:3] == (0.0, False)
    assert (
        env.step("rm -rf /")[0]
        == "error: unknown tool 'rm'; tools: read_file, write_file, delete_file, run_tests, submit"
    )
    assert env.step("write_file notes/a.txt\nhello")[0] == "wrote 5 bytes to notes/a.txt"
    assert env.step("read_file notes/a.txt")[0] == "hello\n"
    assert not any(".git" in p or "secret" in p.lower() for p in env.files)
    env.step("submit")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("submit")


def test_infra_error_is_reported_not_scored():
    broken = Sandbox(SandboxLimits(cpu_s=2, memory_mb=300), timeout_s=2.0)
    broken.unshare = shutil.which("false")
    env = RetryRepoEnv(verifier=CodeTestsReward(timeout_s=2.0, sandbox=broken))
    _obs, reward, done, info = _play(env, ["write_file retry.py\n" + RETRY_FIXED, "submit"])
    assert (reward, done, info["infra_error"]) == (0.0, True, 1.0)


def test_bad_mode():
    with pytest.raises(ValueError, match="valid values: binary, partial"):
        RetryRepoEnv("soft")
