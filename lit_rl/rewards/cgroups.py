"""Whole-run memory and process caps for sandboxes, through the host's cgroups where the host allows it.

RLIMIT_AS caps one process; a program that forks N children may hold N times that. A cgroup caps the whole
run: ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1) and ``pids.max``. ``CgroupCaps.detect()`` is called
once per process: it tries to create (and remove) a probe group under the caller's own cgroup with the
memory and pids controllers. Hosts where that is impossible (no write access, v2 without delegated
controllers, a non-root caller) fall back to rlimits only, and the reason is logged once as a warning.

Per run, ``create()`` makes ``lit_rl_sbx_<pid>_<n>`` groups with the limits set and returns their
``cgroup.procs`` files opened for writing; the sandbox's inner init writes ``0`` (itself) to them before it
starts the program, so every process of the program is inside. ``remove()`` deletes the groups once the run's
PID namespace is gone. Groups left by a caller that died (its PID no longer alive) are swept at detection.
"""

from __future__ import annotations

import itertools
import logging
import os
import time

log = logging.getLogger(__name__)
_ROOT = "/sys/fs/cgroup"
_COUNTER = itertools.count()


class CgroupCaps:
    """Per-run cgroups, or ``available=False`` with ``reason``. ``version`` is ``"v2"``, ``"v1"`` or None."""

    _detected: CgroupCaps | None = None

    def __init__(self, version: str | None, bases: dict[str, str], reason: str = ""):
        self.version, self.bases, self.reason = version, bases, reason

    @property
    def available(self) -> bool:
        return self.version is not None

    @classmethod
    def detect(cls) -> CgroupCaps:
        """The host's capability, probed once per process (a warning is logged once when unavailable)."""
        if cls._detected is None:
            caps = cls._probe()
            if not caps.available:
                log.warning(
                    "lit_rl sandbox: no per-run cgroup (%s); memory is capped per process by RLIMIT_AS "
                    "and processes by RLIMIT_NPROC only",
                    caps.reason,
                )
            cls._detected = caps
        return cls._detected

    @classmethod
    def _probe(cls) -> CgroupCaps:
        try:
            own = _own_cgroups()
        except OSError as e:
            return cls(None, {}, f"cannot read /proc/self/cgroup: {e}")
        candidates = []
        if "" in own and os.path.exists(f"{_ROOT}/cgroup.controllers"):  # pure v2 at /sys/fs/cgroup
            candidates.append(("v2", {"": _ROOT + own[""]}))
        if "memory" in own and "pids" in own:  # v1 (or hybrid) hierarchies
            candidates.append(
                ("v1", {"memory": f"{_ROOT}/memory{own['memory']}", "pids": f"{_ROOT}/pids{own['pids']}"})
            )
        reasons = []
        for version, bases in candidates:
            caps = cls(version, {k: v.rstrip("/") or "/" for k, v in bases.items()})
            try:
                if version == "v2":
                    _enable_v2_controllers(caps.bases[""])
                _sweep(caps.bases)
                probe = caps.create(memory_bytes=64 << 20, pids=8)
                for fd in probe[1]:
                    os.close(fd)
                caps.remove(probe[0])
                return caps
            except OSError as e:
                reasons.append(f"{version}: {e}")
        return cls(
            None, {}, "; ".join(reasons) or "no cgroup v2 or v1 memory+pids hierarchy for this process"
        )

    def create(self, memory_bytes: int, pids: int) -> tuple[list[str], list[int]]:
        """Make this run's groups; returns (paths, open cgroup.procs fds). Raises OSError on failure."""
        name = f"lit_rl_sbx_{os.getpid()}_{next(_COUNTER)}"
        paths, fds = [], []
        try:
            for ctrl, base in sorted(self.bases.items()):
                path = os.path.join(base, name)
                os.mkdir(path)
                paths.append(path)
                if self.version == "v2":
                    _write(path, "memory.max", memory_bytes)
                    if os.path.exists(os.path.join(path, "memory.swap.max")):
                        _write(path, "memory.swap.max", 0)
                    _write(path, "pids.max", pids)
                elif ctrl == "memory":
                    _write(path, "memory.limit_in_bytes", memory_bytes)
                    if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                        _write(path, "memory.memsw.limit_in_bytes", memory_bytes)  # no escape into swap
                else:
                    _write(path, "pids.max", pids)
                fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            self.remove(paths)
            raise
        return paths, fds

    @staticmethod
    def remove(paths: list[str]) -> None:
        """Delete a run's groups (retrying briefly: the last task's exit is reported a moment late)."""
        for path in paths:
            for attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02 * (attempt + 1) if attempt < 10 else 0.2)


def _own_cgroups() -> dict[str, str]:
    """Controller -> this process's cgroup path ("" for the v2 unified hierarchy)."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(","):
                out[c] = path
    return out


def _write(path: str, name: str, value: int) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def _enable_v2_controllers(base: str) -> None:
    with open(os.path.join(base, "cgroup.controllers")) as f:
        have = f.read().split()
    if not {"memory", "pids"} <= set(have):
        raise OSError(f"controllers {have} at {base} lack memory/pids (not delegated)")
    with open(os.path.join(base, "cgroup.subtree_control")) as f:
        on = f.read().split()
    if not {"memory", "pids"} <= set(on):
        _write_text(
            os.path.join(base, "cgroup.subtree_control"), "+memory +pids"
        )  # EBUSY if base holds tasks


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _sweep(bases: dict[str, str]) -> None:
    """Remove empty groups left by earlier callers that died before cleaning up."""
    for base in bases.values():
        for name in os.listdir(base):
            if not name.startswith("lit_rl_sbx_"):
                continue
            try:
                pid = int(name.split("_")[3])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(os.path.join(base, name))
                except OSError:
                    pass
