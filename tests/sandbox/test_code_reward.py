"""CodeTestsReward: verdicts, binary/partial scores, infra masking, test validation, RewardPool integration."""

from __future__ import annotations

import json
import shutil

import pytest
from _timing import FINISH_S

from lit_rl.data.prompts import Prompt
from lit_rl.rewards.code import CodeTestsReward, extract_code, json_equal
from lit_rl.rewards.pool import RewardPool
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

TESTS = [
    {"call": "add", "args": [2, 3], "expected": 5},
    {"call": "add", "args": [-7, 4], "expected": -3},
    {"call": "add", "kwargs": {"a": 0.1, "b": 0.2}, "expected": 0.3},
    {"stdin": "40 2\n", "stdout": "42\n"},
]
GOOD = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
HALF = "def add(a, b):\n    return 5 if a == 2 else a - b\n\nif __name__ == '__main__':\n    print(42)\n"  # 2 of 4


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(cpu_s=2, memory_mb=300), timeout_s=FINISH_S)


# Budgets of FINISH_S (tests/_timing.py): the verdicts below must not depend on how loaded the machine is
@pytest.fixture(scope="module")
def partial(sandbox):
    return CodeTestsReward("partial", timeout_s=FINISH_S, sandbox=sandbox)


@pytest.fixture(scope="module")
def binary(sandbox):
    return CodeTestsReward("binary", timeout_s=FINISH_S, sandbox=sandbox)


def test_correct_solution_scores_one_in_both_modes(partial, binary):
    prompt = Prompt(prompt="write add", metadata={"tests": TESTS})
    for r in (partial, binary):
        res = r(prompt, GOOD)
        assert (res.score, res.ok) == (1.0, True)
        assert {
            k: res.info[k] for k in ("passed", "total", "pass_rate", "failed", "infra_errors", "no_code")
        } == {
            "passed": 4.0,
            "total": 4.0,
            "pass_rate": 1.0,
            "failed": 0.0,
            "infra_errors": 0.0,
            "no_code": 0.0,
        }


def test_partial_fraction_and_binary_zero(partial, binary):
    res = partial({"tests": TESTS}, HALF)
    assert (res.score, res.ok, res.info["passed"], res.info["failed"]) == (0.5, True, 2.0, 2.0)
    assert binary({"tests": TESTS}, HALF).score == 0.0


def test_per_test_verdicts_and_reasons(partial):
    code = (
        "import sys\ndef add(a, b):\n    if a == 2: raise ValueError('boom')\n    if a == -7: return True\n"
        "    return 0.30000001\nif __name__ == '__main__':\n    print(42); sys.exit(1)\n"
    )
    rep = partial.run_tests({"solution.py": code}, TESTS)
    assert rep.outcomes == ["fail", "fail", "pass", "fail"]
    assert rep.details[0].startswith("raised ValueError: boom")
    assert rep.details[1] == "wrong value"  # True is not -3 (and bool is never an int here)
    assert rep.details[3] == "exited (exit 1)"  # right output, non-zero exit: a runtime error


def test_stdio_whitespace_normalisation(partial):
    tests = [{"stdin": "", "stdout": "a b\n1\n"}]
    assert partial({"tests": tests}, "print('a b   ')\nprint(1)\nprint()\n").score == 1.0
    assert partial({"tests": tests}, "print('a  b')\nprint(1)\n").score == 0.0


def test_timeout_is_a_fail_not_infra(sandbox):
    # a sleeping hang (it times out at any machine speed): a busy loop may hit the CPU rlimit (also a fail) first
    hang = "def add(a, b):\n    import time\n    time.sleep(100)\n"
    res = CodeTestsReward("partial", timeout_s=2.0, sandbox=sandbox)({"tests": TESTS[:1]}, hang)
    assert (res.score, res.ok, res.info["timeouts"], res.info["failed"]) == (0.0, True, 1.0, 1.0)


def test_infra_error_is_masked_not_scored(sandbox):
    broken = Sandbox(SandboxLimits(cpu_s=2, memory_mb=300), timeout_s=2.0)
    broken.unshare = shutil.which(
        "false"
    )  # every sandbox start now fails: the infrastructure, not the answer
    res = CodeTestsReward("partial", sandbox=broken)({"tests": TESTS}, GOOD)
    assert (res.score, res.ok, res.info["infra_errors"], res.info["passed"]) == (0.0, False, 4.0, 0.0)
    assert res.error.startswith("code sandbox could not run the tests: sandbox launcher exited (rc=1)")


def test_fail_fast_skips_after_first_failure(sandbox):
    r = CodeTestsReward("binary", timeout_s=FINISH_S, sandbox=sandbox, fail_fast=True)
    rep = r.run_tests({"solution.py": "def add(a, b):\n    return 0\n"}, TESTS)
    assert rep.outcomes == ["fail"] * 4 and rep.skipped == 3
    assert r.score_report(rep).info["skipped"] == 3.0


