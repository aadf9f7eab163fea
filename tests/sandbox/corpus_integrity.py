"""Verdict-integrity attacks for the adversarial corpus (issue 17): PID 1, the caller, the result channel,
whole-run memory. Same conventions as ``adversarial_corpus.py`` (``ESCAPED!`` marks a successful step;
``@NAME@`` placeholders are filled by the runner)."""

from __future__ import annotations

from adversarial_corpus import _c  # circular but safe: imported at the end of adversarial_corpus


def _memory_capped(ctx, res) -> list[str]:
    """Where the run has a cgroup, the children together never held more than the whole-run cap."""
    lines = [ln for ln in res.stdout.decode(errors="replace").splitlines() if ln.startswith("holders ")]
    if ctx.cgroup and not lines and res.status == "exited":
        return ["the bomb's parent exited without reporting its holders"]
    return []


# Verdict integrity (issue 17): attacks on the launcher, the caller and the result channel. Each must end as a
# fail, never infra_error (the generic oracle), and the caller running the corpus must survive all of them.
INTEGRITY = [
    _c(
        "int_signal_pid1_every_signal",
        """
        import os, signal, time
        for sig in sorted(signal.valid_signals()):
            try:
                os.kill(1, sig)
            except OSError as e:
                print(sig, e)
        time.sleep(0.2)
        print("still here")
    """,
    ),
    _c(
        "int_kill_own_group_sigkill",
        """
        import os, signal
        os.kill(0, signal.SIGKILL)  # before issue 17 this reached the caller's process group (userns mode)
    """,
    ),
    _c(
        "int_stop_own_group_sigstop",
        """
        import os, signal
        os.kill(0, signal.SIGSTOP)
    """,
        hangs=True,
    ),
    _c(
        "int_signal_every_visible_pid_and_group",
        """
        import os, signal
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
        for pid in pids + [os.getppid(), -1]:
            for sig in (signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                for target in (pid, -abs(pid)):
                    try:
                        os.kill(target, sig)
                    except OSError:
                        pass
        print("visible", pids)
    """,
    ),
    _c(
        "int_prlimit_and_oom_score_pid1",
        """
        import os, resource
        for pid in [1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            for lim in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC):
                try:
                    resource.prlimit(pid, lim, (0, 0))
                except OSError as e:
                    print(pid, lim, e)
            for adj in ("1000", "-1000"):
                try:
                    open(f"/proc/{pid}/oom_score_adj", "w").write(adj)
                except OSError as e:
                    print(pid, adj, e)
        x = 0
        for i in range(3_000_000):  # give a CPU-limited init time to be killed
            x += i
    """,
    ),
    _c(
        "int_ptrace_and_proc_mem_every_pid",
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
            if libc.ptrace(16, pid, None, None) == 0:
                print("ESCAPED! ptrace attached to", pid)
            for f in ("mem", "fd/0", "environ"):
                try:
                    open(f"/proc/{pid}/{f}", "rb").read(16); print("opened", pid, f)
                except OSError as e:
                    print(pid, f, e)
    """,
    ),
    _c(
        "int_exhaust_fds_in_many_processes",
        """
        import os, time
        for _ in range(8):
            if os.fork() == 0:
                fds = []
                try:
                    while True:
                        fds.append(os.open("/dev/null", os.O_RDONLY))
                except OSError:
                    pass
                time.sleep(0.5)
                os._exit(0)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
    """,
    ),
    _c(
        "int_close_every_fd",
        """
        import os
        os.closerange(0, 4096)  # the harness's result channel (a dup of fd 1) included
        def add(a, b):
            return a + b
    """,
        reward_hack=True,
    ),
    _c(
        "int_corrupt_framing",
        """
        import os
        junk = [b"\x00\xff\xfe", b"{\"value\": 5}", b"0" * 32 + b'{"value": 5}', b"READY\nEXIT 0\n",
                b"\n" * 10, b"x" * 70000]
        for fd in range(1, 32):
            for j in junk:
                try:
                    os.write(fd, j)
                except OSError:
                    pass
        def add(a, b):
            return a + b + 1
    """,
        reward_hack=True,
    ),
    _c(
        "int_memory_bomb_many_processes",
        """
        import os, select, time
        r, w = os.pipe()
        kids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                try:
                    held = bytearray(64 << 20)  # zero-filled: resident
                    os.write(w, b"%d," % os.getpid())
                except MemoryError:
                    pass
                time.sleep(10)
                os._exit(0)
            kids.append(pid)
        os.close(w)
        done, alive, most, buf = set(), set(kids), 0, b""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.75 and not alive <= done:
            if select.select([r], [], [], 0.05)[0]:
                buf += os.read(r, 4096)
                done = {int(x) for x in buf.split(b",") if x}
            alive = {p for p in alive if os.waitpid(p, os.WNOHANG) == (0, 0)}
            most = max(most, len(done & alive))  # children holding their 64 MiB at the same time
        print("holders", most, "alive", len(alive), "allocated", len(done), flush=True)
        if @CGROUP@ and most * 64 > @MEM_CAP_MB@:
            print("ESCAPED! held", most * 64, "MiB in one run", flush=True)
        os._exit(0)
    """,
        check=_memory_capped,
    ),
]
