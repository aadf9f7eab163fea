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

Three test kinds, mixable in one list (``prompt.metadata["tests"]``; ``code_tasks.py`` loads JSONL records):

* call: ``{"call": "fn", "args": [...], "kwargs": {...}, "expected": <JSON>, "module": "solution"}``;
* stdio: ``{"stdin": "...", "stdout": "..."}`` -- the program's stdout must equal ``stdout`` up to trailing
  whitespace on each line and trailing blank lines, and it must exit 0;
* assert (MBPP style): ``{"asserts": ["assert f(1) == 2", ...], "setup": "..."}``, or check (HumanEval
  style): ``{"check": "def check(candidate): ...", "entry_point": "f"}``. When every assert is
  ``assert <expr> == <literal>`` (the usual shape), only the expressions enter the sandbox and the parent
  compares their typed values with the literals (like call tests: the expected values stay here). Otherwise
  the test code runs in the candidate's process (``code_runner.py``): it passes only if the process exits 0
  *and* the harness reports, nonce-framed, that every assert ran; comparisons refuse non-builtin operands
  (AlwaysEqual). Known gap of that in-process path: see ``code_runner.py``.

**One wall budget per program.** ``timeout_s`` is the budget for the whole evaluation: each test runs with
``min(test_timeout_s, budget left) + start_allowance_s`` and the budget shrinks by the sandbox's own measure
of the test's run time less ``start_allowance_s`` (the interpreter's start, which is the harness's cost, not
the program's: under load it alone could eat a small budget); once spent, the remaining tests fail unrun
(``budget_exhausted``). A hanging program thus costs at most ``timeout_s + start_allowance_s`` of program
time (plus ~0.1-0.4 s of sandbox set-up per test that ran), whatever the number of tests.
``budget="per_test"`` restores the old behaviour (each test gets ``timeout_s``) for comparisons
(``scripts/bench_rewards.py``).

**Extraction** (``extract.py``): the last fenced block tagged python, else the whole text; unclosed or
ambiguous fences score 0 with the reason in ``info`` (``extract_<reason>``).

