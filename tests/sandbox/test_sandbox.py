"""Sandbox behaviour, one property per test: isolation, limits, timeouts, outcomes, and construction errors."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from _timing import FINISH_S

from lit_rl.rewards.sandbox import (
    _UID_BASE,
    _UID_SPAN,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
)

LIMITS = SandboxLimits(
    cpu_s=2, memory_mb=300, file_size_mb=3, open_files=40, processes=20, work_mb=8, output_bytes=5000
)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="root mode (CI runs as root)")


@pytest.fixture(scope="module")
def sb():
    return Sandbox(LIMITS, timeout_s=FINISH_S)  # programs that finish; tests of the timeout set their own


def _leftovers(uid: int) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"\nUid:\t{uid}\t" in Path(f"/proc/{pid}/status").read_text():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_runs_program_with_files_stdin_and_exit_code(sb):
    res = sb.run_python(
        "import os, sys\nprint(os.getcwd(), open('data/in.txt').read(), sys.stdin.read())\nsys.exit(3)",
        files={"data/in.txt": "payload"},
        stdin="from-stdin",
    )
    assert (res.status, res.exit_code, res.outcome) == ("exited", 3, "fail")
    assert res.stdout == b"/work payload from-stdin\n"
    ok = sb.run_python("print('hi')")
    assert (ok.status, ok.exit_code, ok.outcome, ok.stdout, ok.error) == ("exited", 0, "pass", b"hi\n", None)


def test_signal_death_is_a_fail_with_negative_code(sb):
    res = sb.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (res.status, res.exit_code, res.outcome) == ("signaled", -11, "fail")


def test_environment_is_an_allowlist(sb, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    res = sb.run_python("import os; print(sorted(os.environ))")
    assert res.stdout == b"['HOME', 'LANG', 'LC_ALL', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']\n"
    extra = Sandbox(LIMITS, timeout_s=1.0, env={"MY_FLAG": "1"}).run_python(
        "import os; print(os.environ['MY_FLAG'])"
    )
    assert extra.stdout == b"1\n"
    for name in ("GITHUB_TOKEN", "aws_secret", "http_proxy", "DB_PASSWORD"):
        with pytest.raises(ValueError, match="credential"):
            Sandbox(LIMITS, env={name: "x"})


@needs_root
def test_unprivileged_fresh_uid_without_capabilities(sb):
    code = (
        "import os; s = open('/proc/self/status').read(); print(os.getuid(), os.getgid(), os.getgroups(), "
        "'CapEff:\\t0000000000000000' in s, 'NoNewPrivs:\\t1' in s)"
    )
    a, b = sb.run_python(code), sb.run_python(code)
    uid_a = int(a.stdout.split()[0])
    assert a.stdout.decode().split()[1:] == [str(uid_a), "[]", "True", "True"]
    assert uid_a == a.uid and _UID_BASE <= uid_a < _UID_BASE + _UID_SPAN
    assert a.uid != b.uid  # a fork bomb in one run cannot use up another's RLIMIT_NPROC


def test_namespaces_pid_net_uts(sb):
    code = (
        "import os, socket\nprint(os.getpid(), open('/proc/1/cmdline','rb').read().split(b'\\0')[0] != b'',"
        " [n for _, n in socket.if_nameindex()], len([p for p in os.listdir('/proc') if p.isdigit()]))"
    )
    res = sb.run_python(code)
    pid, has_init, ifaces, nprocs = res.stdout.decode().split(" ", 3)
    assert pid == "2" and has_init == "True"  # PID 1 is the launcher: a fresh PID namespace
    assert ifaces == "['lo']"  # a fresh network namespace: loopback only, no route out
    assert nprocs.strip() == "2"  # only the launcher and the program are visible


def test_filesystem_view(sb):
    host_file = Path(sys.modules[__name__].__file__).resolve()
    code = (
        "import os\nres = []\nfor p in ('/etc/x', '/usr/x', '/x', '/work/x'):\n"
        "    try:\n        open(p, 'w').write('1'); res.append('w')\n    except OSError as e: res.append(e.errno)\n"
        f"print(res, sorted(os.listdir('/')), os.path.exists({str(host_file)!r}), sorted(os.listdir('/etc')))"
    )
    res = sb.run_python(code)
    assert res.stdout.decode() == (
        "[30, 30, 30, 'w'] ['bin', 'dev', 'etc', 'lib', 'lib64', 'proc', 'root', 'sbin', 'tmp', 'usr', 'work'] False "
        "['group', 'hosts', 'ld.so.cache', 'passwd']\n"
    )


def test_rlimits_are_applied(sb):
    code = (
        "import resource as r\nprint([r.getrlimit(getattr(r, n)) for n in "
        "('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_NPROC', 'RLIMIT_CORE')])"
    )
    res = sb.run_python(code)
    assert (
        res.stdout.decode()
        == f"[(2, 3), ({300 << 20}, {300 << 20}), ({3 << 20}, {3 << 20}), (40, 40), (20, 20), (0, 0)]\n"
    )


def test_file_size_and_work_quota(sb):
    code = (
        "import os\ntry:\n    open('/work/a', 'wb').write(b'x' * (4 << 20))\nexcept OSError as e: print(e.errno)\n"
        "n = 0\ntry:\n    while True:\n        open(f'/work/f{n}', 'wb').write(b'y' * (1 << 20)); n += 1\n"
        "except OSError as e: print(e.errno, n)"
    )
    res = sb.run_python(code)
    lines = res.stdout.decode().split("\n")
    assert lines[0] == "27"  # EFBIG: RLIMIT_FSIZE (Python ignores SIGXFSZ)
    errno_, n = lines[1].split()
    assert errno_ == "28" and 3 <= int(n) <= 8  # ENOSPC once the 8 MiB /work tmpfs is full


def test_timeout_kills_whole_tree_within_budget():
    code = (
        "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "for _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n        while True: pass\n"
        "time.sleep(100)"
    )
    t0 = time.monotonic()
    res = Sandbox(LIMITS, timeout_s=1.0).run_python(code)
    elapsed = time.monotonic() - t0
    assert (res.status, res.outcome, res.exit_code) == ("timeout", "fail", None)
    # killed at the 1 s timeout, not after the program's 100 s sleep (the bound leaves room for a loaded machine)
    assert res.wall_s >= 1.0 and elapsed <= 1.0 + 20.0
    assert _leftovers(res.uid) == []


def test_output_is_capped_and_run_stops_early(sb):
    t0 = time.monotonic()
    res = sb.run_python("import sys\nwhile True: sys.stdout.write('z' * 4096)")
    assert (res.status, res.outcome) == ("output_limit", "fail")
    assert (
        res.stdout == b"z" * 5000 and time.monotonic() - t0 < FINISH_S / 2
    )  # stopped early, not at the timeout
    under = sb.run_python("print('a' * 4000)")
    assert under.status == "exited" and len(under.stdout) == 4001


def test_exec_failure_is_an_infra_error_not_a_fail(sb):
    res = sb.run(["/no/such/binary"])
    assert (res.status, res.outcome) == ("infra_error", "infra_error")
    assert "EXECFAIL" in res.error and "No such file" in res.error


def test_setup_timeout_is_an_infra_error(tmp_path):
    hung = tmp_path / "hung-unshare"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    slow = Sandbox(LIMITS, timeout_s=1.0, setup_timeout_s=0.5)
    slow.unshare = str(hung)  # a sandbox start that never reports READY
    t0 = time.monotonic()
    res = slow.run_python("print(1)")
    assert res.outcome == "infra_error" and "timed out before starting the program" in res.error
    assert time.monotonic() - t0 < 0.5 + 1.0


def test_launcher_setup_failure_is_an_infra_error():
    bad = Sandbox(LIMITS, timeout_s=1.0)
    bad.ro_paths = (*bad.ro_paths, "/no/such/path")  # the launcher's bind mount fails inside the namespace
    res = bad.run_python("print(1)")
    assert res.outcome == "infra_error" and res.error.startswith("sandbox setup failed: ERROR")


def test_status_line_forgery_cannot_make_a_fail_pass(sb):
    # the program's stdout is not the status channel: printing launcher lines changes nothing
    res = sb.run_python("import sys\nprint('READY'); print('EXIT 0'); sys.stdout.flush(); sys.exit(4)")
    assert (res.status, res.exit_code) == ("exited", 4)


def test_concurrent_runs_are_independent(sb):
    out: dict[int, SandboxResult] = {}

    def go(i):
        out[i] = sb.run_python(
            f"import time; open('/work/me', 'w').write('{i}'); time.sleep(0.2); "
            "print(open('/work/me').read())"
        )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [out[i].stdout for i in range(3)] == [b"0\n", b"1\n", b"2\n"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"mode": "docker"}, "valid values: auto, root, userns"),
        ({"ro_paths": ("relative/path",)}, "absolute path"),
        ({"ro_paths": ("/no/such/dir",)}, "absolute path"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sandbox(LIMITS, **kwargs)


def test_bad_limits_and_files(sb):
    with pytest.raises(ValueError, match="SandboxLimits.processes must be >= 1"):
        SandboxLimits(processes=0)
    for name in ("../escape.py", "/etc/passwd", "."):
        with pytest.raises(ValueError, match="relative path inside the work directory"):
            sb.run_python("pass", files={name: "x"})
    with pytest.raises(ValueError, match="argv is empty"):
        sb.run([])


def test_missing_unshare_is_a_clear_construction_error():
    with pytest.raises(SandboxUnavailableError, match=r"util-linux.*apt-get install util-linux.*unsandboxed"):
        Sandbox(LIMITS, unshare="/nonexistent/unshare")


def test_broken_namespace_support_is_a_clear_construction_error():
    # an `unshare` that cannot create namespaces (here: /bin/false) fails the construction probe
    with pytest.raises(SandboxUnavailableError, match=r"(?s)could not create the code sandbox.*To fix:"):
        Sandbox(LIMITS, unshare=shutil.which("false"))


@needs_root
def test_user_namespace_mode_drops_all_capabilities():
    res = Sandbox(LIMITS, timeout_s=2.0, mode="userns").run_python(
        "import os; s = open('/proc/self/status').read(); print(os.getuid(), 'CapEff:\\t0000000000000000' in s,"
        " 'CapBnd:\\t0000000000000000' in s, 'NoNewPrivs:\\t1' in s)"
    )
    assert res.stdout == b"0 True True True\n"


def test_unprivileged_caller_uses_a_user_namespace_with_nproc(unprivileged):
    # the whole sandbox, started by an unprivileged uid: user namespace mode, RLIMIT_NPROC enforced
    code = (
        "import os\nn = 0\ntry:\n    while n < 50:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(1); os._exit(0)\n        n += 1\nexcept OSError: pass\nprint(n)"
    )
    out = unprivileged.run("tests/sandbox/sbx_caller.py", ["auto", "2", "8"], stdin=code, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert (res["root_mode"], res["status"]) == (False, "exited")
    assert int(res["stdout"]) < 8  # forks stop at the process limit
