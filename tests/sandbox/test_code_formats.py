"""CodeTestsReward (issue 17): one wall budget per program, the extraction rule, assert/check tests framed
by the harness, mixing all test kinds, and the JSONL loader with its bundled samples."""

from __future__ import annotations

import json

import pytest

from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.code_tasks import SAMPLES, load_code_tasks, record_to_prompt
from lit_rl.rewards.extract import extract_program
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

CALL5 = [{"call": "add", "args": [i, 1], "expected": i + 1} for i in range(5)]
HANG = "def add(a, b):\n    while True:\n        pass\n"
ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(cpu_s=3, memory_mb=300), timeout_s=3.0)


def _reward(sandbox, **kw):
    kw.setdefault("timeout_s", 5.0)  # generous: only the hang tests below depend on the budget
    return CodeTestsReward(kw.pop("mode", "partial"), sandbox=sandbox, **kw)


# ---------------------------------------------------------------- defect 3: one wall budget per program
def test_a_hang_costs_one_budget_whatever_the_number_of_tests(sandbox):
    rep = _reward(sandbox, timeout_s=0.6).run_tests({"solution.py": HANG}, CALL5)
    assert rep.outcomes == ["fail"] * 5 and (rep.timeouts, rep.budget_exhausted) == (1, 4)
    assert (
        0.6 <= rep.program_s <= 0.6 + 1.0
    )  # the sandbox's own clock: timeout (+ 0.25 s start allowance) + kill
    assert rep.wall_s <= 0.6 + 1.0 + 1.5  # and the caller's (one sandbox start, generous for a loaded CI)
    # the old behaviour, kept as budget="per_test" for the benchmark: every test waits out its own timeout
    old = _reward(sandbox, timeout_s=0.6, budget="per_test").run_tests({"solution.py": HANG}, CALL5)
    assert (old.timeouts, old.budget_exhausted) == (5, 0) and old.program_s >= 5 * 0.6


def test_per_test_limit_inside_the_budget(sandbox):
    rep = _reward(sandbox, timeout_s=3.0, test_timeout_s=0.4).run_tests({"solution.py": HANG}, CALL5[:3])
    assert (rep.timeouts, rep.budget_exhausted) == (3, 0) and rep.program_s < 3.0


def test_passing_program_runs_every_test_inside_one_budget(sandbox):
    # The budget is generous on purpose: with 2.0 s the 5th test ran out of it beside a CPU hog (stress-ng, 2
    # workers on 2 cores). What is tested is the accounting, not the machine's speed: every test ran and passed,
    # none timed out, none was skipped for an exhausted budget, and the time charged lies inside the budget.
    rep = _reward(sandbox, timeout_s=30.0).run_tests({"solution.py": ADD}, CALL5)
    assert rep.outcomes == ["pass"] * 5
    assert (rep.timeouts, rep.budget_exhausted) == (0, 0)
    assert 0.0 < rep.program_s < 30.0


SLOW_START = "import time\ntime.sleep(0.5)\n" + ADD  # stands in for an interpreter start on a loaded machine


def test_interpreter_start_allowance_is_not_charged(sandbox):
    # 5 tests x >= 0.5 s each: charged in full they overrun a 2 s budget; less the allowance they fit (with
    # 0.4 s per test to spare for the machine's own start-up time)
    rep = _reward(sandbox, timeout_s=2.0, start_allowance_s=0.5).run_tests({"solution.py": SLOW_START}, CALL5)
    assert rep.outcomes == ["pass"] * 5 and rep.program_s >= 5 * 0.5
    rep = _reward(sandbox, timeout_s=2.0, start_allowance_s=0.0).run_tests({"solution.py": SLOW_START}, CALL5)
    assert rep.budget_exhausted >= 1 and rep.outcomes[0] == "pass"