Outcome per test: ``pass`` / ``fail`` / ``infra_error`` (see ``sandbox.py`` for the rule: only a harness
failure proven independent of the program is ``infra_error``). Any infra error makes the reward
``RewardResult(0.0, ok=False)`` (masked and counted by ``RewardPool``), never a 0 scored as a wrong answer.
The score is ``binary`` (1 iff every test passed) or ``partial`` (passed / total); components go to ``info``.
"""

from __future__ import annotations

import ast
import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from lit_rl.rewards.base import RewardResult
from lit_rl.rewards.extract import REASONS, extract_code, extract_program  # noqa: F401 - extract_code re-exported
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits, SandboxResult

MODES = ("binary", "partial")
BUDGETS = ("program", "per_test")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_runner.py")) as _f:
    _RUNNER = _f.read()  # copied into each sandbox as /work/_harness/runner.py


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
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(json_equal(g, e, tol) for g, e in zip(got, expected))
        )
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(json_equal(got[k], expected[k], tol) for k in expected)
        )
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
    program_s: float = (
        0.0  # program run time summed over tests, as the sandbox measured it (the budget's clock)
    )
    budget_exhausted: int = 0  # tests failed unrun because the program's wall budget was spent

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
        timeout_s: wall budget for the whole program (all its tests together); CPU time is capped at
            ``ceil(timeout_s)`` per process too.
        test_timeout_s: limit for one test inside the budget (default: ``timeout_s``).
        start_allowance_s: the first seconds of each test (interpreter start) not charged to the budget.
        budget: ``"program"`` (the above) or ``"per_test"`` (every test gets ``timeout_s``: the old behaviour,
            kept for benchmarks; a hang then costs ``len(tests) * timeout_s``).
        limits: sandbox resource limits (default ``SandboxLimits`` with ``cpu_s`` from ``timeout_s``).
        sandbox: a ready ``Sandbox`` to use instead (``limits`` is then ignored).
        tests_key: where the tests live in ``prompt.metadata`` (or in a dict prompt).
        entry_file: file name the extracted code is saved as (its module name is what call tests import).
        require_code_block: only fenced code counts; a completion without one scores 0 (``no_code``).
        fail_fast: stop at the first failing test (binary mode only: partial credit needs every test).
        float_tol: relative tolerance for float results.

    Construction builds (and probes) the sandbox: an unusable machine raises ``SandboxUnavailableError``.
    Size the ``RewardPool`` timeout to at least ``timeout_s`` plus start-up (~0.4 s per test).
    """

    name = "code_tests"

    def __init__(
        self,
        mode: str = "binary",
        timeout_s: float = 5.0,
        limits: SandboxLimits | None = None,
        sandbox: Sandbox | None = None,
        tests_key: str = "tests",
        entry_file: str = "solution.py",
        require_code_block: bool = False,
        fail_fast: bool = False,
        float_tol: float = 1e-6,
        test_timeout_s: float | None = None,
        budget: str = "program",
        start_allowance_s: float = 0.25,
    ):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; valid values: {', '.join(MODES)}")
        if budget not in BUDGETS:
            raise ValueError(f"budget={budget!r}; valid values: {', '.join(BUDGETS)}")
        if timeout_s <= 0 or (test_timeout_s is not None and test_timeout_s <= 0):
            raise ValueError(f"timeout_s and test_timeout_s must be > 0, got {timeout_s}, {test_timeout_s}")
        if not 0 <= start_allowance_s <= 1:
            raise ValueError(f"start_allowance_s must be in [0, 1], got {start_allowance_s}")
        if fail_fast and mode != "binary":
            raise ValueError("fail_fast=True needs mode='binary' (partial credit must run every test)")
        if not entry_file.endswith(".py") or "/" in entry_file or entry_file.startswith("_"):
            raise ValueError(f"entry_file={entry_file!r} must be a plain 'name.py' not starting with '_'")
        if not (0 <= float_tol < 1):
            raise ValueError(f"float_tol must be in [0, 1), got {float_tol}")
        self.mode, self.timeout_s, self.tests_key, self.budget = mode, float(timeout_s), tests_key, budget
        self.test_timeout_s = float(test_timeout_s if test_timeout_s is not None else timeout_s)
        self.start_allowance_s = float(start_allowance_s)
        self.entry_file, self.require_code_block = entry_file, require_code_block
        self.fail_fast, self.float_tol = fail_fast, float_tol
        self.sandbox = sandbox or Sandbox(
            limits or SandboxLimits(cpu_s=max(1, math.ceil(timeout_s))), timeout_s=timeout_s
        )

    # ------------------------------------------------------------------ RewardFn
    def __call__(self, prompt: Any, completion: str) -> RewardResult:
        tests = self._tests_of(prompt)
        ext = extract_program(completion, self.require_code_block)
        if ext.code is None:  # the completion's own form: scored 0 (not masked), reason counted
            info = {"no_code": 1.0, "passed": 0.0, "total": float(len(tests)), "pass_rate": 0.0}
            info.update({f"extract_{r}": float(r == ext.reason) for r in REASONS[2:]})
            return RewardResult(0.0, True, info)
        return self.score_report(self.run_tests({self.entry_file: ext.code}, tests))

    def score_report(self, rep: TestReport) -> RewardResult:
        """Map a report to the reward: infra error -> ok=False; else binary or partial score."""
        n = rep.total
        info = {
            "passed": float(rep.passed),
            "total": float(n),
            "pass_rate": rep.passed / n,
            "failed": float(rep.outcomes.count("fail")),
            "timeouts": float(rep.timeouts),
            "infra_errors": float(rep.infra_errors),
            "skipped": float(rep.skipped),
            "wall_s": rep.wall_s,
            "program_s": rep.program_s,
            "budget_exhausted": float(rep.budget_exhausted),
            "no_code": 0.0,
            "cgroup": float(self.sandbox.cgroups.available),
        }
        if rep.infra_errors:  # the pool masks the row and shows this text
            return RewardResult(
                0.0, False, info, error=f"code sandbox could not run the tests: {rep.sandbox_errors[0]}"
            )
        score = float(rep.passed == n) if self.mode == "binary" else rep.passed / n
        return RewardResult(score, True, info)

    def _tests_of(self, prompt: Any) -> list[dict]:
        meta = prompt if isinstance(prompt, dict) else (getattr(prompt, "metadata", None) or {})
        tests = meta.get(self.tests_key)
        if tests is None and isinstance(prompt, dict):
            tests = (prompt.get("metadata") or {}).get(self.tests_key)
        if not tests:
            raise ValueError(
                f"CodeTestsReward: prompt {getattr(prompt, 'uid', '')!r} has no tests under "
                f"metadata[{self.tests_key!r}]; a code reward cannot be judged without tests"
            )
        return list(tests)

    # ------------------------------------------------------------------ running tests
    def run_tests(self, files: dict[str, str | bytes], tests: list[dict]) -> TestReport:
        """Run every test in its own sandbox with ``files`` as the candidate, inside one wall budget; the
        parent records each verdict."""
        checked = [_check_test(t, i, self.entry_file) for i, t in enumerate(tests)]
        for name in files:
            if name.startswith("_harness"):
                raise ValueError(f"candidate file {name!r} collides with the harness directory")
        rep = TestReport([], [])
        t0, left = time.monotonic(), self.timeout_s
        for test in checked:
            if self.fail_fast and "fail" in rep.outcomes:
                rep.outcomes.append("fail")
                rep.details.append("skipped after an earlier failure")
                rep.skipped += 1
                continue
            if self.budget == "program" and left <= 0:
                rep.outcomes.append("fail")
                rep.details.append(f"not run: the program's {self.timeout_s:g} s wall budget is spent")
                rep.budget_exhausted += 1
                continue
            allow = self.start_allowance_s
            limit = min(self.test_timeout_s, left) + allow if self.budget == "program" else self.timeout_s
            outcome, detail, res = self._run_one(files, test, limit)
            rep.outcomes.append(outcome)
            rep.details.append(detail)
            rep.timeouts += res.status == "timeout"
            rep.program_s += res.wall_s
            left -= max(0.0, res.wall_s - allow)
            if outcome == "infra_error":
                rep.sandbox_errors.append(str(res.error))
        rep.wall_s = time.monotonic() - t0
        if len(rep.outcomes) != len(tests):  # every test must have exactly one recorded verdict
            raise RuntimeError(f"internal error: {len(rep.outcomes)} verdicts for {len(tests)} tests")
        return rep

    def _run_one(
        self, files: dict[str, str | bytes], test: dict, timeout: float
    ) -> tuple[str, str, SandboxResult]:
        py = [self.sandbox.python, *self.sandbox.python_flags]
        if test["kind"] == "stdio":
            res = self.sandbox.run(
                [*py, f"/work/{test['file']}"], files=files, stdin=test["stdin"], timeout_s=timeout
            )
            if res.outcome == "infra_error":
                return "infra_error", f"sandbox: {res.error}", res
            if res.status != "exited" or res.exit_code != 0:
                return "fail", f"{res.status} (exit {res.exit_code})", res
            got = _norm_stdout(res.stdout.decode(errors="replace"))
            ok = got == _norm_stdout(test["stdout"])
            return ("pass", "ok", res) if ok else ("fail", "wrong output", res)
        nonce = secrets.token_hex(16)
        spec = {"nonce": nonce, **{k: v for k, v in test.items() if k not in ("expected", "n_asserts")}}
        harness = {"_harness/runner.py": _RUNNER, "_harness/spec.json": json.dumps(spec)}  # never "expected"
        res = self.sandbox.run(
            [*py, "/work/_harness/runner.py"], files={**files, **harness}, timeout_s=timeout
        )
        if res.outcome == "infra_error":
            return "infra_error", f"sandbox: {res.error}", res
        if res.status not in ("exited", "signaled"):
            return "fail", res.status, res
        framed = [
            ln[len(nonce) :] for ln in res.stdout.decode(errors="replace").split("\n") if ln.startswith(nonce)
        ]
        if len(framed) != 1:  # none: it never returned; several: it tried to print many guesses
            return "fail", f"{len(framed)} result lines (need exactly 1)", res
        try:
            msg = json.loads(framed[0])
        except (ValueError, RecursionError):
            return "fail", "result is not JSON", res
        if not isinstance(msg, dict) or set(msg) not in ({"value"}, {"error"}, {"ran"}, {"values"}):
            return "fail", "malformed result", res
        if "error" in msg:
            return "fail", f"raised {str(msg['error'])[:200]}", res
        if test["kind"] == "call":
            ok = "value" in msg and json_equal(msg["value"], test["expected"], self.float_tol)
            return ("pass", "ok", res) if ok else ("fail", "wrong value", res)
        if test["kind"] == "exprs":
            values = msg.get("values")
            if not isinstance(values, list) or len(values) != len(test["expected"]):
                return "fail", "malformed result", res
            for i, (g, e) in enumerate(zip(values, test["expected"])):
                try:
                    same = _typed_decode(g) == e  # two builtin values: no user __eq__ runs here
                except (TypeError, ValueError, RecursionError):
                    same = False
                if not same:
                    return "fail", f"assert {i} failed (wrong value)", res
            return "pass", "ok", res
        if msg.get("ran") != test["n_asserts"] or type(msg.get("ran")) is not int:
            return "fail", f"{msg.get('ran')!r} of {test['n_asserts']} asserts ran", res
        if (
            res.status != "exited" or res.exit_code != 0
        ):  # all asserts ran, then it crashed or exited non-zero
            return "fail", f"{res.status} (exit {res.exit_code}) after the asserts", res
        return "pass", "ok", res


