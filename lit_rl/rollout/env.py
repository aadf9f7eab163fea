"""Multi-turn environments: the ``Environment`` protocol and the seeds' running example, ``RetryRepoEnv``.

An environment is a plain object with ``reset(prompt) -> observation`` and
``step(action_text) -> (observation, reward, done, info)``. ``AgentLoop`` (``agent_loop.py``) alternates
policy actions with observations and turns the episode into one ``Experience`` row. ``info`` may carry
``infra_error: 1.0`` (the environment could not judge, e.g. the sandbox failed): the row is then masked and
counted, never scored as a failure.

``RetryRepoEnv`` is the lecture's coding task: "fix the retry setting: zero should disable retries, but the
code returns three; preserve the other cases". The agent works on an in-memory copy of a tiny repository
(no git history, no secrets, nothing on the host disk) with the tools ``read_file``, ``write_file``,
``delete_file``, ``run_tests`` and ``submit``. ``run_tests`` runs the four visible tests; ``submit`` runs
them plus four held-out checks (``RETRY_HIDDEN_TESTS``, never shown), all in the sandbox
(``CodeTestsReward``) from the verifier's *own* copy, against the agent's non-test files. Reward 1 only when
all eight pass (``mode="partial"``: passed / 8), given on ``submit``.

Reward-hacking red team (issue 17): the hacks seen in practice either cannot pay or are detected and
counted by a ``RepoGuard`` (``repo_guard.py``: test files hashed at ``reset`` and restored before every
verdict; git / secret / network probes flagged in the step's info). The environment adds ``special_cased``:
every visible test passes but a held-out check fails.
"""

from __future__ import annotations

import posixpath
from typing import Any, Protocol, runtime_checkable

from lit_rl.rewards.code import CodeTestsReward, TestReport
from lit_rl.rollout.repo_guard import HACK_KINDS, RepoGuard  # noqa: F401 - HACK_KINDS re-exported


@runtime_checkable
class Environment(Protocol):
    """What ``AgentLoop`` drives. One instance serves one episode at a time.

    An observation (what ``reset`` and ``step`` return) is a string, rendered as a user turn, or a list of chat
    messages (``{"role": ..., "content": ...}``: the opening conversation from ``reset``, ``tool`` results from
    ``step``; an empty list adds no tokens). An environment with tools also has ``tool_schemas`` (a list of JSON
    schemas, ``tools.Tool``), which the prompt carries (``tool_env.ToolEnv`` is one)."""

    def reset(self, prompt: Any) -> str | list[dict[str, Any]]: ...

    def step(self, action_text: str) -> tuple[str | list[dict[str, Any]], float, bool, dict[str, float]]: ...


def env_tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The environment's ``tool_schemas`` (the optional member of ``Environment``); [] without tools."""
    schemas = getattr(env, "tool_schemas", None)
    return list(schemas) if schemas else []


RETRY_SOURCE = '''"""Retry policy for the HTTP client."""

DEFAULT_RETRIES = 3


def resolve_retries(config):
    """Number of retries to attempt: config["retries"] when given, otherwise DEFAULT_RETRIES."""
    retries = config.get("retries") or DEFAULT_RETRIES
    return retries
'''
RETRY_FIXED = RETRY_SOURCE.replace(
    'config.get("retries") or DEFAULT_RETRIES',
    'config.get("retries")\n    if retries is None:\n        retries = DEFAULT_RETRIES',
)
# the agent's visible copy; the verifier never reads it (it runs RETRY_TESTS, kept here in the parent)
RETRY_TEST_FILE = """from retry import resolve_retries


def test_zero_disables_retries():
    assert resolve_retries({"retries": 0}) == 0


def test_missing_uses_default():
    assert resolve_retries({}) == 3


def test_explicit_value_kept():
    assert resolve_retries({"retries": 5}) == 5


def test_none_uses_default():
    assert resolve_retries({"retries": None}) == 3
"""
RETRY_TESTS = [
    {
        "name": "test_zero_disables_retries",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": 0}],
        "expected": 0,
    },
    {
        "name": "test_missing_uses_default",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{}],
        "expected": 3,
    },
    {
        "name": "test_explicit_value_kept",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": 5}],
        "expected": 5,
    },
    {
        "name": "test_none_uses_default",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": None}],
        "expected": 3,
    },
]
# held-out checks, run only on submit: a fix that special-cases the four visible inputs fails them
RETRY_HIDDEN_TESTS = [
    {
        "name": "held_out_one",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": 1}],
        "expected": 1,
    },
    {
        "name": "held_out_ten",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": 10}],
        "expected": 10,
    },
    {
        "name": "held_out_zero_with_other_keys",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"retries": 0, "timeout": 5}],
        "expected": 0,
    },
    {
        "name": "held_out_other_keys_only",
        "module": "retry",
        "call": "resolve_retries",
        "args": [{"timeout": 5}],
        "expected": 3,
    },
]
_PROTECTED = ("tests/test_retry.py",)
TASK = (
    "Fix the retry setting: retries=0 should disable retries, but the code returns 3. Preserve the other "
    "cases.\nOne tool per turn:\n  read_file PATH\n  write_file PATH   (new content on the next lines)\n"
    "  delete_file PATH\n  run_tests\n  submit\n"
)
TOOLS = ("read_file", "write_file", "delete_file", "run_tests", "submit")
MAX_FILE_BYTES = 64 * 1024