# ---------------------------------------------------------------- defect 5: the extraction rule
@pytest.mark.parametrize(
    "text, code, reason",
    [
        ("x = 1\n", "x = 1\n", "whole_text"),
        ("a\n```python\nA = 1\n```\nb\n```Py\nB = 2\n```\n", "B = 2\n", "fenced"),  # the last tagged block
        (
            "```python\nA = 1\n```\nthen\n```text\nout\n```\n",
            "A = 1\n",
            "fenced",
        ),  # other languages are skipped
        ("```python3 title\nC = 3\n```\n", "C = 3\n", "fenced"),
        (
            "````python\nD = '```'\n````\n",
            "D = '```'\n",
            "fenced",
        ),  # a longer fence may contain a shorter one
        ("```\nA = 1\n```\n", None, "ambiguous"),  # untagged: program or sample output?
        ("```bash\nls\n```\n", None, "ambiguous"),
        ("```python\nA = 1\n```\n```python\nB = 2\n", None, "unclosed_fence"),  # cut off: never guessed at
    ],
)
def test_extraction_rule(text, code, reason):
    ext = extract_program(text)
    assert (ext.code, ext.reason) == (code, reason)


def test_require_block_and_failed_extraction_score_zero_with_reason(sandbox):
    assert extract_program("x = 1", require_block=True).reason == "no_block"
    res = _reward(sandbox)({"tests": CALL5[:1]}, "```\ndef add(a, b):\n    return a + b\n```\n")
    assert (res.score, res.ok, res.info["no_code"], res.info["extract_ambiguous"]) == (0.0, True, 1.0, 1.0)
    assert res.info["extract_unclosed_fence"] == 0.0
    ok = _reward(sandbox)({"tests": CALL5[:1]}, "Sure:\n```python\n" + ADD + "```\n")
    assert (ok.score, ok.info["no_code"]) == (1.0, 0.0)


# ---------------------------------------------------------------- assert / check(candidate) tests
MBPP = [
    {
        "asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(X, 1) == 8"],
        "setup": "X = 7",
    }
]
CHECK = [
    {
        "check": "def check(candidate):\n    assert candidate(2, 2) == 4\n    assert candidate(0, 5) == 5\n",
        "entry_point": "add",
    }
]
# expected sides that are not literals: these run in the candidate's process (code_runner.py, kinds asserts/check)
NONLIT = [
    {
        "asserts": ["assert add(1, 2) == 1 + 2", "assert add(-1, 1) == X - X", "assert add(X, 1) == X + 1"],
        "setup": "X = 7",
    }
]
CHECK_LOOP = [
    {
        "check": "def check(candidate):\n    for a, b in [(2, 2), (0, 5)]:\n        assert candidate(a, b) == a + b\n",
        "entry_point": "add",
    }
]
FORMATS = [MBPP, CHECK, NONLIT, CHECK_LOOP]
FORMAT_IDS = ["asserts", "check", "asserts_in_process", "check_in_process"]


@pytest.mark.parametrize("tests", FORMATS, ids=FORMAT_IDS)
def test_assert_formats_pass_and_fail(sandbox, tests):
    r = _reward(sandbox)
    assert r({"tests": tests}, ADD).score == 1.0
    # right on the first assert, wrong on the second: an early exit would not notice
    assert r({"tests": tests}, "def add(a, b):\n    return a - b if b in (1, 5) else a + b\n").score == 0.0
    assert r({"tests": tests}, "def add(a, b):\n    raise ValueError('no')\n").score == 0.0


HACKS = {
    "exit0_at_import": "import sys\nsys.exit(0)\n",
    "os_exit0_at_import": "import os\nos._exit(0)\n",
    "exit0_in_function": "def add(a, b):\n    import sys\n    sys.exit(0)\n",
    "os_exit0_in_function": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "always_equal": "class E:\n    def __eq__(self, o): return True\n    def __bool__(self): return True\n"
    "def add(a, b):\n    return E()\n",
    "int_subclass_eq": "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return I(0)\n",
    "patch_json_dumps": "import json\njson.dumps = lambda *a, **k: '{\"ran\": 3}'\ndef add(a, b):\n    return 0\n",
    "print_fake_report": "print('{\"ran\": 3}')\nimport sys\nsys.stdout.flush()\ndef add(a, b):\n    return 0\n",
    "forge_with_nonce_from_spec": (
        "import json, os\ntry:\n    spec = json.load(open('/work/_harness/spec.json'))\n"
        "    n = len(spec.get('asserts', [])) or 1\n    for fd in range(1, 20):\n"
        "        try:\n            os.write(fd, (spec['nonce'] + '{\"ran\": %d}\\n' % n).encode())\n"
        "        except OSError:\n            pass\n    os._exit(0)\n"
        "except FileNotFoundError:\n    pass\ndef add(a, b):\n    return 0\n"
    ),
    "exit0_via_atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return 0\n",
}


