"""The sandbox launcher: runs as PID 1 of a fresh PID namespace, builds the jail and starts the program.

Executed by path (``python -I -S sandbox_launcher.py CONFIG_FD``) by ``Sandbox.run`` under ``unshare``; it
imports only the standard library (and nothing of ``lit_rl``) so it starts fast. Its config (argv, env,
files, stdin, limits) arrives as one ``marshal`` blob in a memfd: nothing is written to the host disk, so
there is nothing to clean up if the caller dies.

Process layout (the trust boundary is the line between the launcher and the inner PID namespace):

    caller ── unshare (own session) ── launcher: PID 1 of namespace A, never reachable by the program
                                          └─ inner init: PID 1 of namespace B (nested), reaps orphans
                                               └─ program (own session / process group), rlimits, no caps

* The launcher resets every signal disposition to the default (SIGPIPE: ignored). The kernel drops signals
  sent to a namespace's init from inside when it has no handler, and the program cannot even name the
  launcher: it lives in namespace B, where the launcher has no PID (no kill / prlimit / ptrace by PID), and
  namespace B's own ``/proc`` is mounted over namespace A's.
* The inner init *is* reachable (in user-namespace mode it shares the program's uid): the program may
  ``prlimit`` it or raise its ``oom_score_adj``. If it dies, the launcher reports ``INITDIED`` and the run
  is a ``fail`` -- whatever happens inside namespace B is the program's doing.
* Status lines go to the parent over a private pipe the program never holds: ``PID`` (the launcher's host
  PID), ``ERROR``/``EXECFAIL`` (set-up failed before any program code existed: infrastructure),
  ``READY``, ``EXIT <wait status>``, ``INITDIED <wait status>``, ``WATCHDOG``.
* If the parent dies (its end of the status pipe closes) the launcher exits at once, and with it every
  process of both namespaces.
"""

import ctypes
import marshal
import os
import select
import signal
import sys
import time

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MNT_DETACH = 1024, 2048, 1 << 21, 2
PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41}
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = (
    1,
    4,
    24,
    28,
    38,
)
_CLONE_NEWPID = 0x20000000
# where the new root's tmpfs is mounted inside the launcher's private mount namespace (host unaffected)
_SCRATCH = ("/tmp", "/mnt", "/run", "/var/tmp", "/opt", "/srv")


def _libc_call(fn, *args, what: str) -> None:
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(libc, src, dst: str, fstype, flags: int, data=None) -> None:
    _libc_call(
        libc.mount, _enc(src), _enc(dst), _enc(fstype), ctypes.c_ulong(flags), _enc(data), what=f"mount {dst}"
    )


def _bind_ro(libc, src: str, dst: str, extra: int = _MS_NODEV) -> None:
    """Non-recursive read-only bind (submounts of ``src`` stay hidden). Flags the source mount already has
    are kept: inside a user namespace the kernel refuses a remount that would clear them."""
    _mount(libc, src, dst, None, _MS_BIND)
    f = os.statvfs(src).f_flag
    keep = f & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    keep |= _MS_RELATIME if f & os.ST_RELATIME else 0
    _mount(libc, None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | extra | keep)


def _scratch(ro_paths) -> str:
    for d in _SCRATCH:  # a directory no bound path lives under (mounting over it hides what is below)
        if (
            os.path.isdir(d)
            and not os.path.islink(d)
            and not any(p == d or p.startswith(d + "/") for p in ro_paths)
        ):
            return d
    raise OSError(f"no scratch mount point among {_SCRATCH} outside the read-only paths")