def _check_test(test: Any, i: int, entry_file: str) -> dict:
    """Validate one test record and give it a ``kind``; values are normalised through JSON (tuples -> lists)."""
    if not isinstance(test, dict):
        raise TypeError(f"test {i}: expected a dict, got {type(test).__name__}")
    module = str(test.get("module", entry_file[:-3]))
    if "call" in test:
        if "expected" not in test:
            raise ValueError(f"test {i}: a call test needs 'expected'; keys present: {sorted(test)}")
        try:
            expected = json.loads(json.dumps(test["expected"], allow_nan=False))
            args = json.loads(json.dumps(list(test.get("args", []))))
            kwargs = json.loads(json.dumps(dict(test.get("kwargs", {}))))
        except (TypeError, ValueError) as e:
            raise ValueError(f"test {i}: args/kwargs/expected must be JSON-serialisable ({e})") from e
        return {
            "kind": "call",
            "call": str(test["call"]),
            "args": args,
            "kwargs": kwargs,
            "expected": expected,
            "module": module,
        }
    if "stdin" in test or "stdout" in test:
        if "stdout" not in test:
            raise ValueError(f"test {i}: a stdio test needs 'stdout'; keys present: {sorted(test)}")
        return {
            "kind": "stdio",
            "stdin": str(test.get("stdin", "")),
            "stdout": str(test["stdout"]),
            "file": str(test.get("file", entry_file)),
        }
    if "asserts" in test:
        asserts = test["asserts"]
        if isinstance(asserts, str) or not asserts or not all(isinstance(a, str) for a in asserts):
            raise ValueError(f"test {i}: 'asserts' must be a non-empty list of assert statements (strings)")
        for j, a in enumerate(asserts):
            _parses(a, f"test {i}: asserts[{j}]")
        setup = str(test.get("setup", ""))
        _parses(setup, f"test {i}: setup")
        pairs = _literal_asserts(asserts)
        if pairs is not None:  # judged in the parent: the literals never enter the sandbox
            return {
                "kind": "exprs",
                "exprs": [e for e, _ in pairs],
                "expected": [v for _, v in pairs],
                "setup": setup,
                "module": module,
                "entry_point": "",
            }
        return {
            "kind": "asserts",
            "asserts": list(asserts),
            "setup": setup,
            "module": module,
            "n_asserts": len(asserts),
        }
    if "check" in test:
        if not isinstance(test.get("entry_point"), str) or not test["entry_point"].isidentifier():
            raise ValueError(
                f"test {i}: a check test needs 'entry_point' (the function name passed to check)"
            )
        _parses(str(test["check"]), f"test {i}: check")
        split = _literal_check(str(test["check"]))
        if split is not None:
            setup, pairs = split
            return {
                "kind": "exprs",
                "exprs": [e for e, _ in pairs],
                "expected": [v for _, v in pairs],
                "setup": setup,
                "module": module,
                "entry_point": test["entry_point"],
            }
        return {
            "kind": "check",
            "check": str(test["check"]),
            "entry_point": test["entry_point"],
            "module": module,
            "n_asserts": 1,
        }
    raise ValueError(
        f"test {i}: need 'call'+'expected', 'stdin'+'stdout', 'asserts' or 'check'+'entry_point'; "
        f"keys present: {sorted(test)}"
    )


