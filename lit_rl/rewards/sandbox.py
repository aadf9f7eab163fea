"""Run untrusted programs (model-written code) under kernel-level isolation.

Python-level guards (patching ``os.system``, audit hooks) are bypassable from inside the same interpreter,
so none are used. Each ``Sandbox.run`` starts ``unshare`` (util-linux) with new network, PID, mount, IPC and
UTS namespaces. Inside, this file runs as the namespace's init ("launcher", PID 1) and:

* builds a fresh root on a tmpfs: read-only binds of ``/usr`` and the interpreter's prefix, a synthetic
  ``/etc`` (passwd/group/hosts only: no resolv.conf, no secrets), a minimal ``/dev``, its own ``/proc``, and a
  private size-capped tmpfs ``/work`` holding copies of the caller's files; then ``pivot_root``s into it and
  detaches the host tree, so no host path is reachable;
* forks the program with a scrubbed environment (allowlist only), rlimits (CPU, address space, file size,
  open files, processes, core) and, as root, a fresh unprivileged uid per run (RLIMIT_NPROC is ignored for
  root, and a per-run uid keeps one sandbox's fork bomb from eating another's process budget); without root
  it runs in a user namespace with every capability dropped; ``no_new_privs`` is always set;
* reports over a private status pipe (invisible to the program): its host PID, READY, and the program's
  wait status. The program's own stdout/stderr cannot forge these.

The parent enforces the wall-clock limit and output caps. Killing the launcher (PID 1) makes the kernel
SIGKILL every process in the PID namespace -- including ``setsid`` daemons and SIGTERM-ignoring children --
and ``unshare`` only exits once they are all reaped, so ``run`` returns with no process left behind.

Outcome is three-way: ``pass`` (exit 0), ``fail`` (non-zero exit, signal, timeout, output over the cap) or
``infra_error`` (the sandbox itself could not start or died). An infrastructure failure is never a failed
answer: rewards turn it into ``RewardResult(ok=False)``, which the pool masks and counts.

Known limits (next steps, not silently assumed away): memory is capped per process, so one run can hold up
to ``processes * memory_mb`` (a cgroup would cap the total); the program may create a nested user namespace
of its own (it sees nothing new, but the kernel surface widens; a seccomp filter would close that); and
``mode="userns"`` started by root does not enforce RLIMIT_NPROC (root mode does; non-root callers do).

A machine that cannot build the sandbox makes the constructor raise ``SandboxUnavailableError`` naming what
is missing and how to fix it; there is no unsandboxed fallback. This file imports only the standard
library because it is also executed, by path, as the launcher (``python -I -S sandbox.py CONFIG``).
"""
from __future__ import annotations

import ctypes
import marshal
import os
import select
import sys
import time

# ====================================================================== launcher (runs as PID 1 inside)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MNT_DETACH = 1024, 2048, 1 << 21, 2
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41}
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38


def _libc_call(fn, *args, what: str) -> None:
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _libc_call(libc.mount, enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data), what=f"mount {dst}")


def _bind_ro(libc, src: str, dst: str, extra: int = _MS_NODEV) -> None:
    """Non-recursive read-only bind (submounts of ``src`` stay hidden). Flags the source mount already has
    are kept: inside a user namespace the kernel refuses a remount that would clear them."""
    _mount(libc, src, dst, None, _MS_BIND)
    f = os.statvfs(src).f_flag
    keep = f & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    keep |= _MS_RELATIME if f & os.ST_RELATIME else 0
    _mount(libc, None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | extra | keep)