def _build_root(libc, cfg: dict) -> None:
    root, uid = _scratch(cfg["ro_paths"]), cfg["uid"]
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
    _mount(
        libc,
        "tmpfs",
        work,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
        f"size={cfg['work_mb']}m,nr_inodes=8192,mode=0700,uid={uid},gid={uid}",
    )
    for rel, content in sorted(cfg["files"].items()):  # the caller's files, owned by the program's uid
        path = os.path.join(work, rel)
        parent = os.path.dirname(path)
        missing = []
        while not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            os.chown(d, uid, uid)
        with open(path, "wb") as f:
            f.write(content)
        os.chown(path, uid, uid)
    os.symlink("work", root + "/tmp")
    os.mkdir(root + "/proc")
    _mount(libc, "proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(root + "/dev")
    _mount(libc, "tmpfs", root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for dev in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{dev}", "wb").close()
        _mount(libc, f"/dev/{dev}", f"{root}/dev/{dev}", None, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")
    # read-only: in user-namespace mode the program is uid 0 of the namespace and would own a writable /dev
    _mount(libc, None, root + "/dev", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    os.makedirs(root + "/etc", exist_ok=True)
    for name, text in (
        ("passwd", f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/work:/bin/sh\n"),
        ("group", f"root:x:0:\nsandbox:x:{uid}:\n"),
        ("hosts", "127.0.0.1 localhost\n"),
    ):
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
    _mount(libc, None, root, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(
        root
    )  # pivot_root(".", ".") stacks the old root on the new one; detaching it drops the host tree
    _libc_call(libc.syscall, ctypes.c_long(PIVOT_ROOT_NR[os.uname().machine]), b".", b".", what="pivot_root")
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
        _libc_call(
            libc.prctl, _PR_SET_SECUREBITS, 0x2F, 0, 0, 0, what="securebits"
        )  # NOROOT|NO_SETUID_FIXUP (+locks)
        for cap in range(64):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        _libc_call(libc.capset, header, data, what="capset")
    _libc_call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, what="no_new_privs")


def _default_signals(pipe_ignored: bool) -> None:
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN if (pipe_ignored and sig == signal.SIGPIPE) else signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass  # real-time signals the interpreter reserves


def _program(libc, cfg: dict, stdin_fd: int, report_fd: int) -> None:
    """In the forked child that becomes the program: own session, stdin, rlimits, no privileges, exec."""
    try:
        os.setsid()  # its own session and process group: kill(0, ...) reaches only the program's own tree
        _default_signals(pipe_ignored=False)  # ignored dispositions would survive exec
        os.dup2(stdin_fd, 0)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 1 << 16)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # under memory pressure the program dies first (it cannot lower this again)
        _drop_privileges(libc, cfg)
        os.chdir("/work")
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])  # report_fd is close-on-exec
    except BaseException as e:  # noqa: BLE001 - nothing of the program has run yet: an infrastructure error
        os.write(report_fd, f"EXECFAIL {type(e).__name__}: {e}\n".replace("\n", " ").encode() + b"\n")
    os._exit(127)


def _inner_init(libc, cfg: dict, stdin_fd: int, report_fd: int) -> None:
    """PID 1 of namespace B: join the run's cgroups, mount B's /proc, start the program, reap, report."""
    try:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for fd in cfg["cgroup_fds"]:
            os.write(fd, b"0")  # "0" = this process; the program and its children inherit the cgroup
            os.close(fd)
        _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # over A's: A stays hidden
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        pid = os.fork()
    except BaseException as e:  # noqa: BLE001
        os.write(
            report_fd, f"EXECFAIL inner init: {type(e).__name__}: {e}\n".replace("\n", " ").encode() + b"\n"
        )
        os._exit(126)
    if pid == 0:
        _program(libc, cfg, stdin_fd, report_fd)
    os.close(stdin_fd)
    while True:  # reap everything (orphans too: zombies would pin the process budget) until the program ends
        p, st = os.waitpid(-1, 0)
        if p == pid:
            os.write(report_fd, f"EXIT {st}\n".encode())
            os._exit(0)  # init exits: the kernel kills whatever the program left running in namespace B


def launcher(cfg: dict) -> None:
    status_fd = cfg["status_fd"]
    os.set_inheritable(status_fd, False)  # neither init nor the program holds the status pipe
    _default_signals(pipe_ignored=True)  # no handlers: the kernel drops signals sent to PID 1 from inside

    def say(msg: str) -> None:
        try:
            os.write(status_fd, (msg.replace("\n", " ") + "\n").encode())
        except OSError:
            pass

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace / /proc/1/fd access, inherited by inner init
        say(f"PID {os.readlink('/proc/self')}")  # the host /proc is still mounted: this is our host PID
        stdin_fd = os.memfd_create("stdin", 0)
        os.write(stdin_fd, cfg["stdin"])
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        _build_root(libc, cfg)
        _libc_call(libc.unshare, _CLONE_NEWPID, what="unshare(CLONE_NEWPID)")  # our next child is B's init
        report_r, report_w = os.pipe()
        init_pid = os.fork()
    except BaseException as e:  # noqa: BLE001 - any setup failure is an infra error, reported verbatim
        say(f"ERROR {type(e).__name__}: {e}")
        os._exit(125)
    if init_pid == 0:
        os.close(report_r)
        _inner_init(libc, cfg, stdin_fd, report_w)
    os.close(report_w)
    os.close(stdin_fd)
    for fd in cfg["cgroup_fds"]:
        os.close(fd)
    say("READY")
    poll = select.poll()
    poll.register(report_r, select.POLLIN)
    poll.register(status_fd, 0)  # POLLERR arrives when the parent's read end is gone
    deadline, buf = time.monotonic() + cfg["watchdog_s"], b""
    while True:
        for fd, ev in poll.poll(500):
            if fd == status_fd and ev & (select.POLLERR | select.POLLHUP):
                os._exit(124)  # the caller is gone: never outlive it (namespaces die with us)
            if fd == report_r:
                data = os.read(report_r, 4096)
                if not data:
                    poll.unregister(report_r)  # every holder closed it: init is exiting or dead
                    _, st = os.waitpid(init_pid, 0)
                    lines = buf.decode(errors="replace").splitlines()
                    if any(ln.startswith("EXECFAIL ") for ln in lines):
                        say(next(ln for ln in lines if ln.startswith("EXECFAIL ")))
                    elif any(ln.startswith("EXIT ") for ln in lines):
                        say(next(ln for ln in lines if ln.startswith("EXIT ")))
                    else:
                        say(f"INITDIED {st}")
                    os._exit(0)
                buf += data[:4096]
        if time.monotonic() > deadline:  # belt and braces: the parent enforces the real limit
            say("WATCHDOG")
            os._exit(124)


if __name__ == "__main__":
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as f:
        config = marshal.loads(f.read())
    launcher(config)
