"""Run untrusted programs (model-written code) under kernel-level isolation.

Python-level guards (patching ``os.system``, audit hooks) are bypassable from inside the same interpreter,
so none are used. Each ``Sandbox.run`` starts ``unshare`` (util-linux), in a session of its own, with new
network, PID, mount, IPC and UTS namespaces (plus a user namespace when the caller is not root). Inside,
``sandbox_launcher.py`` runs as the namespace's init ("launcher") and:

* builds a fresh root on a tmpfs: read-only binds of ``/usr`` and the interpreter's prefix, a synthetic
  ``/etc`` (passwd/group/hosts only: no resolv.conf, no secrets), a minimal ``/dev``, its own ``/proc``, and a
  private size-capped tmpfs ``/work`` holding the caller's files; then ``pivot_root``s into it and detaches
  the host tree, so no host path is reachable;
* starts an inner init in a *nested* PID namespace, which starts the program in a session of its own, with
  a scrubbed environment (allowlist only), rlimits (CPU, address space, file size, open files, processes,
  core), ``oom_score_adj`` 1000 and, as root, a fresh unprivileged uid per run; without root, every
  capability dropped inside the user namespace; ``no_new_privs`` always;
* reports over a private status pipe (invisible to the program) the program's wait status.

Whom the program can reach: only its own nested namespace. The launcher has no PID there, its signal
dispositions are all default (the kernel drops signals to a namespace init that has no handler), and the
caller is in another session and PID namespace, so ``kill(1, ...)``, ``kill(0, ...)``, ``kill(-1, ...)``,
``prlimit``/``ptrace``/``oom_score_adj`` of PID 1 reach at most the inner init -- whose death is the program's
``fail``. When the run has a cgroup (``cgroups.py``: v2 ``memory.max``/``pids.max``, or v1, where the host
allows it), memory and processes are capped for the whole run, not per process. Nothing is staged on the
host disk (the config travels in a memfd), and the launcher exits as soon as its caller dies.

Outcome is three-way: ``pass`` (exit 0), ``fail`` or ``infra_error``. **The rule: anything the program can
cause is ``fail``** -- a non-zero exit, a signal, a timeout, output over the cap, files over the work quota,
its inner init dying, even the launcher vanishing after the program started (status ``lost``).
``infra_error`` is kept for harness failures proven independent of the program: the sandbox could not be
set up, or the program could not be exec'd, *before any of its code existed in a process* (``ERROR`` /
``EXECFAIL`` / no ``READY`` from the launcher). Rewards turn ``infra_error`` into ``RewardResult(ok=False)``,
which the pool masks and counts; a masked row is no penalty, so a program must never be able to choose it.

Known limits: the program may create a nested user namespace of its own (it sees nothing new, but the
kernel surface widens; a seccomp filter would close that); ``mode="userns"`` started by root enforces
RLIMIT_NPROC only through the cgroup (root mode and non-root callers enforce it by rlimit).

A machine that cannot build the sandbox makes the constructor raise ``SandboxUnavailableError`` naming what
is missing and how to fix it; there is no unsandboxed fallback.

Files: this module starts and supervises the run; ``_sandbox_rules.py`` holds the limits, the result type, the
outcome rule above (``_classify``) and the staged-file checks (all re-exported here).
"""

from __future__ import annotations

import marshal
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time

# Limits, results, the outcome rule and the file checks (no process involved) live in _sandbox_rules and are
# re-exported here, the module users, rewards and tests import them from.
from lit_rl.rewards._sandbox_rules import (  # noqa: F401 - OUTCOMES, SandboxUnavailableError re-exported
    OUTCOMES,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    _classify,
    _stage_files,
    _unplaceable,
)
from lit_rl.rewards.cgroups import CgroupCaps
from lit_rl.rewards.sandbox_launcher import PIVOT_ROOT_NR as _PIVOT_ROOT_NR

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_SECRETISH = re.compile(r"KEY|TOKEN|SECRET|PASS|CRED|AUTH|COOKIE|SESSION|PROXY", re.IGNORECASE)
_SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCH_ENV = {"PATH": _SYS_PATH, "LANG": "C.UTF-8"}  # unshare + launcher never see the caller's environment
_UID_BASE, _UID_SPAN = 1_900_000_000, 1 << 24  # far above any real account
_PROBES: dict[tuple, str | None] = {}  # construction probe results, once per configuration and process


