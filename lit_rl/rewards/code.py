"""Unit-test rewards for model-written code, judged outside the untrusted process.

``CodeTestsReward`` runs each test in its own fresh ``Sandbox`` (``lit_rl.rewards.sandbox``): the candidate
gets its own files plus *one* test's inputs -- never the expected output, never another test, never a test
file. The *parent* compares what comes back, as JSON-decoded builtins, with the expected value it kept to
itself. Hence, by construction:

* ``__eq__`` overrides / AlwaysEqual objects: results cross the boundary as JSON text; the parent compares
  plain ``int``/``str``/``list`` values it decoded itself (an object that is not JSON fails to serialise);
* ``sys.exit(0)``, ``os._exit(0)``, return code 0, forged "PASS"/"OK" lines: exit status and free-form
  output carry no verdict; a call test needs exactly one framed result line, a stdio test the exact output;
* editing/adding test files (``conftest.py``), monkeypatching the harness, walking stack frames, reading
  test files: nothing in the sandbox knows the expected value, and every test starts from pristine files.

Two test kinds, mixable in one list (``prompt.metadata["tests"]``):

* call: ``{"call": "fn", "args": [...], "kwargs": {...}, "expected": <JSON>, "module": "solution"}``;
* stdio: ``{"stdin": "...", "stdout": "..."}`` -- the program's stdout must equal ``stdout`` up to trailing
  whitespace on each line and trailing blank lines, and it must exit 0.

Outcome per test: ``pass`` / ``fail`` / ``infra_error``. Any infra error makes the reward
``RewardResult(0.0, ok=False)`` (masked and counted by ``RewardPool``), never a 0 scored as a wrong answer.
The score is ``binary`` (1 iff every test passed) or ``partial`` (passed / total); components go to ``info``.
"""
from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from lit_rl.rewards.base import RewardResult
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits, SandboxResult

MODES = ("binary", "partial")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# Runs inside the sandbox next to the candidate. It is *not* trusted: the candidate shares its process and can
# rewrite any of it. It only frames the result; the verdict is the parent's comparison with a value the
# sandbox never sees. fd 1 is duplicated before the candidate is imported and its prints go to stderr.
_RUNNER = r'''
import json, os, sys
_out = os.dup(1)
os.dup2(2, 1)
with open("/work/_harness/spec.json") as f:
    spec = json.load(f)
sys.path.insert(0, "/work")
try:
    import importlib
    fn = getattr(importlib.import_module(spec["module"]), spec["call"])
    payload = json.dumps({"value": fn(*spec["args"], **spec["kwargs"])}, allow_nan=False)
except BaseException as e:
    try:
        payload = json.dumps({"error": (type(e).__name__ + ": " + str(e))[:300]})
    except BaseException:
        payload = json.dumps({"error": "unprintable exception"})
os.write(_out, (spec["nonce"] + payload + "\n").encode())
'''


def extract_code(completion: str, require_block: bool = False) -> str | None:
    """The last fenced Python block of a completion; the whole text when it has no fence (unless
    ``require_block``, then ``None``)."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1]
    return None if require_block else completion


def json_equal(got: Any, expected: Any, tol: float = 1e-6) -> bool:
    """Type-strict equality of two JSON-decoded values (bool is not int); floats match within
    ``tol * max(1, |expected|)``. Both sides are builtins, so no user ``__eq__`` is ever called."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int) and isinstance(got, int):
            return got == expected
        return math.isfinite(got) and abs(got - expected) <= tol * max(1.0, abs(expected))
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(json_equal(g, e, tol) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(json_equal(got[k], expected[k], tol) for k in expected))
    return type(got) is type(expected) and got == expected  # str / None


