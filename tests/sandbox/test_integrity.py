"""No program can choose its own verdict or hurt its caller (issue 17, defects 1, 2 and 4).

* signals, ``prlimit`` and ``oom_score_adj`` aimed at PID 1 end as ``fail``, never ``infra_error``;
* ``kill(0, SIGKILL|SIGSTOP)`` reaches the program's own process group, not its caller's;
* nothing is left on disk or running when the caller itself is killed mid-run;
* where the host has cgroups, memory and processes are capped for the whole run.

The caller-facing attacks run in a separate caller process (``sbx_caller.py``), as root in user-namespace
mode (the program then has the caller's own uid: the dangerous case) and as an unprivileged user.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lit_rl.rewards import cgroups
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

REPO = Path(__file__).resolve().parents[2]
CALLER = Path(__file__).resolve().parent / "sbx_caller.py"
ROOT = os.geteuid() == 0
LIMITS = SandboxLimits(cpu_s=3, memory_mb=256, processes=16)
MODES = ["userns", "root"] if ROOT else ["userns"]

KILL_PID1 = """
import os, signal, time
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT, signal.SIGSTOP,
            signal.SIGKILL):
    try:
        os.kill(1, sig)
    except OSError as e:
        print(sig, e)
time.sleep(0.3)
raise SystemExit(3)
"""
PRLIMIT_PID1 = """
import resource, time
for target in (1,):
    for lim in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE):
        try:
            resource.prlimit(target, lim, (0, 0))
        except OSError as e:
            print(lim, e)
    try:
        open(f"/proc/{target}/oom_score_adj", "w").write("1000")
    except OSError as e:
        print("oom", e)
t = time.monotonic()
while time.monotonic() - t < 0.5:
    pass
raise SystemExit(3)
"""
SIGNAL_GROUP = "import os, signal, time\nos.kill(0, signal.{sig})\ntime.sleep(0.2)\nraise SystemExit(3)\n"


def _call(prefix: list[str], python: str, script: Path, mode: str, code: str, timeout: float = 40.0) -> dict:
    """Run a caller process in its own session; the test fails (never hangs) if the caller dies or stops."""
    proc = subprocess.Popen(
        [*prefix, python, "-I", str(script), mode, "1.5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        start_new_session=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "SBX_PYTHON": python},
    )
    try:
        out, err = proc.communicate(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGCONT)
        proc.communicate()
        pytest.fail("the caller hung: the program stopped its caller")
    assert proc.returncode == 0, f"the caller died (rc={proc.returncode}): {err[-800:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", MODES)
def test_signals_to_pid1_are_a_fail_not_infra(mode):
    # before the fix the launcher had Python's SIGINT handler: KeyboardInterrupt -> "launcher died" -> masked
    res = Sandbox(LIMITS, timeout_s=3.0, mode=mode).run_python(KILL_PID1)
    assert (res.status, res.exit_code, res.outcome) == ("exited", 3, "fail"), res


@pytest.mark.parametrize("mode", MODES)
def test_prlimit_and_oom_score_of_pid1_are_a_fail_not_infra(mode):
    res = Sandbox(LIMITS, timeout_s=3.0, mode=mode).run_python(PRLIMIT_PID1)
    assert res.outcome == "fail" and res.status in ("exited", "init_died"), res
    if res.status == "exited":
        assert res.exit_code == 3


@pytest.mark.skipif(not ROOT, reason="the root caller in userns mode is covered by the unprivileged variant")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_program_cannot_signal_its_callers_group_userns_as_root(sig):
    res = _call([], sys.executable, CALLER, "userns", SIGNAL_GROUP.format(sig=sig))
    expect = {"SIGKILL": ("signaled", -9), "SIGSTOP": ("timeout", None)}[sig]  # it hit its own group only
    assert (res["status"], res["exit_code"], res["outcome"]) == (*expect, "fail"), res


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_program_cannot_signal_its_callers_group_unprivileged(unprivileged, sig):
    res = _call(
        unprivileged.prefix,
        unprivileged.python,
        unprivileged.root / "tests/sandbox/sbx_caller.py",
        "auto",
        SIGNAL_GROUP.format(sig=sig),
    )
    assert res["root_mode"] is False  # a non-root caller: user-namespace mode, program shares its uid
    expect = {"SIGKILL": ("signaled", -9), "SIGSTOP": ("timeout", None)}[sig]
    assert (res["status"], res["exit_code"], res["outcome"]) == (*expect, "fail"), res


def test_unprivileged_kill_and_prlimit_pid1_are_a_fail(unprivileged):
    for code in (KILL_PID1, PRLIMIT_PID1):
        res = _call(
            unprivileged.prefix,
            unprivileged.python,
            unprivileged.root / "tests/sandbox/sbx_caller.py",
            "auto",
            code,
        )
        assert res["outcome"] == "fail" and res["status"] in ("exited", "init_died"), res


@pytest.mark.parametrize("mode", MODES)
def test_program_runs_in_its_own_session_in_a_nested_pid_namespace(mode):
    code = (
        "import os\nprint(os.getpid() == os.getpgrp() == os.getsid(0), os.getppid(),"
        " sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    res = Sandbox(LIMITS, timeout_s=3.0, mode=mode).run_python(code)
    # PID 1 is the inner init; the launcher has no PID here and no /proc entry
    assert res.stdout == b"True 1 [1, 2]\n", res


def _launcher_processes() -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(str(REPO / "lit_rl" / "rewards" / "sandbox").encode()) for a in argv[:4]):
            found.append(int(pid))
    return found


@pytest.mark.parametrize("mode", MODES)
def test_launcher_catches_no_signal(mode):
    sb = Sandbox(LIMITS, timeout_s=3.0, mode=mode)
    t = threading.Thread(target=sb.run_python, args=("import time; time.sleep(1.0)",))
    t.start()
    try:
        deadline, pids = time.monotonic() + 5, []
        while not pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _launcher_processes()
        assert pids, "no launcher process seen"
        time.sleep(0.2)
        caught = {}
        for pid in _launcher_processes():
            status = Path(f"/proc/{pid}/status").read_text()
            caught[pid] = int(status.split("SigCgt:")[1].split()[0], 16)
        assert caught and set(caught.values()) == {0}, caught  # a handler would let kill(1, sig) reach it
    finally:
        t.join()


@pytest.mark.skipif(not ROOT, reason="finds the program by its host process list (root sees every uid)")
def test_caller_death_leaves_no_files_and_no_processes():
    marker = f"{37 + (os.getpid() % 1000) / 1000:.3f}"  # a sleep duration nothing else on the machine uses
    code = f"import os\nos.execv('/bin/sleep', ['/bin/sleep', '{marker}'])\n"
    proc = subprocess.Popen(
        [sys.executable, "-I", str(CALLER), "auto", "60"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    proc.stdin.write(code)
    proc.stdin.close()

    def sleepers():
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == f"/bin/sleep\0{marker}\0".encode():
                    out.append(pid)
            except OSError:
                pass
        return out

    deadline = time.monotonic() + 20
    while not sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers(), "the sandboxed program never started"
    proc.kill()  # the caller dies mid-run: no finally blocks run in it
    proc.wait()
    deadline = time.monotonic() + 3
    while (sleepers() or _launcher_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers() == [] and _launcher_processes() == []
    # nothing of this run staged on disk (earlier versions left /tmp/lit_rl_sbx_*/files/main.py behind)
    staged = [
        p for p in Path(tempfile.gettempdir()).glob("lit_rl_sbx_*/files/main.py") if marker in p.read_text()
    ]
    assert staged == []


# ---------------------------------------------------------------- whole-run caps (cgroups)
MEMORY_BOMB = """
import os
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(60 << 20)  # zero-filled: 60 MiB resident in each child
        import time; time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
