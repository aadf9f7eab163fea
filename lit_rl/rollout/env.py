"""Multi-turn environments: the ``Environment`` protocol and the seeds' running example, ``RetryRepoEnv``.

An environment is a plain object with ``reset(prompt) -> observation`` and
``step(action_text) -> (observation, reward, done, info)``. ``AgentLoop`` (``rollout/agent.py``) alternates
policy actions with observations and turns the episode into one ``Experience`` row. ``info`` may carry
``infra_error: 1.0`` (the environment could not judge, e.g. the sandbox failed): the row is then masked and
counted, never scored as a failure.

``RetryRepoEnv`` is the lecture's coding task: "fix the retry setting: zero should disable retries, but the
code returns three; preserve the other cases". The agent works on an in-memory copy of a tiny repository
(no git history, no secrets, nothing on the host disk) with the tools ``read_file``, ``write_file``,
``delete_file``, ``run_tests`` and ``submit``. The verifier runs four unit tests in the sandbox
(``CodeTestsReward``) from its *own* copy of the tests, against the agent's non-test files: editing or
deleting the repository's test file, or adding a ``conftest.py``, cannot change a verdict. Reward 1 only when
all four pass (``mode="partial"``: passed / 4), given on ``submit``.
"""
from __future__ import annotations

import posixpath
from typing import Any, Protocol, runtime_checkable

from lit_rl.rewards.code import CodeTestsReward, TestReport


@runtime_checkable
class Environment(Protocol):
    """What ``AgentLoop`` drives. One instance serves one episode at a time."""

    def reset(self, prompt: Any) -> str: ...

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, float]]: ...


RETRY_SOURCE = '''"""Retry policy for the HTTP client."""

DEFAULT_RETRIES = 3


def resolve_retries(config):
    """Number of retries to attempt: config["retries"] when given, otherwise DEFAULT_RETRIES."""
    retries = config.get("retries") or DEFAULT_RETRIES
    return retries
'''
RETRY_FIXED = RETRY_SOURCE.replace('config.get("retries") or DEFAULT_RETRIES',
                                   'config.get("retries")\n    if retries is None:\n        retries = DEFAULT_RETRIES')
# the agent's visible copy; the verifier never reads it (it runs RETRY_TESTS, kept here in the parent)
RETRY_TEST_FILE = '''from retry import resolve_retries


def test_zero_disables_retries():
    assert resolve_retries({"retries": 0}) == 0


def test_missing_uses_default():
    assert resolve_retries({}) == 3


def test_explicit_value_kept():
    assert resolve_retries({"retries": 5}) == 5


def test_none_uses_default():
    assert resolve_retries({"retries": None}) == 3
'''
RETRY_TESTS = [
    {"name": "test_zero_disables_retries", "module": "retry", "call": "resolve_retries", "args": [{"retries": 0}],
     "expected": 0},
    {"name": "test_missing_uses_default", "module": "retry", "call": "resolve_retries", "args": [{}], "expected": 3},
    {"name": "test_explicit_value_kept", "module": "retry", "call": "resolve_retries", "args": [{"retries": 5}],
     "expected": 5},
    {"name": "test_none_uses_default", "module": "retry", "call": "resolve_retries", "args": [{"retries": None}],
     "expected": 3},
]
TASK = ("Fix the retry setting: retries=0 should disable retries, but the code returns 3. Preserve the other "
        "cases.\nOne tool per turn:\n  read_file PATH\n  write_file PATH   (new content on the next lines)\n"
        "  delete_file PATH\n  run_tests\n  submit\n")
TOOLS = ("read_file", "write_file", "delete_file", "run_tests", "submit")
MAX_FILE_BYTES = 64 * 1024


class RetryRepoEnv:
    """The retry-bug repository (see module doc).

    Args:
        mode: ``"binary"`` (1 iff all four tests pass) or ``"partial"`` (passed / 4).
        verifier: a ``CodeTestsReward`` to run the tests (default: a new one with ``mode`` and ``timeout_s``;
            share one between environments to build and probe the sandbox once).
        timeout_s: per-test sandbox timeout of the default verifier.
    """

    def __init__(self, mode: str = "binary", verifier: CodeTestsReward | None = None, timeout_s: float = 5.0):
        if mode not in ("binary", "partial"):
            raise ValueError(f"mode={mode!r}; valid values: binary, partial")
        self.mode = mode
        self.verifier = verifier or CodeTestsReward(mode, timeout_s=timeout_s)
        self.files: dict[str, str] = {}
        self.done = True

    def reset(self, prompt: Any = None) -> str:
        self.files = {"retry.py": RETRY_SOURCE, "tests/test_retry.py": RETRY_TEST_FILE,
                      "README.md": "HTTP client. `resolve_retries` reads the retry count from the config.\n"}
        self.done = False
        return TASK + "Files: " + ", ".join(sorted(self.files))

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, float]]:
        if self.done:
            raise RuntimeError("RetryRepoEnv.step after the episode ended; call reset() first")
        head, _, body = action_text.strip("\n").partition("\n")
        parts = head.split()
        tool, arg = (parts[0] if parts else ""), (parts[1] if len(parts) > 1 else "")
        if tool not in TOOLS:
            return f"error: unknown tool {tool[:40]!r}; tools: {', '.join(TOOLS)}", 0.0, False, {}
        if tool in ("run_tests", "submit"):
            return self._judge(final=tool == "submit")
        path = _clean_path(arg)
        if path is None:
            return f"error: {tool} needs a relative path inside the repository, got {arg[:80]!r}", 0.0, False, {}
        if tool == "read_file":
            return self.files.get(path, f"error: no such file {path}"), 0.0, False, {}
        if tool == "delete_file":
            existed = self.files.pop(path, None) is not None
            return (f"deleted {path}" if existed else f"error: no such file {path}"), 0.0, False, {}
        if len(body.encode()) > MAX_FILE_BYTES:
            return f"error: content over {MAX_FILE_BYTES} bytes", 0.0, False, {}
        self.files[path] = body if body.endswith("\n") or not body else body + "\n"
        return f"wrote {len(body.encode())} bytes to {path}", 0.0, False, {}

    def verify(self) -> TestReport:
        """Run the verifier's own four tests on the agent's non-test files, in the sandbox."""
        code = {p: c for p, c in self.files.items()
                if p.endswith(".py") and not p.startswith("tests/") and posixpath.basename(p) != "conftest.py"}
        tests = [{k: v for k, v in t.items() if k != "name"} for t in RETRY_TESTS]
        return self.verifier.run_tests(code, tests)

    def _judge(self, final: bool) -> tuple[str, float, bool, dict[str, float]]:
        rep = self.verify()
        res = self.verifier.score_report(rep)
        info = {"passed": float(rep.passed), "total": float(rep.total), "infra_error": float(not res.ok)}
        lines = [f"{t['name']}: {'PASSED' if o == 'pass' else 'FAILED'}" for t, o in zip(RETRY_TESTS, rep.outcomes)]
        summary = f"{rep.passed}/{rep.total} tests passed"
        if not final:
            return "\n".join([*lines, summary]), 0.0, False, info
        self.done = True
        return f"submitted: {summary}", (res.score if res.ok else 0.0), True, info


def _clean_path(arg: str) -> str | None:
    """A normalised relative path inside the repository, or None (absolute, ``..``, empty)."""
    if not arg or arg.startswith("/") or "\\" in arg:
        return None
    norm = posixpath.normpath(arg)
    return None if norm in (".", "") or norm.startswith("..") else norm
