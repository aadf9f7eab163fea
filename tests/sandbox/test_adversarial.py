"""The adversarial corpus (adversarial_corpus.py), run by corpus_runner.py as root and as an unprivileged user.

The runner is a separate caller process (in its own session): it must survive every program (a program
that kills or stops its caller would leave it dead or hung, and the fixture fails). Each case's oracles are
evaluated in the runner (see its docstring); here every case is one test per caller kind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lit_rl.rewards  # noqa: F401 - the real package first: corpus_runner's stdlib-only stubs must not replace it
from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

from adversarial_corpus import CASES  # isort: skip
import corpus_runner  # isort: skip

RUNNER = Path(__file__).resolve().parent / "corpus_runner.py"
ROOT = os.geteuid() == 0


def _run(cmd: list[str], timeout: float = 420.0) -> dict:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        start_new_session=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGCONT)
        proc.communicate()
        pytest.fail("the corpus caller hung (stopped by a program?)")
    assert proc.returncode == 0, f"the corpus caller died (rc={proc.returncode}): {err[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=["root", "nonroot"])
def corpus(request):
    if request.param == "root":
        if not ROOT:
            pytest.skip("the root-mode corpus needs root (CI runs as root)")
        return _run([sys.executable, "-I", str(RUNNER), "--json"])
    unpriv = request.getfixturevalue("unprivileged")
    return _run(
        [*unpriv.prefix, unpriv.python, "-I", str(unpriv.root / "tests/sandbox/corpus_runner.py"), "--json"]
    )


def test_corpus_size_and_coverage():
    names = [c.name for c in CASES]
    assert len(names) >= 40 and len(set(names)) == len(names)
    for needed in (
        "net_tcp_loopback_listener",
        "net_dns_getaddrinfo",
        "secret_env_canary",
        "fs_write_outside_workdir",
        "res_fork_bomb",
        "res_memory_bomb",
        "res_disk_fill",
        "res_stdout_100mb",
        "res_busy_loop_ignoring_signals",
        "res_setsid_daemon_outlives_run",
        "hack_sys_exit_0",
        "hack_os__exit_0",
        "hack_always_equal_object",
        "hack_frame_walking",
        "hack_monkeypatch_harness",
        "hack_conftest_injection",
        "hack_forged_pass_output",
        "priv_posix_module_bypass",
        "priv_ctypes_system_and_execve",
        "secret_read_test_files",
        "secret_git_history",
        "int_signal_pid1_every_signal",
        "int_kill_own_group_sigkill",
        "int_stop_own_group_sigstop",
        "int_prlimit_and_oom_score_pid1",
        "int_exhaust_fds_in_many_processes",
        "int_close_every_fd",
        "int_corrupt_framing",
        "int_memory_bomb_many_processes",
    ):
        assert needed in names


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_adversarial_case(corpus, case):
    r = corpus["cases"][case.name]
    assert not r["bad"], f"{case.name} [{corpus['summary']['mode']}]: {r['bad']} (status {r['status']})"


def test_corpus_totals(corpus):
    s = corpus["summary"]
    # the control: the correct solution scores 1 in both reward modes (else "every attack scores 0" is vacuous)
    assert {k: tuple(v) for k, v in s["control"].items()} == {
        "partial": (1.0, True),
        "fail_fast": (1.0, True),
    }
    assert (
        s["escapes"],
        s["false_passes"],
        s["infra_errors"],
        s["listener_hits"],
        s["leftover_processes"],
    ) == (0, 0, 0, 0, 0), s
    assert (
        s["max_hang_wall_s"] <= s["timeout_s"] + 1.0
        and s["max_hang_reward_program_s"] <= s["timeout_s"] + 1.0
    )


def test_hack_cases_really_ran_every_test():
    # the partial-mode scores are 0 over all 3 tests, not 0 because the harness stopped early
    sb = Sandbox(SandboxLimits(cpu_s=1, memory_mb=256), timeout_s=corpus_runner.TIMEOUT)
    res = CodeTestsReward("partial", timeout_s=1.0, sandbox=sb)(
        {"tests": corpus_runner.ADD_TESTS}, "import sys\nsys.exit(0)\n"
    )
    assert res.info["total"] == 3.0 and res.info["failed"] == 3.0 and res.info["skipped"] == 0.0


def test_world_readable_bait_is_readable_without_the_sandbox():
    # the oracles are only meaningful if an unisolated process running as a sandbox uid could reach the bait
    ctx = corpus_runner.Ctx(cgroup=False)
    try:
        mode = os.stat(ctx.secret_path).st_mode
        assert mode & stat.S_IROTH and os.stat(ctx.dir).st_mode & stat.S_IWOTH
        with socket.create_connection(("127.0.0.1", ctx.tcp.getsockname()[1]), timeout=1):
            pass
        time.sleep(0.2)
        assert [kind for _, kind in ctx.hits] == ["tcp"]
    finally:
        ctx.close()
        os.environ.pop("LIT_RL_CANARY_TOKEN", None)
