"""Fixtures for running sandbox callers as an unprivileged user (user-namespace mode) as well as root.

CI runs as root; the non-root path is the default for everyone else, so both are exercised: as root, the
session fixture creates a system user (``useradd``) once, copies the stdlib-only sandbox files and the test
callers to a world-readable temporary directory (the checkout may sit under a private home), and runs them
with ``setpriv`` under that uid with the system Python. It skips, saying why, only where that is impossible.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USER = "litrl_sbx"
STDLIB_FILES = [
    "lit_rl/rewards/sandbox.py",
    "lit_rl/rewards/_sandbox_rules.py",
    "lit_rl/rewards/sandbox_launcher.py",
    "lit_rl/rewards/cgroups.py",
    "lit_rl/rewards/code.py",
    "lit_rl/rewards/base.py",
    "lit_rl/rewards/extract.py",
    "lit_rl/rewards/code_runner.py",
    "tests/sandbox/sbx_caller.py",
    "tests/sandbox/adversarial_corpus.py",
    "tests/sandbox/corpus_integrity.py",
    "tests/sandbox/corpus_runner.py",
]


class Unprivileged:
    """Runs ``python <copied script> args`` as ``uid`` (or as this user when the tests are not root)."""

    def __init__(self, prefix: list[str], python: str, root: Path, uid: int):
        self.prefix, self.python, self.root, self.uid = prefix, python, root, uid

    def run(
        self, script: str, args: list[str], stdin: str = "", timeout: float = 120.0
    ) -> subprocess.CompletedProcess:
        cmd = [*self.prefix, self.python, "-I", str(self.root / script), *args]
        # own session: whatever the sandboxed program does to its caller's group, pytest is not in it
        return subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            check=False,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "SBX_PYTHON": self.python},
            start_new_session=True,
        )


@pytest.fixture(scope="session")
def unprivileged():
    if os.geteuid() != 0:  # already unprivileged: run the repository's own files with this interpreter
        yield Unprivileged([], sys.executable, REPO, os.getuid())
        return
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or shutil.which("setpriv") is None:
        pytest.skip(
            "needs /usr/bin/python3 and setpriv (util-linux) to run the sandbox as an unprivileged user"
        )
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"could not create the unprivileged test user {USER!r}: {done.stderr.strip()}")
        pw = pwd.getpwnam(USER)
    tmp = Path(tempfile.mkdtemp(prefix="lit_rl_unpriv_"))
    try:
        for rel in STDLIB_FILES:
            if (REPO / rel).exists():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / rel, tmp / rel)
        for d, _dirs, files in os.walk(tmp):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
        probe = subprocess.run(
            [*prefix, python, "-I", "-c", "import os; print(os.getuid())"],
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
        if probe.returncode != 0 or probe.stdout.strip() != str(pw.pw_uid):
            pytest.skip(f"cannot run {python} as {USER}: {probe.stderr.strip()[-300:]}")
        yield Unprivileged(prefix, python, tmp, pw.pw_uid)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