st = [os.waitpid(p, 0)[1] for p in kids]
print(sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in st), sum(os.WIFSIGNALED(s) for s in st))
"""


def _cg_sandbox(**kw) -> Sandbox:
    sb = Sandbox(SandboxLimits(cpu_s=3, memory_mb=200, processes=8, total_memory_mb=150), timeout_s=5.0, **kw)
    if not sb.cgroups.available:
        pytest.skip(f"no per-run cgroup on this host: {sb.cgroups.reason}")
    return sb


def test_memory_is_capped_for_the_whole_run():
    res = _cg_sandbox().run_python(MEMORY_BOMB)
    held, killed = map(int, res.stdout.split())
    assert killed >= 2 and held <= 2, res  # 4 x 60 MiB never fit in 150 MiB at once
    # the same program without the cgroup: every child holds its 60 MiB (per-process RLIMIT_AS only)
    free = Sandbox(SandboxLimits(cpu_s=3, memory_mb=200, processes=8), timeout_s=5.0, use_cgroups=False)
    assert free.run_python(MEMORY_BOMB).stdout == b"4 0\n"


@pytest.mark.skipif(not ROOT, reason="userns mode as root is where RLIMIT_NPROC does not apply")
def test_processes_are_capped_for_the_whole_run_even_where_nproc_is_ignored():
    code = (
        "import os, time\nn = 0\ntry:\n    while n < 30:\n        if os.fork() == 0:\n"
        "            time.sleep(1); os._exit(0)\n        n += 1\nexcept OSError: pass\nprint(n)"
    )
    assert int(_cg_sandbox(mode="userns").run_python(code).stdout) < 8


def test_cgroup_fallback_is_logged_once(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cgroups, "_ROOT", str(tmp_path))  # a host without cgroup files
    monkeypatch.setattr(cgroups.CgroupCaps, "_detected", None)
    with caplog.at_level(logging.WARNING, logger="lit_rl.rewards.cgroups"):
        a, b = cgroups.CgroupCaps.detect(), cgroups.CgroupCaps.detect()
    assert a is b and not a.available and a.reason
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "no per-run cgroup" in caplog.records[0].getMessage() and len(caplog.records) == 1


@pytest.mark.parametrize(
    "files, why",
    [
        ({"x.py": "1", "x.py/y.py": "2"}, "both a file and a directory"),
        ({"a" * 300 + ".py": "1"}, "too long"),
        ({"/".join(["d"] * 40) + "/f.py": "1"}, "too deep"),
        ({"big.bin": b"\0" * (9 << 20)}, "over the 8 MiB /work"),
    ],
)
def test_files_the_sandbox_cannot_place_are_a_fail_not_infra(files, why):
    # an agent chooses file names (RetryRepoEnv passes its .py files on): a bad choice is its fail, not a mask
    res = Sandbox(SandboxLimits(work_mb=8), timeout_s=2.0).run_python("print(1)", files=files)
    assert (res.status, res.outcome) == ("bad_files", "fail") and why in res.error