def _literal_pair(node: ast.stmt) -> tuple[str, Any] | None:
    """``assert <expr> == <literal>`` (either side) -> (expr source, literal value), else None."""
    if not (
        isinstance(node, ast.Assert)
        and isinstance(node.test, ast.Compare)
        and len(node.test.ops) == 1
        and isinstance(node.test.ops[0], ast.Eq)
    ):
        return None
    left, right = node.test.left, node.test.comparators[0]
    for expr, lit in ((left, right), (right, left)):
        try:
            value = ast.literal_eval(lit)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        return ast.unparse(expr), value
    return None


def _literal_asserts(asserts: list[str]) -> list[tuple[str, Any]] | None:
    """Every statement of every assert string is ``assert <expr> == <literal>``: the pairs, else None."""
    pairs = []
    for src in asserts:
        for node in ast.parse(src).body:
            pair = _literal_pair(node)
            if pair is None:
                return None
            pairs.append(pair)
    return pairs or None


def _literal_check(src: str) -> tuple[str, list[tuple[str, Any]]] | None:
    """A HumanEval ``check`` whose body is only ``assert <expr> == <literal>`` (and docstrings): (the rest of
    the module as setup, pairs), else None."""
    tree = ast.parse(src)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or [a.arg for a in checks[0].args.args] != ["candidate"]:
        return None
    pairs = []
    for node in checks[0].body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        pair = _literal_pair(node)
        if pair is None:
            return None
        pairs.append(pair)
    rest = ast.Module([n for n in tree.body if n is not checks[0]], [])
    return (ast.unparse(rest), pairs) if pairs else None


def _typed_decode(v: Any) -> Any:
    """Inverse of code_runner's typed JSON: markers back to tuple / set / dict / bytes / complex."""
    if isinstance(v, list):
        return [_typed_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if set(v) == {"__tuple__"}:
        return tuple(_typed_decode(x) for x in v["__tuple__"])
    if set(v) == {"__set__", "frozen"}:
        items = [_typed_decode(x) for x in v["__set__"]]
        return frozenset(items) if v["frozen"] else set(items)
    if set(v) == {"__dict__"}:
        return {_typed_decode(k): _typed_decode(x) for k, x in v["__dict__"]}
    if set(v) == {"__bytes__"}:
        return bytes.fromhex(v["__bytes__"])
    if set(v) == {"__complex__"}:
        return complex(*v["__complex__"])
    raise ValueError(f"unknown value marker {sorted(v)}")


def _parses(src: str, what: str) -> None:
    try:
        compile(src, what, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise ValueError(f"{what} is not valid Python: {e}") from e