@pytest.mark.parametrize("name", sorted(HACKS))
@pytest.mark.parametrize("tests", FORMATS, ids=FORMAT_IDS)
def test_assert_format_hacks_score_zero(sandbox, tests, name):
    res = _reward(sandbox)({"tests": tests}, HACKS[name])
    assert (res.score, res.ok) == (0.0, True), res.info


def test_all_kinds_mix_in_one_list(sandbox):
    tests = [CALL5[0], {"stdin": "2 3\n", "stdout": "5\n"}, MBPP[0], CHECK[0]]
    main = "\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    assert _reward(sandbox)({"tests": tests}, ADD + main).score == 1.0
    half = "def add(a, b):\n    return a + b\n"  # no stdin program: 3 of 4
    rep = _reward(sandbox).run_tests({"solution.py": half}, tests)
    assert rep.outcomes == ["pass", "fail", "pass", "pass"]


@pytest.mark.parametrize(
    "test, match",
    [
        ({"asserts": "assert 1"}, "'asserts' must be a non-empty list"),
        ({"asserts": []}, "'asserts' must be"),
        ({"asserts": ["assert ("]}, r"asserts\[0\] is not valid Python"),
        ({"check": "def check(c): pass"}, "needs 'entry_point'"),
        ({"check": "def check(c) pass", "entry_point": "f"}, "check is not valid Python"),
    ],
)
def test_malformed_assert_tests_raise(sandbox, test, match):
    with pytest.raises(ValueError, match=match):
        _reward(sandbox)({"tests": [test]}, ADD)


# ---------------------------------------------------------------- JSONL loader and bundled samples
def test_samples_load_in_every_shape():
    prompts = load_code_tasks()
    assert [p.metadata["format"] for p in prompts] == ["native"] * 2 + ["check"] * 2 + ["asserts"] * 2 + [
        "stdio"
    ] * 2
    assert (
        prompts[2].uid == "check/rotate_left"
        and prompts[2].metadata["tests"][0]["entry_point"] == "rotate_left"
    )
    assert prompts[7].metadata["tests"] == [
        {"stdin": "Hello\nSKY\n", "stdout": "2\n0\n"},
        {"stdin": "AEIOU aeiou\n", "stdout": "10\n"},
    ]


def test_sample_reference_solutions_pass_and_a_wrong_one_fails(sandbox):
    r = _reward(sandbox, mode="binary", timeout_s=3.0)
    for p in load_code_tasks(SAMPLES):
        assert r(p, p.metadata["solution"]).score == 1.0, p.uid
        wrong = "def _unused():\n    pass\n"  # defines nothing the tests need and prints nothing
        assert r(p, wrong).score == 0.0, p.uid


@pytest.mark.parametrize(
    "rec, match",
    [
        ({"prompt": "p"}, "unknown record shape"),
        ({"prompt": "p", "tests": []}, "'tests' must be a non-empty list"),
        ({"prompt": "p", "test": "assert 1", "entry_point": "f"}, "def check"),
        ({"text": "p", "test_list": "assert 1"}, "'test_list' must be"),
        ({"test_list": ["assert 1"]}, "'text' or 'prompt'"),
        ({"question": "q", "inputs": ["1"], "outputs": []}, "equal length"),
        ({"question": "q", "input_output": "{bad"}, "'input_output' is not valid JSON"),
    ],
)
def test_bad_records_name_the_field(rec, match):
    with pytest.raises(ValueError, match=match):
        record_to_prompt(rec, "x.jsonl:3")