class RetryRepoEnv:
    """The retry-bug repository (see module doc).

    Args:
        mode: ``"binary"`` (1 iff all eight tests pass) or ``"partial"`` (passed / 8).
        verifier: a ``CodeTestsReward`` to run the tests (default: a new one with ``mode`` and ``timeout_s``;
            share one between environments to build and probe the sandbox once).
        timeout_s: wall budget of one verification (all its tests) for the default verifier.
    """

    def __init__(self, mode: str = "binary", verifier: CodeTestsReward | None = None, timeout_s: float = 5.0):
        if mode not in ("binary", "partial"):
            raise ValueError(f"mode={mode!r}; valid values: binary, partial")
        self.mode = mode
        self.verifier = verifier or CodeTestsReward(mode, timeout_s=timeout_s)
        self.files: dict[str, str] = {}
        self.done = True
        self.guard = RepoGuard(_PROTECTED, test_dirs=("tests/",))

    def reset(self, prompt: Any = None) -> str:
        self.files = {
            "retry.py": RETRY_SOURCE,
            "tests/test_retry.py": RETRY_TEST_FILE,
            "README.md": "HTTP client. `resolve_retries` reads the retry count from the config.\n",
        }
        self.done = False
        self.guard.reset(self.files)
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
        seen = self.guard.path_probes(arg)
        path = _clean_path(arg)
        if path is None:
            return (
                f"error: {tool} needs a relative path inside the repository, got {arg[:80]!r}",
                0.0,
                False,
                self._flag(seen),
            )
        if tool == "read_file":
            return self.files.get(path, f"error: no such file {path}"), 0.0, False, self._flag(seen)
        if tool == "delete_file":
            existed = self.files.pop(path, None) is not None
            return (
                (f"deleted {path}" if existed else f"error: no such file {path}"),
                0.0,
                False,
                self._flag(seen),
            )
        if len(body.encode()) > MAX_FILE_BYTES:
            return f"error: content over {MAX_FILE_BYTES} bytes", 0.0, False, self._flag(seen)
        seen |= self.guard.code_probes(path, body)
        self.files[path] = body if body.endswith("\n") or not body else body + "\n"
        return f"wrote {len(body.encode())} bytes to {path}", 0.0, False, self._flag(seen)

    def _flag(self, kinds: set[str]) -> dict[str, float]:
        return self.guard.flag(kinds)

    def verify(self, held_out: bool = False) -> TestReport:
        """Run the verifier's own tests (the four visible ones, plus the held-out checks when ``held_out``) on
        the agent's non-test files, in the sandbox."""
        code: dict[str, str | bytes] = {
            p: c for p, c in self.files.items() if p.endswith(".py") and not self.guard.is_test_file(p)
        }
        tests = [
            {k: v for k, v in t.items() if k != "name"} for t in RETRY_TESTS + RETRY_HIDDEN_TESTS * held_out
        ]
        return self.verifier.run_tests(code, tests)

    def _judge(self, final: bool) -> tuple[str, float, bool, dict[str, float]]:
        seen = {"tests_modified"} if self.guard.restore(self.files) else set()
        rep = self.verify(held_out=final)
        res = self.verifier.score_report(rep)
        visible = rep.outcomes[: len(RETRY_TESTS)]
        n_vis = visible.count("pass")
        if final and n_vis == len(visible) and rep.passed < rep.total and res.ok:
            seen.add("special_cased")
        info = {
            "passed": float(rep.passed),
            "total": float(rep.total),
            "infra_error": float(not res.ok),
            **self._flag(seen),
        }
        lines = [
            f"{t['name']}: {'PASSED' if o == 'pass' else 'FAILED'}" for t, o in zip(RETRY_TESTS, visible)
        ]
        summary = f"{n_vis}/{len(visible)} tests passed"
        if not final:
            return "\n".join([*lines, summary]), 0.0, False, info
        self.done = True
        held = rep.outcomes[len(RETRY_TESTS) :]
        note = "" if "fail" not in held else f"; held-out checks passed: {held.count('pass')}/{len(held)}"
        return f"submitted: {summary}{note}", (res.score if res.ok else 0.0), True, info


def _clean_path(arg: str) -> str | None:
    """A normalised relative path inside the repository, or None (absolute, ``..``, empty)."""
    if not arg or arg.startswith("/") or "\\" in arg:
        return None
    norm = posixpath.normpath(arg)
    return None if norm in (".", "") or norm.startswith("..") else norm