class Sandbox:
    """Namespaced, rlimited, unprivileged runner for untrusted programs.

    Args:
        limits: resource limits (``SandboxLimits``).
        timeout_s: default wall-clock limit per run, counted from the moment the program is started.
        python: interpreter used by ``run_python`` (default: this one, resolved to its real path); its
            prefix is bound read-only into the sandbox.
        python_flags: interpreter flags; default ``-E -s -S``: ignore PYTHON* variables, user and system
            site-packages (the script directory stays on ``sys.path`` so multi-file programs import).
        ro_paths: extra host paths bound read-only (absolute paths that exist).
        env: extra environment variables for the program (names that look like credentials are refused).
        mode: ``"auto"`` (root: setuid to a fresh uid; otherwise a user namespace), ``"root"`` or ``"userns"``.
        unshare: the ``unshare`` binary (default: found on the system PATH).
        setup_timeout_s: how long building the sandbox may take before the run is an infra error.
        use_cgroups: cap memory (``limits.total_memory_mb``) and processes for the whole run with a cgroup
            when the host allows it (``self.cgroups.available``; otherwise rlimits only, logged once).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        timeout_s: float = 10.0,
        python: str | None = None,
        python_flags: tuple[str, ...] = ("-E", "-s", "-S"),
        ro_paths: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        mode: str = "auto",
        unshare: str | None = None,
        setup_timeout_s: float = 20.0,
        use_cgroups: bool = True,
    ):
        if sys.platform != "linux":
            raise SandboxUnavailableError(f"the sandbox needs Linux namespaces; this is {sys.platform}")
        if timeout_s <= 0 or setup_timeout_s <= 0:
            raise ValueError(f"timeout_s and setup_timeout_s must be > 0, got {timeout_s}, {setup_timeout_s}")
        if mode not in ("auto", "root", "userns"):
            raise ValueError(f"mode={mode!r}; valid values: auto, root, userns")
        self.limits = limits or SandboxLimits()
        self.timeout_s, self.setup_timeout_s = float(timeout_s), float(setup_timeout_s)
        self.root_mode = (os.geteuid() == 0) if mode == "auto" else mode == "root"
        if self.root_mode and os.geteuid() != 0:
            raise ValueError("mode='root' needs to run as root; use mode='userns' (or 'auto')")
        found = shutil.which(unshare or "unshare", path=_SYS_PATH + ":" + os.environ.get("PATH", ""))
        if found is None:
            raise SandboxUnavailableError(
                f"the sandbox needs the `unshare` tool from util-linux >= 2.32, and {unshare or 'unshare'!r} was "
                "not found. Install it (Debian/Ubuntu: apt-get install util-linux; Fedora/RHEL: dnf install "
                "util-linux) -- refusing to run untrusted code unsandboxed."
            )
        self.unshare: str = found
        if os.uname().machine not in _PIVOT_ROOT_NR:
            raise SandboxUnavailableError(
                f"pivot_root syscall number unknown for {os.uname().machine!r}; "
                f"supported: {sorted(_PIVOT_ROOT_NR)}"
            )
        self.python = os.path.realpath(python or sys.executable)
        if not os.access(self.python, os.X_OK):
            raise SandboxUnavailableError(f"python interpreter {self.python!r} is not executable")
        self.python_flags = tuple(python_flags)
        ro = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache"]
        prefix = os.path.dirname(os.path.dirname(self.python))  # <prefix>/bin/python -> <prefix>
        for p in (*ro_paths, prefix):
            if not os.path.isabs(p) or not os.path.exists(p):
                raise ValueError(f"ro_paths entry {p!r} must be an absolute path that exists")
            if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in ro):
                ro.append(os.path.normpath(p))
        self.ro_paths = tuple(p for p in ro if os.path.lexists(p))
        for name in env or {}:
            if _SECRETISH.search(name):
                raise ValueError(
                    f"env name {name!r} looks like a credential; the sandbox never receives secrets"
                )
        self.env = {
            "PATH": f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/work",
            "TMPDIR": "/work",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        # whole-run memory / process caps where the host allows it (logged once when it does not)
        self.cgroups = (
            CgroupCaps.detect() if use_cgroups else CgroupCaps(None, {}, "disabled (use_cgroups=False)")
        )
        key = (self.unshare, self.python, self.python_flags, self.root_mode, self.ro_paths)
        if key not in _PROBES:
            _PROBES[key] = self._probe()
        if _PROBES[key] is not None:
            raise SandboxUnavailableError(_PROBES[key])

    # ------------------------------------------------------------------ construction probe
    def _probe(self) -> str | None:
        """Run a trivial program end to end; return a diagnosis (with install hints) if it does not work."""
        res = self.run_python("import os; print('sandbox-ok', os.getuid())", timeout_s=30.0)
        if res.outcome == "pass" and res.stdout.startswith(b"sandbox-ok"):
            return None
        detail = res.error or f"status={res.status} exit={res.exit_code} stderr={res.stderr[-400:]!r}"
        hints = ["util-linux >= 2.32 provides `unshare --kill-child` (apt-get install util-linux)"]
        if self.root_mode:
            hints.append(
                "inside a container, namespaces need CAP_SYS_ADMIN (docker run --privileged, or "
                "--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined)"
            )
        else:
            hints.append(
                "unprivileged user namespaces must be enabled (sysctl -w kernel.unprivileged_userns_clone=1;"
                " sysctl -w user.max_user_namespaces=15000; Ubuntu >= 23.10: sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0), or run as root"
            )
        return (
            "could not create the code sandbox (refusing to run untrusted code unsandboxed): "
            + detail
            + "\nTo fix: "
            + "; ".join(hints)
        )

    # ------------------------------------------------------------------ running
    def run_python(
        self,
        code: str,
        files: dict[str, str | bytes] | None = None,
        stdin: bytes | str = b"",
        timeout_s: float | None = None,
        args: tuple[str, ...] = (),
    ) -> SandboxResult:
        """Run ``code`` as ``/work/main.py`` with the sandbox interpreter (``files`` are copied beside it)."""
        return self.run(
            [self.python, *self.python_flags, "/work/main.py", *args],
            files={**(files or {}), "main.py": code},
            stdin=stdin,
            timeout_s=timeout_s,
        )

    def run(
        self,
        argv: list[str],
        files: dict[str, str | bytes] | None = None,
        stdin: bytes | str = b"",
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """Run ``argv`` (paths as seen inside the sandbox) in a fresh sandbox; ``files`` (relative path ->
        content) are copied into ``/work``, the working directory; ``stdin`` is fed on standard input."""
        if not argv:
            raise ValueError("run: argv is empty")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if timeout <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout}")
        uid = (_UID_BASE + secrets.randbelow(_UID_SPAN)) if self.root_mode else os.getuid()
        staged = _stage_files(files or {})
        why = _unplaceable(staged, self.limits.work_mb)
        if why:  # the files are the candidate's input (an agent picks names too): its fail, never infra_error
            return SandboxResult("bad_files", None, b"", b"", 0.0, uid, why)
        lim = self.limits
        groups: list[str] = []  # this run's cgroup paths
        group_fds: list[int] = []  # their open cgroup.procs files
        if self.cgroups.available:
            try:
                groups, group_fds = self.cgroups.create(
                    (lim.total_memory_mb or lim.memory_mb) << 20, lim.processes
                )
            except OSError as e:  # before any program code: the harness's own failure
                return SandboxResult(
                    "infra_error", None, b"", b"", 0.0, uid, f"could not create the run's cgroup: {e}"
                )
        r = w = cfg_fd = -1
        try:
            r, w = os.pipe()
            cfg = {
                "status_fd": w,
                "files": staged,
                "stdin": stdin.encode() if isinstance(stdin, str) else bytes(stdin),
                "ro_paths": list(self.ro_paths),
                "argv": list(argv),
                "env": self.env,
                "root_mode": self.root_mode,
                "uid": uid if self.root_mode else 0,
                "work_mb": lim.work_mb,
                "cgroup_fds": group_fds,
                "watchdog_s": timeout + self.setup_timeout_s + 5,
                "rlimits": [
                    ["RLIMIT_CPU", lim.cpu_s, lim.cpu_s + 1],
                    ["RLIMIT_AS", lim.memory_mb << 20, lim.memory_mb << 20],
                    ["RLIMIT_FSIZE", lim.file_size_mb << 20, lim.file_size_mb << 20],
                    ["RLIMIT_NOFILE", lim.open_files, lim.open_files],
                    ["RLIMIT_NPROC", lim.processes, lim.processes],
                    ["RLIMIT_CORE", 0, 0],
                ],
            }
            # the config travels in a memfd (marshal, not json: the launcher starts faster without json's
            # imports), so nothing is left on the host disk however this process ends
            cfg_fd = os.memfd_create("lit_rl_sbx_cfg", 0)
            os.write(cfg_fd, marshal.dumps(cfg))
            os.lseek(cfg_fd, 0, os.SEEK_SET)
            cmd = [
                self.unshare,
                "--net",
                "--pid",
                "--mount",
                "--ipc",
                "--uts",
                "--fork",
                "--kill-child=SIGKILL",
            ]
            if not self.root_mode:
                cmd += ["--user", "--map-root-user"]
            cmd += ["--", sys.executable, "-I", "-S", _LAUNCHER, str(cfg_fd)]
            try:  # own session: nothing inside can signal the caller's process group or session
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(w, cfg_fd, *group_fds),
                    env=_LAUNCH_ENV,
                    start_new_session=True,
                )
            except OSError as e:
                return SandboxResult("infra_error", None, b"", b"", 0.0, uid, f"could not start unshare: {e}")
            for fd in (w, cfg_fd, *group_fds):
                os.close(fd)
            w = cfg_fd = -1
            group_fds = []
            return self._supervise(proc, r, timeout, uid)
        finally:
            for fd in (r, w, cfg_fd, *group_fds):
                if fd >= 0:
                    os.close(fd)
            if groups:
                self.cgroups.remove(groups)

    def _supervise(self, proc: subprocess.Popen, status_r: int, timeout: float, uid: int) -> SandboxResult:
        """Pump the three pipes until all close; enforce setup/wall deadlines and output caps."""
        cap = self.limits.output_bytes
        assert proc.stdout is not None and proc.stderr is not None  # started with stdout=PIPE, stderr=PIPE
        fo, fe = proc.stdout.fileno(), proc.stderr.fileno()
        out = {fo: bytearray(), fe: bytearray()}
        status, lines = bytearray(), []
        sel = selectors.DefaultSelector()
        for fd in (*out, status_r):
            sel.register(fd, selectors.EVENT_READ)
        t_spawn = time.monotonic()
        ready_at = killed_at = pidfd = None
        reason = None  # why we killed it: timeout | output_limit | setup_timeout
        while sel.get_map():
            now = time.monotonic()
            deadline = ready_at + timeout if ready_at is not None else t_spawn + self.setup_timeout_s
            if reason is None and now >= deadline:
                reason = "timeout" if ready_at is not None else "setup_timeout"
                killed_at = now
                self._kill(proc, pidfd)
            if killed_at is not None and now > killed_at + 5.0:
                break  # the namespace is gone once unshare exits; do not wait on stray pipe holders
            for key, _ in sel.select(timeout=max(0.0, min(0.25, deadline - now)) if reason is None else 0.25):
                fd = key.fd
                data = os.read(fd, 1 << 16)
                if not data:
                    sel.unregister(fd)
                    continue
                if fd != status_r:
                    room = max(0, cap - len(out[fd]))
                    out[fd] += data[:room]
                    if len(data) > room and reason is None:
                        reason, killed_at = "output_limit", time.monotonic()
                        self._kill(proc, pidfd)
                    continue
                status += data
                while b"\n" in status:
                    line, _, rest = bytes(status).partition(b"\n")
                    status[:] = rest
                    text = line.decode(errors="replace")
                    lines.append(text)
                    if text.startswith("PID ") and pidfd is None:
                        pidfd = _pidfd(int(text[4:]))
                    elif text == "READY":
                        ready_at = time.monotonic()
        sel.close()
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if pidfd is not None:
            os.close(pidfd)
        stdout, stderr = bytes(out[fo]), bytes(out[fe])
        if reason is not None and stderr.endswith(b"\n") and b"\nunshare: " in b"\n" + stderr:
            head, _, last = stderr[:-1].rpartition(
                b"\n"
            )  # unshare's note about its killed child, not the program's
            if last.startswith(b"unshare: "):
                stderr = head + b"\n" if head else b""
        proc.stdout.close()
        proc.stderr.close()
        wall = (time.monotonic() - ready_at) if ready_at is not None else 0.0
        return _classify(lines, reason, stdout, stderr, wall, uid, proc.returncode)

    @staticmethod
    def _kill(proc: subprocess.Popen, pidfd: int | None) -> None:
        """SIGKILL the namespace's init (every process inside dies with it); unshare itself if it is unknown."""
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                proc.kill()  # --kill-child: the launcher gets SIGKILL when unshare dies
        except ProcessLookupError:
            pass


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None