def test_loader_reports_file_and_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"prompt": "p", "tests": [{"call": "f", "expected": 1}]}) + "\n\n{nope\n")
    with pytest.raises(ValueError, match=r"t.jsonl:3: not valid JSON"):
        load_code_tasks(f)
    f.write_text("[1, 2]\n")
    with pytest.raises(TypeError, match=r"t.jsonl:1: expected a JSON object, got list"):
        load_code_tasks(f)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_code_tasks(tmp_path / "missing.jsonl")


PEEK = (
    "import sys\ndef add(a, b):\n    consts = [c for c in sys._getframe(1).f_code.co_consts if type(c) is int]\n"
    "    return consts[-1] if consts else 0\n"
)  # answers with its caller's last int constant


def test_literal_asserts_are_judged_in_the_parent(sandbox):
    # `assert <expr> == <literal>` (MBPP lists, flat HumanEval checks) only sends <expr> into the sandbox: a
    # candidate that reads its caller's constants finds the inputs, never the expected value
    assert _reward(sandbox)({"tests": MBPP}, PEEK).score == 0.0
    assert _reward(sandbox)({"tests": CHECK}, PEEK).score == 0.0
    assert _reward(sandbox)({"tests": CALL5}, PEEK).score == 0.0
    calls = []
    real = sandbox.run
    sandbox.run = lambda argv, files=None, stdin=b"", timeout_s=None: (
        calls.append(files) or real(argv, files=files, stdin=stdin, timeout_s=timeout_s)
    )
    try:
        _reward(sandbox)({"tests": [{"asserts": ["assert add(20, 3) == 987654"]}]}, ADD)
    finally:
        del sandbox.run
    spec = json.loads(calls[0]["_harness/spec.json"])
    assert (
        spec["kind"] == "exprs" and spec["exprs"] == ["add(20, 3)"] and "987654" not in json.dumps(calls[0])
    )


@pytest.mark.parametrize(
    "ret, literal, score",
    [
        ("(1, [2, 3])", "(1, [2, 3])", 1.0),
        ("[1, [2, 3]]", "(1, [2, 3])", 0.0),  # a list is not the tuple asked for
        ("{1: {2}, 'a': b'x'}", "{1: {2}, 'a': b'x'}", 1.0),
        ("{1: {2}, 'a': b'x'}", "{1: {2}, 'a': b'y'}", 0.0),
        ("1.0", "1", 1.0),
        ("None", "0", 0.0),  # == as Python's assert would compare
    ],
)
def test_typed_values_compare_like_python(sandbox, ret, literal, score):
    tests = [{"asserts": [f"assert f() == {literal}"]}]
    assert _reward(sandbox)({"tests": tests}, f"def f():\n    return {ret}\n").score == score


def test_set_dict_bytes_round_trip(sandbox):
    code = "def f():\n    return {1: {2, 3}, (4, 5): frozenset({6}), 'b': b'x', 'c': 1+2j, 'n': None}\n"
    tests = [
        {"asserts": ["assert f() == {1: {2, 3}, (4, 5): frozenset({6}), 'b': b'x', 'c': 1+2j, 'n': None}"]}
    ]
    assert _reward(sandbox)({"tests": tests}, code).score == 1.0


def test_non_literal_check_runs_in_process(sandbox):
    loop = {
        "check": "def check(candidate):\n    for i in range(3):\n        assert candidate(i, 1) == i + 1\n",
        "entry_point": "add",
    }
    assert _reward(sandbox)({"tests": [loop]}, ADD).score == 1.0
    assert _reward(sandbox)({"tests": [loop]}, "def add(a, b):\n    return a\n").score == 0.0


def test_known_gap_non_literal_asserts_are_visible_from_the_candidates_frames(sandbox):
    # Asserts whose expected side is not a literal run in the candidate's process, so a candidate that reads its
    # caller's code constants can answer them (here `1 + 2` is folded to the constant 3). This pins the gap
    # documented in code_runner.py / docs/architecture.md.
    assert _reward(sandbox)({"tests": [{"asserts": ["assert add(1, 2) == 1 + 2"]}]}, PEEK).score == 1.0
