"""The parts of the code sandbox that start no process: its limits (``SandboxLimits``), what a run returns
(``SandboxResult``) and how the launcher's status lines become one (``_classify``: the infra_error rule of
``lit_rl.rewards.sandbox``), the check of the files staged into ``/work``, and ``SandboxUnavailableError``.

Separate from ``sandbox.py`` (which builds the namespaces and supervises the run) so that the rule deciding
``pass`` / ``fail`` / ``infra_error`` reads on its own page. Stdlib only, like the rest of the sandbox: the
tests copy these files to run them as an unprivileged user. Import the names from ``lit_rl.rewards.sandbox``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

OUTCOMES = ("pass", "fail", "infra_error")


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
    total_memory_mb: int | None = (
        None  # whole-run cgroup memory cap (default: memory_mb); pids.max = processes
    )

    def __post_init__(self):
        for name in (
            "cpu_s",
            "memory_mb",
            "file_size_mb",
            "open_files",
            "processes",
            "work_mb",
            "output_bytes",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.total_memory_mb is not None and int(self.total_memory_mb) < 16:
            raise ValueError(
                f"SandboxLimits.total_memory_mb must be >= 16 or None, got {self.total_memory_mb!r}"
            )


@dataclass
class SandboxResult:
    """What one run produced. ``status``: exited | signaled | timeout | output_limit | bad_files (over the
    work quota, names too long, a file where a directory is needed) | init_died (the program's namespace
    init died: the program can reach it) | lost (the launcher vanished after the program started) -- all
    ``fail`` unless exited 0 -- or infra_error."""

    status: str
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    uid: int  # host uid the program ran as (root mode: fresh per run)
    error: str | None = None  # why the run is an infra_error / init_died / lost

    @property
    def outcome(self) -> str:
        if self.status == "infra_error":
            return "infra_error"
        return "pass" if self.status == "exited" and self.exit_code == 0 else "fail"


def _classify(
    lines: list[str], reason: str | None, stdout: bytes, stderr: bytes, wall: float, uid: int, rc: int | None
) -> SandboxResult:
    """Turn the launcher's status lines and the kill reason into a ``SandboxResult``."""

    def infra(msg: str) -> SandboxResult:
        return SandboxResult("infra_error", None, stdout, stderr, wall, uid, msg)

    # infrastructure: set-up or exec failed before any program code existed (only harness code writes these)
    errors = [ln for ln in lines if ln.startswith(("ERROR ", "EXECFAIL "))]
    if errors:
        return infra(f"sandbox setup failed: {errors[0]}")
    if "READY" not in lines:
        why = "timed out" if reason == "setup_timeout" else f"exited (rc={rc})"
        return infra(
            f"sandbox launcher {why} before starting the program; stderr: "
            f"{stderr[-300:].decode(errors='replace')!r}"
        )
    # from here on the program has run: whatever happened, it may have caused it -> never infra_error
    if reason in ("timeout", "output_limit"):
        return SandboxResult(reason, None, stdout, stderr, wall, uid)
    exits = [ln for ln in lines if ln.startswith("EXIT ")]
    if exits:
        code = os.waitstatus_to_exitcode(int(exits[-1][5:]))
        return SandboxResult("exited" if code >= 0 else "signaled", code, stdout, stderr, wall, uid)
    if "WATCHDOG" in lines:
        return SandboxResult("timeout", None, stdout, stderr, wall, uid)
    died = [ln for ln in lines if ln.startswith("INITDIED ")]
    if died:
        return SandboxResult(
            "init_died",
            None,
            stdout,
            stderr,
            wall,
            uid,
            f"the program's namespace init died (wait status {died[-1][9:]}): the program can reach it",
        )
    return SandboxResult(
        "lost",
        None,
        stdout,
        stderr,
        wall,
        uid,
        f"the launcher vanished after the program started (unshare rc={rc}); scored as a fail "
        "because the program cannot be ruled out as the cause",
    )


def _unplaceable(staged: dict[str, bytes], work_mb: int) -> str | None:
    """Why these files cannot be written into a ``work_mb`` MiB /work, or None."""
    size = sum(len(c) + 4096 for c in staged.values())  # a rough tmpfs footprint: content + a page each
    if size > work_mb << 20 or len(staged) > 4096:
        return f"{len(staged)} files, ~{size >> 20} MiB: over the {work_mb} MiB /work"
    dirs: set[str] = set()
    for name in staged:
        parts = name.split("/")
        if len(name.encode()) > 1024 or len(parts) > 32 or any(len(p.encode()) > 255 for p in parts):
            return f"file name too long or too deep: {name[:80]!r}"
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    clash = sorted(dirs & set(staged))
    return f"{clash[0]!r} is both a file and a directory" if clash else None


def _stage_files(files: dict[str, str | bytes]) -> dict[str, bytes]:
    """Validate relative paths and encode contents (the launcher writes them into its private /work)."""
    out = {}
    for rel, content in files.items():
        norm = os.path.normpath(rel)
        if os.path.isabs(rel) or norm.startswith("..") or norm in (".", ""):
            raise ValueError(f"file name {rel!r} must be a relative path inside the work directory")
        out[norm] = content.encode() if isinstance(content, str) else bytes(content)
    return out
