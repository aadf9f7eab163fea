"""The adversarial corpus (adversarial_corpus.py) against the real sandbox and CodeTestsReward.

Each case runs once as a plain sandboxed program (escape oracles) and once scored as a solution of
``add(a, b)`` (reward oracle). Listeners, the canary and the host secret are made reachable for an
unsandboxed process run as the sandbox uid (world-readable/writable), so only the isolation stops them.
Network traffic goes only to loopback listeners started here, and only if the sandbox were broken.
"""
from __future__ import annotations

import os
import secrets
import select
import shutil
import socket
import stat
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from adversarial_corpus import CASES

from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.sandbox import _UID_BASE, _UID_SPAN, Sandbox, SandboxLimits

TIMEOUT = 1.0
REPO = Path(__file__).resolve().parents[2]
ADD_TESTS = [{"call": "add", "args": [2, 3], "expected": 5}, {"call": "add", "args": [-7, 4], "expected": -3},
             {"stdin": "2 3\n", "stdout": "5\n"}]
ADD_SOLUTION = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the corpus checks per-run uids, which needs root (CI runs as root)")


class Ctx:
    """Host-side bait: loopback listeners, an env canary, a world-readable secret file, writable targets."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lit_rl_bait_")
        os.chmod(self.dir, 0o777)
        self.secret = "host-secret-" + secrets.token_hex(12)
        self.secret_path = os.path.join(self.dir, "lit_rl_secret.txt")
        Path(self.secret_path).write_text(self.secret)
        os.chmod(self.secret_path, 0o644)
        self.canary = "canary-" + secrets.token_hex(12)
        self.hits: list[tuple[float, str]] = []  # (time, listener) of every connection / datagram
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = os.path.join(self.dir, "bait.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        os.chmod(self.unix_path, 0o777)
        self.abstract = "lit_rl_bait_" + secrets.token_hex(6)
        self.abs_sock = socket.socket(socket.AF_UNIX)
        self.abs_sock.bind("\0" + self.abstract)
        self.abs_sock.listen()
        self.output_cap = SandboxLimits().output_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        socks = {self.tcp: "tcp", self.udp: "udp", self.unix: "unix", self.abs_sock: "abstract"}
        while not self._stop.is_set():
            ready, _, _ = select.select(list(socks), [], [], 0.1)
            for s in ready:
                if s is self.udp:
                    self.udp.recvfrom(4096)
                else:
                    s.accept()[0].close()
                self.hits.append((time.time(), socks[s]))

    def write_path(self, case: str) -> str:
        return os.path.join(self.dir, f"escaped_{case}.txt")

    def targets(self, case: str) -> list[str]:
        """Host paths case ``case`` tries to write (none may exist afterwards)."""
        return [self.write_path(case), "/usr/lit_rl_escape", "/etc/lit_rl_escape", "/lit_rl_escape",
                str(REPO / "lit_rl_escape")]

    def fill(self, code: str, case: str) -> str:
        return (code.replace("@TCP_PORT@", str(self.tcp.getsockname()[1]))
                .replace("@UDP_PORT@", str(self.udp.getsockname()[1])).replace("@UNIX_PATH@", self.unix_path)
                .replace("@ABSTRACT@", self.abstract).replace("@SECRET_PATH@", self.secret_path)
                .replace("@WRITE_PATH@", self.write_path(case)).replace("@REPO@", str(REPO))
                .replace("@TEST_FILE@", str(Path(__file__).resolve())))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in (self.tcp, self.udp, self.unix, self.abs_sock):
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def sandbox_processes() -> list[tuple[int, int]]:
    """Host processes running as a sandbox uid (there must be none once a run has returned)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = int(status.split("\nUid:")[1].split()[0])
        if _UID_BASE <= uid < _UID_BASE + _UID_SPAN:
            found.append((int(pid), uid))
    return found


@pytest.fixture(scope="module")
def ctx():
    c = Ctx()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIT_RL_CANARY_TOKEN", c.canary)  # in the trainer's environment, never in the sandbox's
        yield c
    c.close()


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(cpu_s=1, memory_mb=256), timeout_s=TIMEOUT)


@pytest.fixture(scope="module")
def rewards(sandbox):
    return {"partial": CodeTestsReward("partial", timeout_s=TIMEOUT, sandbox=sandbox),
            "fail_fast": CodeTestsReward("binary", timeout_s=TIMEOUT, sandbox=sandbox, fail_fast=True)}