def _build_root(libc, cfg: dict) -> None:
    root, uid = cfg["root"], cfg["uid"]
    _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for p in cfg["ro_paths"]:
        dst = root + p
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(p):  # merged /usr: /bin -> usr/bin resolves inside the new root
            os.symlink(os.readlink(p), dst)
            continue
        if os.path.isdir(p):
            os.makedirs(dst, exist_ok=True)
        else:
            open(dst, "wb").close()
        _bind_ro(libc, p, dst)
    work = root + "/work"
    os.mkdir(work)
    _mount(libc, "tmpfs", work, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
           f"size={cfg['work_mb']}m,nr_inodes=8192,mode=0700,uid={uid},gid={uid}")
    for d, dirs, names in os.walk(cfg["files"]):  # copy the caller's files in, owned by the program's uid
        rel = os.path.relpath(d, cfg["files"])
        for n in dirs:
            os.mkdir(os.path.join(work, rel, n), 0o755)
            os.chown(os.path.join(work, rel, n), uid, uid)
        for n in names:
            with open(os.path.join(d, n), "rb") as src, open(os.path.join(work, rel, n), "wb") as dst:
                dst.write(src.read())
            os.chown(os.path.join(work, rel, n), uid, uid)
    os.symlink("work", root + "/tmp")
    os.mkdir(root + "/proc")
    _mount(libc, "proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(root + "/dev")
    _mount(libc, "tmpfs", root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for dev in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{dev}", "wb").close()
        _mount(libc, f"/dev/{dev}", f"{root}/dev/{dev}", None, _MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/etc", exist_ok=True)
    for name, text in (("passwd", f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/work:/bin/sh\n"),
                       ("group", f"root:x:0:\nsandbox:x:{uid}:\n"), ("hosts", "127.0.0.1 localhost\n")):
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
    _mount(libc, None, root, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(root)  # pivot_root(".", ".") stacks the old root on the new one; detaching it drops the host tree
    _libc_call(libc.syscall, ctypes.c_long(_PIVOT_ROOT_NR[os.uname().machine]), b".", b".", what="pivot_root")
    _libc_call(libc.umount2, b".", _MNT_DETACH, what="detach the host root")
    os.chdir("/")


def _drop_privileges(libc, cfg: dict) -> None:
    import resource
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg["root_mode"]:
        uid = cfg["uid"]  # dropping every uid/gid clears all capabilities
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:  # user namespace: stay uid 0 there but with no capabilities, and none regained by exec
        _libc_call(libc.prctl, _PR_SET_SECUREBITS, 0x2F, 0, 0, 0, what="securebits")  # NOROOT|NO_SETUID_FIXUP (+locks)
        for cap in range(64):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        _libc_call(libc.capset, header, data, what="capset")
    _libc_call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, what="no_new_privs")


def _launcher(cfg: dict) -> None:
    status_fd = cfg["status_fd"]
    os.set_inheritable(status_fd, False)  # the program never holds the status pipe

    def say(msg: str) -> None:
        try:
            os.write(status_fd, (msg.replace("\n", " ") + "\n").encode())
        except OSError:
            pass

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace / /proc/1/fd access from the program
        say(f"PID {os.readlink('/proc/self')}")  # the host /proc is still mounted: this is our host PID
        stdin_fd = os.open(cfg["stdin"], os.O_RDONLY)
        _build_root(libc, cfg)
    except BaseException as e:  # noqa: BLE001 - any setup failure is an infra error, reported verbatim
        say(f"ERROR {type(e).__name__}: {e}")
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(stdin_fd, 0)
            os.closerange(3, status_fd)
            os.closerange(status_fd + 1, 1 << 16)
            _drop_privileges(libc, cfg)
            os.chdir("/work")
            os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
        except BaseException as e:  # noqa: BLE001
            say(f"EXECFAIL {type(e).__name__}: {e}")
        os._exit(127)
    say("READY")
    os.close(stdin_fd)
    pidfd, deadline, wait_status = os.pidfd_open(pid), time.monotonic() + cfg["watchdog_s"], None
    while wait_status is None:
        select.select([pidfd], [], [], 0.1)
        while True:  # as the namespace's init we also reap orphans, so zombies do not pin the NPROC budget
            try:
                p, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if p == 0:
                break
            if p == pid:
                wait_status = st
        if wait_status is None and time.monotonic() > deadline:  # the parent is gone: never outlive it
            say("WATCHDOG")
            os._exit(124)
    say(f"EXIT {wait_status}")
    os._exit(0)  # init exits: the kernel kills whatever the program left running


if __name__ == "__main__":  # the launcher never returns; the parent half below is not even imported
    with open(sys.argv[1], "rb") as f:
        _launcher(marshal.load(f))

# ====================================================================== parent side
import re  # parent-side imports come after the launcher exits (faster sandbox start)
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass

OUTCOMES = ("pass", "fail", "infra_error")
_SECRETISH = re.compile(r"KEY|TOKEN|SECRET|PASS|CRED|AUTH|COOKIE|SESSION|PROXY", re.IGNORECASE)
_SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCH_ENV = {"PATH": _SYS_PATH, "LANG": "C.UTF-8"}  # unshare + launcher never see the caller's environment
_UID_BASE, _UID_SPAN = 1_900_000_000, 1 << 24  # far above any real account
_PROBES: dict[tuple, str | None] = {}  # construction probe results, once per configuration and process


class SandboxUnavailableError(RuntimeError):
    """The machine cannot build the sandbox (missing tool, namespaces forbidden); never falls back."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run resource limits (each a kernel rlimit unless noted)."""

    cpu_s: int = 10  # RLIMIT_CPU soft; the hard limit (SIGKILL) is 1 s later
    memory_mb: int = 1024  # RLIMIT_AS per process (virtual address space)
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 32  # RLIMIT_NPROC for the sandbox uid (tasks, threads included)
    work_mb: int = 64  # size of the private /work tmpfs (not an rlimit: caps disk use as a whole)
    output_bytes: int = 1 << 20  # per stream (stdout, stderr); the parent kills the run past it

    def __post_init__(self):
        for name in ("cpu_s", "memory_mb", "file_size_mb", "open_files", "processes", "work_mb", "output_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    """What one run produced. ``status``: exited | signaled | timeout | output_limit | infra_error."""

    status: str
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    uid: int  # host uid the program ran as (root mode: fresh per run)
    error: str | None = None  # why the run is an infra_error

    @property
    def outcome(self) -> str:
        if self.status == "infra_error":
            return "infra_error"
        return "pass" if self.status == "exited" and self.exit_code == 0 else "fail"


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
    """

    def __init__(self, limits: SandboxLimits | None = None, timeout_s: float = 10.0, python: str | None = None,
                 python_flags: tuple[str, ...] = ("-E", "-s", "-S"), ro_paths: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, mode: str = "auto", unshare: str | None = None,
                 setup_timeout_s: float = 20.0):
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
        self.unshare = shutil.which(unshare or "unshare", path=_SYS_PATH + ":" + os.environ.get("PATH", ""))
        if self.unshare is None:
            raise SandboxUnavailableError(
                f"the sandbox needs the `unshare` tool from util-linux >= 2.32, and {unshare or 'unshare'!r} was "
                "not found. Install it (Debian/Ubuntu: apt-get install util-linux; Fedora/RHEL: dnf install "
                "util-linux) -- refusing to run untrusted code unsandboxed.")
        if os.uname().machine not in _PIVOT_ROOT_NR:
            raise SandboxUnavailableError(f"pivot_root syscall number unknown for {os.uname().machine!r}; "
                                          f"supported: {sorted(_PIVOT_ROOT_NR)}")
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
                raise ValueError(f"env name {name!r} looks like a credential; the sandbox never receives secrets")
        self.env = {"PATH": f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work",
                    "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
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
            hints.append("inside a container, namespaces need CAP_SYS_ADMIN (docker run --privileged, or "
                         "--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined)")
        else:
            hints.append("unprivileged user namespaces must be enabled (sysctl -w kernel.unprivileged_userns_clone=1;"
                         " sysctl -w user.max_user_namespaces=15000; Ubuntu >= 23.10: sysctl -w "
                         "kernel.apparmor_restrict_unprivileged_userns=0), or run as root")
        return "could not create the code sandbox (refusing to run untrusted code unsandboxed): " + detail + \
            "\nTo fix: " + "; ".join(hints)

    # ------------------------------------------------------------------ running
    def run_python(self, code: str, files: dict[str, str | bytes] | None = None, stdin: bytes | str = b"",
                   timeout_s: float | None = None, args: tuple[str, ...] = ()) -> SandboxResult:
        """Run ``code`` as ``/work/main.py`` with the sandbox interpreter (``files`` are copied beside it)."""
        return self.run([self.python, *self.python_flags, "/work/main.py", *args],
                        files={**(files or {}), "main.py": code}, stdin=stdin, timeout_s=timeout_s)

    def run(self, argv: list[str], files: dict[str, str | bytes] | None = None, stdin: bytes | str = b"",
            timeout_s: float | None = None) -> SandboxResult:
        """Run ``argv`` (paths as seen inside the sandbox) in a fresh sandbox; ``files`` (relative path ->
        content) are copied into ``/work``, the working directory; ``stdin`` is fed on standard input."""
        if not argv:
            raise ValueError("run: argv is empty")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if timeout <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout}")
        uid = (_UID_BASE + secrets.randbelow(_UID_SPAN)) if self.root_mode else os.getuid()
        stage = tempfile.mkdtemp(prefix="lit_rl_sbx_")  # 0700: only the launcher (same user) reads it
        r = w = -1
        try:
            _stage_files(os.path.join(stage, "files"), files or {})
            with open(os.path.join(stage, "stdin"), "wb") as f:
                f.write(stdin.encode() if isinstance(stdin, str) else stdin)
            os.mkdir(os.path.join(stage, "root"))
            r, w = os.pipe()
            lim = self.limits
            cfg = {"status_fd": w, "root": os.path.join(stage, "root"), "files": os.path.join(stage, "files"),
                   "stdin": os.path.join(stage, "stdin"), "ro_paths": list(self.ro_paths), "argv": list(argv),
                   "env": self.env, "root_mode": self.root_mode, "uid": uid if self.root_mode else 0,
                   "work_mb": lim.work_mb, "watchdog_s": timeout + self.setup_timeout_s + 5,
                   "rlimits": [["RLIMIT_CPU", lim.cpu_s, lim.cpu_s + 1],
                               ["RLIMIT_AS", lim.memory_mb << 20, lim.memory_mb << 20],
                               ["RLIMIT_FSIZE", lim.file_size_mb << 20, lim.file_size_mb << 20],
                               ["RLIMIT_NOFILE", lim.open_files, lim.open_files],
                               ["RLIMIT_NPROC", lim.processes, lim.processes], ["RLIMIT_CORE", 0, 0]]}
            cmd = [self.unshare, "--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child=SIGKILL"]
            if not self.root_mode:
                cmd += ["--user", "--map-root-user"]
            with open(os.path.join(stage, "config"), "wb") as f:
                marshal.dump(cfg, f)  # marshal, not json: the launcher starts faster without json's imports
            cmd += ["--", sys.executable, "-I", "-S", os.path.abspath(__file__), os.path.join(stage, "config")]
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=(w,), env=_LAUNCH_ENV)
            except OSError as e:
                return SandboxResult("infra_error", None, b"", b"", 0.0, uid, f"could not start unshare: {e}")
            os.close(w)
            w = -1
            return self._supervise(proc, r, timeout, uid)
        finally:
            for fd in (r, w):
                if fd >= 0:
                    os.close(fd)
            shutil.rmtree(stage, ignore_errors=True)

    def _supervise(self, proc: subprocess.Popen, status_r: int, timeout: float, uid: int) -> SandboxResult:
        """Pump the three pipes until all close; enforce setup/wall deadlines and output caps."""
        cap = self.limits.output_bytes
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
            head, _, last = stderr[:-1].rpartition(b"\n")  # unshare's note about its killed child, not the program's
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


def _classify(lines: list[str], reason: str | None, stdout: bytes, stderr: bytes, wall: float, uid: int,
              rc: int | None) -> SandboxResult:
    """Turn the launcher's status lines and the kill reason into a ``SandboxResult``."""
    def infra(msg: str) -> SandboxResult:
        return SandboxResult("infra_error", None, stdout, stderr, wall, uid, msg)

    errors = [ln for ln in lines if ln.startswith(("ERROR ", "EXECFAIL "))]
    if errors:
        return infra(f"sandbox setup failed: {errors[0]}")
    if "READY" not in lines:
        why = "timed out" if reason == "setup_timeout" else f"exited (rc={rc})"
        return infra(f"sandbox launcher {why} before starting the program; stderr: "
                     f"{stderr[-300:].decode(errors='replace')!r}")
    if reason in ("timeout", "output_limit"):
        return SandboxResult(reason, None, stdout, stderr, wall, uid)
    exits = [ln for ln in lines if ln.startswith("EXIT ")]
    if exits:
        code = os.waitstatus_to_exitcode(int(exits[-1][5:]))
        return SandboxResult("exited" if code >= 0 else "signaled", code, stdout, stderr, wall, uid)
    if "WATCHDOG" in lines:
        return SandboxResult("timeout", None, stdout, stderr, wall, uid)
    return infra(f"sandbox launcher died without reporting the program's status (unshare rc={rc})")


def _stage_files(dst: str, files: dict[str, str | bytes]) -> None:
    os.mkdir(dst)
    for rel, content in files.items():
        norm = os.path.normpath(rel)
        if os.path.isabs(rel) or norm.startswith("..") or norm in (".", ""):
            raise ValueError(f"file name {rel!r} must be a relative path inside the work directory")
        path = os.path.join(dst, norm)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