def test_expected_values_never_enter_the_sandbox(partial):
    calls = []
    real = partial.sandbox.run

    def spy(argv, files=None, stdin=b"", timeout_s=None):
        calls.append((argv, files, stdin))
        return real(argv, files=files, stdin=stdin, timeout_s=timeout_s)

    partial.sandbox.run = spy
    try:
        partial(
            {
                "tests": [
                    {"call": "add", "args": [1, 2], "expected": 987654321},
                    {"call": "add", "args": [5, 6], "expected": 123456789},
                ]
            },
            GOOD,
        )
    finally:
        del partial.sandbox.run
    assert len(calls) == 2
    for (argv, files, stdin), args in zip(calls, ([1, 2], [5, 6])):
        blob = json.dumps(argv) + "".join(files.values()) + str(stdin)
        assert "987654321" not in blob and "123456789" not in blob and '"expected"' not in blob
        spec = json.loads(files["_harness/spec.json"])
        assert spec["args"] == args and set(spec) == {"nonce", "kind", "module", "call", "args", "kwargs"}


def test_code_extraction_and_no_code():
    text = "Here:\n```python\nx = 1\n```\nand better:\n```py\ndef add(a, b):\n    return a + b\n```\n"
    assert extract_code(text) == "def add(a, b):\n    return a + b\n"
    assert extract_code("def f(): pass") == "def f(): pass"
    assert extract_code("no fences", require_block=True) is None


def test_no_code_block_scores_zero_without_running(sandbox):
    r = CodeTestsReward("binary", sandbox=sandbox, require_code_block=True)
    res = r({"tests": TESTS}, "I would write add(a, b) = a + b")
    assert (res.score, res.ok, res.info["no_code"], res.info["total"]) == (0.0, True, 1.0, 4.0)


@pytest.mark.parametrize(
    "got, expected, equal",
    [
        (5, 5, True),
        (5.0, 5, True),
        (True, 1, False),
        (1, True, False),
        (0.30000001, 0.3, True),
        (0.31, 0.3, False),
        ([1, [2, "a"]], [1, [2, "a"]], True),
        ([1, 2], [1, 2, 3], False),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"b": 1}, False),
        ("5", 5, False),
        (None, None, True),
        (None, 0, False),
        (float("nan"), 0.0, False),
        (float("inf"), float("inf"), False),
    ],
)
def test_json_equal(got, expected, equal):
    assert json_equal(got, expected, 1e-6) is equal


@pytest.mark.parametrize(
    "tests, match",
    [
        ([], "has no tests"),
        ([{"call": "add", "args": [1]}], "test 0: a call test needs 'expected'"),
        ([{"stdin": "1"}], "test 0: a stdio test needs 'stdout'"),
        ([{"foo": 1}], "test 0: need 'call'"),
        ([{"call": "f", "expected": {1, 2}}], "JSON-serialisable"),
    ],
)
def test_malformed_tests_raise(partial, tests, match):
    with pytest.raises(ValueError, match=match):
        partial({"tests": tests}, GOOD)


def test_non_dict_test_is_a_type_error(partial):
    with pytest.raises(TypeError, match="test 0: expected a dict, got str"):
        partial({"tests": ["x"]}, GOOD)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "soft"}, "valid values: binary, partial"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"mode": "partial", "fail_fast": True}, "fail_fast=True needs mode='binary'"),
        ({"entry_file": "_x.py"}, "entry_file"),
        ({"float_tol": 2.0}, "float_tol"),
        ({"budget": "soft"}, "valid values: program, per_test"),
        ({"start_allowance_s": 2}, "start_allowance_s"),
        ({"test_timeout_s": 0}, "test_timeout_s"),
    ],
)
def test_bad_config(sandbox, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CodeTestsReward(sandbox=sandbox, **kwargs)


def test_harness_file_names_are_reserved(partial):
    with pytest.raises(ValueError, match="collides with the harness"):
        partial.run_tests({"_harness/runner.py": "print(1)"}, TESTS[:1])


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_inside_reward_pool(partial, executor):
    pool = RewardPool({"code": partial}, timeout_s=30.0, num_workers=2, executor=executor)
    try:
        prompts = [Prompt(prompt="p", metadata={"tests": TESTS})] * 3
        batch = pool.score(prompts, [GOOD, HALF, "import os\nos._exit(0)\n"])
    finally:
        pool.close()
    assert batch.total.tolist() == [1.0, 0.5, 0.0] and batch.valid.tolist() == [True, True, True]
    assert batch.metrics["reward/infra_errors"] == 0.0