def test_corpus_size_and_coverage():
    names = [c.name for c in CASES]
    assert len(names) >= 30 and len(set(names)) == len(names)
    for needed in ("net_tcp_loopback_listener", "net_dns_getaddrinfo", "secret_env_canary", "fs_write_outside_workdir",
                   "res_fork_bomb", "res_memory_bomb", "res_disk_fill", "res_stdout_100mb",
                   "res_busy_loop_ignoring_signals", "res_setsid_daemon_outlives_run", "hack_sys_exit_0",
                   "hack_os__exit_0", "hack_always_equal_object", "hack_frame_walking", "hack_monkeypatch_harness",
                   "hack_conftest_injection", "hack_forged_pass_output", "priv_posix_module_bypass",
                   "priv_ctypes_system_and_execve", "secret_read_test_files", "secret_git_history"):
        assert needed in names


def test_control_correct_solution_scores_one(rewards):
    # without this, "every attack scores 0" would also hold for a reward that always returns 0
    for r in rewards.values():
        res = r({"tests": ADD_TESTS}, ADD_SOLUTION)
        assert (res.score, res.ok) == (1.0, True)


def _run_case(case, ctx, sandbox, rewards) -> dict:
    code = ctx.fill(case.code, case.name)
    start = time.time()
    t0 = time.monotonic()
    res = sandbox.run_python(code)
    elapsed = time.monotonic() - t0
    leftover = [p for p, uid in sandbox_processes() if uid == res.uid]  # checked as soon as the run returned
    reward = rewards["partial" if case.reward_hack else "fail_fast"]
    t0 = time.monotonic()
    score = reward({"tests": ADD_TESTS}, code)
    return {"res": res, "elapsed": elapsed, "leftover": leftover, "score": score,
            "reward_elapsed": time.monotonic() - t0, "window": (start, time.time())}


@pytest.fixture(scope="module")
def outcomes(ctx, sandbox, rewards):
    # cases run 3 at a time (each is mostly waiting on sandboxed children or on a timeout); every oracle
    # below is per case: its own uid, its own write target, listener hits inside its own time window
    with ThreadPoolExecutor(3) as ex:
        done = list(ex.map(lambda c: _run_case(c, ctx, sandbox, rewards), CASES))
    time.sleep(0.2)  # let the listener thread record any late connection
    return dict(zip([c.name for c in CASES], done))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_adversarial_case(case, ctx, outcomes):
    o = outcomes[case.name]
    res, score = o["res"], o["score"]
    out = res.stdout + res.stderr
    bad = [ln.decode(errors="replace") for ln in out.splitlines() if b"ESCAPED!" in ln][:3]
    bad += [f"{name} leaked into the output" for name, val in (("canary", ctx.canary), ("host secret", ctx.secret))
            if val.encode() in out]
    lo, hi = o["window"]
    bad += [f"listener {kind} reached at {t:.2f}" for t, kind in ctx.hits if lo - 0.5 <= t <= hi + 0.5]
    bad += [f"host file written: {p}" for p in ctx.targets(case.name) if os.path.lexists(p)]
    bad += [f"leftover process {pid}" for pid in o["leftover"]]
    if res.outcome == "infra_error":
        bad.append(f"attack turned into an infra error (would be masked): {res.error}")
    if case.check is not None:
        bad += case.check(ctx, res)
    if case.hangs and (res.status != "timeout" or o["elapsed"] > TIMEOUT + 1.0):
        bad.append(f"hanging program: status {res.status}, returned after {o['elapsed']:.2f} s")
    if (score.score, score.ok) != (0.0, True):
        bad.append(f"reward {score}")
    if case.hangs and o["reward_elapsed"] > TIMEOUT + 1.0:
        bad.append(f"a hanging test took {o['reward_elapsed']:.2f} s > timeout + 1 s")
    assert not bad, f"{case.name}: {bad}\nstdout={res.stdout[-600:]!r}\nstderr={res.stderr[-600:]!r}"


def test_nothing_escaped_or_survived_overall(ctx, outcomes):
    assert ctx.hits == [] and sandbox_processes() == []
    assert not [p for c in CASES for p in ctx.targets(c.name) if os.path.lexists(p)]


def test_hack_cases_really_ran_every_test(rewards):
    # the partial-mode scores above are 0 over all 3 tests, not 0 because the harness stopped early
    res = rewards["partial"]({"tests": ADD_TESTS}, "import sys\nsys.exit(0)\n")
    assert res.info["total"] == 3.0 and res.info["failed"] == 3.0 and res.info["skipped"] == 0.0


def test_world_readable_bait_is_readable_without_the_sandbox(ctx):
    # the oracles are only meaningful if an unisolated process running as a sandbox uid could reach the bait
    mode = os.stat(ctx.secret_path).st_mode
    assert mode & stat.S_IROTH and os.stat(ctx.dir).st_mode & stat.S_IWOTH
    with socket.create_connection(("127.0.0.1", ctx.tcp.getsockname()[1]), timeout=1):
        pass
    time.sleep(0.2)
    assert [kind for _, kind in ctx.hits] == ["tcp"]
    ctx.hits.clear()