def _norm_stdout(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@dataclass
class TestReport:
    """Per-test verdicts recorded by the parent; ``outcomes[i]`` belongs to ``tests[i]``."""

    outcomes: list[str]
    details: list[str]
    timeouts: int = 0
    wall_s: float = 0.0
    skipped: int = 0
    sandbox_errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return self.outcomes.count("pass")

    @property
    def infra_errors(self) -> int:
        return self.outcomes.count("infra_error")


class CodeTestsReward:
    """Reward = unit tests passed by the completion's code, run in the sandbox (see module doc).

    Args:
        mode: ``"binary"`` (1.0 iff all tests pass) or ``"partial"`` (passed / total).
        timeout_s: wall-clock limit per test (CPU time is capped at ``ceil(timeout_s)`` too).
        limits: sandbox resource limits (default ``SandboxLimits`` with ``cpu_s`` from ``timeout_s``).
        sandbox: a ready ``Sandbox`` to use instead (``limits``/``timeout_s`` then only set the per-test timeout).
        tests_key: where the tests live in ``prompt.metadata`` (or in a dict prompt).
        entry_file: file name the extracted code is saved as (its module name is what call tests import).
        require_code_block: only fenced code counts; a completion without one scores 0 (``no_code``).
        fail_fast: stop at the first failing test (binary mode only: partial credit needs every test).
        float_tol: relative tolerance for float results.

    Construction builds (and probes) the sandbox: an unusable machine raises ``SandboxUnavailableError``.
    Size the ``RewardPool`` timeout to at least ``len(tests) * timeout_s`` plus start-up (~0.3 s per test).
    """

    name = "code_tests"

    def __init__(self, mode: str = "binary", timeout_s: float = 5.0, limits: SandboxLimits | None = None,
                 sandbox: Sandbox | None = None, tests_key: str = "tests", entry_file: str = "solution.py",
                 require_code_block: bool = False, fail_fast: bool = False, float_tol: float = 1e-6):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; valid values: {', '.join(MODES)}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if fail_fast and mode != "binary":
            raise ValueError("fail_fast=True needs mode='binary' (partial credit must run every test)")
        if not entry_file.endswith(".py") or "/" in entry_file or entry_file.startswith("_"):
            raise ValueError(f"entry_file={entry_file!r} must be a plain 'name.py' not starting with '_'")
        if not (0 <= float_tol < 1):
            raise ValueError(f"float_tol must be in [0, 1), got {float_tol}")
        self.mode, self.timeout_s, self.tests_key = mode, float(timeout_s), tests_key
        self.entry_file, self.require_code_block = entry_file, require_code_block
        self.fail_fast, self.float_tol = fail_fast, float_tol
        self.sandbox = sandbox or Sandbox(limits or SandboxLimits(cpu_s=max(1, math.ceil(timeout_s))),
                                          timeout_s=timeout_s)

    # ------------------------------------------------------------------ RewardFn
    def __call__(self, prompt: Any, completion: str) -> RewardResult:
        tests = self._tests_of(prompt)
        code = extract_code(completion, self.require_code_block)
        if code is None:
            return RewardResult(0.0, True, {"no_code": 1.0, "passed": 0.0, "total": float(len(tests)),
                                            "pass_rate": 0.0})
        return self.score_report(self.run_tests({self.entry_file: code}, tests))

    def score_report(self, rep: TestReport) -> RewardResult:
        """Map a report to the reward: infra error -> ok=False; else binary or partial score."""
        n = rep.total
        info = {"passed": float(rep.passed), "total": float(n), "pass_rate": rep.passed / n,
                "failed": float(rep.outcomes.count("fail")), "timeouts": float(rep.timeouts),
                "infra_errors": float(rep.infra_errors), "skipped": float(rep.skipped), "wall_s": rep.wall_s,
                "no_code": 0.0}
        if rep.infra_errors:
            return RewardResult(0.0, False, info)
        score = float(rep.passed == n) if self.mode == "binary" else rep.passed / n
        return RewardResult(score, True, info)

    def _tests_of(self, prompt: Any) -> list[dict]:
        meta = prompt if isinstance(prompt, dict) else (getattr(prompt, "metadata", None) or {})
        tests = meta.get(self.tests_key)
        if tests is None and isinstance(prompt, dict):
            tests = (prompt.get("metadata") or {}).get(self.tests_key)
        if not tests:
            raise ValueError(f"CodeTestsReward: prompt {getattr(prompt, 'uid', '')!r} has no tests under "
                             f"metadata[{self.tests_key!r}]; a code reward cannot be judged without tests")
        return list(tests)

    # ------------------------------------------------------------------ running tests
    def run_tests(self, files: dict[str, str | bytes], tests: list[dict]) -> TestReport:
        """Run every test in its own sandbox with ``files`` as the candidate; the parent records each verdict."""
        checked = [_check_test(t, i, self.entry_file) for i, t in enumerate(tests)]
        for name in files:
            if name.startswith("_harness"):
                raise ValueError(f"candidate file {name!r} collides with the harness directory")
        rep = TestReport([], [])
        t0 = time.monotonic()
        for i, test in enumerate(checked):
            if self.fail_fast and "fail" in rep.outcomes:
                rep.outcomes.append("fail")
                rep.details.append("skipped after an earlier failure")
                rep.skipped += 1
                continue
            outcome, detail, res = self._run_one(files, test)
            rep.outcomes.append(outcome)
            rep.details.append(detail)
            rep.timeouts += res.status == "timeout"
            if outcome == "infra_error":
                rep.sandbox_errors.append(str(res.error))
        rep.wall_s = time.monotonic() - t0
        if len(rep.outcomes) != len(tests):  # every test must have exactly one recorded verdict
            raise RuntimeError(f"internal error: {len(rep.outcomes)} verdicts for {len(tests)} tests")
        return rep

    def _run_one(self, files: dict[str, str | bytes], test: dict) -> tuple[str, str, SandboxResult]:
        py = [self.sandbox.python, *self.sandbox.python_flags]
        if "stdin" in test:
            res = self.sandbox.run([*py, f"/work/{test['file']}"], files=files, stdin=test["stdin"],
                                   timeout_s=self.timeout_s)
            if res.outcome == "infra_error":
                return "infra_error", f"sandbox: {res.error}", res
            if res.status != "exited" or res.exit_code != 0:
                return "fail", f"{res.status} (exit {res.exit_code})", res
            got = _norm_stdout(res.stdout.decode(errors="replace"))
            ok = got == _norm_stdout(test["stdout"])
            return ("pass", "ok", res) if ok else ("fail", "wrong output", res)
        nonce = secrets.token_hex(16)
        spec = {"nonce": nonce, "module": test["module"], "call": test["call"], "args": test["args"],
                "kwargs": test["kwargs"]}  # inputs only: "expected" stays in this process
        harness = {"_harness/runner.py": _RUNNER, "_harness/spec.json": json.dumps(spec)}
        res = self.sandbox.run([*py, "/work/_harness/runner.py"], files={**files, **harness},
                               timeout_s=self.timeout_s)
        if res.outcome == "infra_error":
            return "infra_error", f"sandbox: {res.error}", res
        if res.status not in ("exited", "signaled"):
            return "fail", res.status, res
        framed = [ln[len(nonce):] for ln in res.stdout.decode(errors="replace").split("\n") if ln.startswith(nonce)]
        if len(framed) != 1:  # none: it never returned; several: it tried to print many guesses
            return "fail", f"{len(framed)} result lines (need exactly 1)", res
        try:
            msg = json.loads(framed[0])
        except (ValueError, RecursionError):
            return "fail", "result is not JSON", res
        if not isinstance(msg, dict) or set(msg) not in ({"value"}, {"error"}):
            return "fail", "malformed result", res
        if "error" in msg:
            return "fail", f"raised {str(msg['error'])[:200]}", res
        ok = json_equal(msg["value"], test["expected"], self.float_tol)
        return ("pass", "ok", res) if ok else ("fail", "wrong value", res)


def _check_test(test: Any, i: int, entry_file: str) -> dict:
    """Validate one test record; the expected value is normalised through JSON (tuples become lists)."""
    if not isinstance(test, dict):
        raise TypeError(f"test {i}: expected a dict, got {type(test).__name__}")
    if "call" in test:
        if "expected" not in test:
            raise ValueError(f"test {i}: a call test needs 'expected'; keys present: {sorted(test)}")
        try:
            expected = json.loads(json.dumps(test["expected"], allow_nan=False))
            args = json.loads(json.dumps(list(test.get("args", []))))
            kwargs = json.loads(json.dumps(dict(test.get("kwargs", {}))))
        except (TypeError, ValueError) as e:
            raise ValueError(f"test {i}: args/kwargs/expected must be JSON-serialisable ({e})") from e
        module = str(test.get("module", entry_file[:-3]))
        return {"call": str(test["call"]), "args": args, "kwargs": kwargs, "expected": expected, "module": module}
    if "stdin" in test or "stdout" in test:
        if "stdout" not in test:
            raise ValueError(f"test {i}: a stdio test needs 'stdout'; keys present: {sorted(test)}")
        return {"stdin": str(test.get("stdin", "")), "stdout": str(test["stdout"]),
                "file": str(test.get("file", entry_file))}
    raise ValueError(f"test {i}: need either 'call'+'expected' or 'stdin'+'stdout'; keys present: {sorted(test)}")
