"""Launching and stopping vLLM server processes owned by a trainer (``VLLMServerEngine(launch=...)``).

Process picture::

    trainer (python)
      └─ launcher  (python -m lit_rl.rollout._server_launch PARENT_PID -- <vllm command>)   own session / group
           └─ vLLM API server  (python -m vllm.entrypoints.openai.api_server ...)            same group
                └─ vLLM EngineCore (model + KV cache)                                        same group

No orphans on any exit path of the trainer: the launcher is the leader of a new process group that holds every
vLLM process, and it polls its parent pid; when the trainer is gone (normal exit, exception, SIGTERM, SIGKILL,
OOM kill) the launcher is re-parented, notices within ``_POLL_S`` and SIGKILLs its whole group. A plain
``PR_SET_PDEATHSIG`` would fire when the *thread* that started the server exits, which would take servers down
under a trainer that binds from a helper thread; polling the parent pid has no such false positive. A normal
stop (``ServerProcess.stop``, also registered with ``atexit``) SIGTERMs the group and SIGKILLs it after a grace.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

_POLL_S = 0.5


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (host, port) or the port cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One launched vLLM server (through the launcher); ``stop`` kills its whole process group."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: str):
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lit_rl.rollout._server_launch", str(os.getpid()), "--", *cmd],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # own session and process group: killpg reaches every vLLM process
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group (vLLM shuts down cleanly), SIGKILL what is left after ``grace_s``."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # the launcher may be gone with vLLM children left
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _main(argv: list[str]) -> int:
    """The launcher: start the command in this process group, kill the group when the trainer is gone."""
    parent, cmd = int(argv[0]), argv[argv.index("--") + 1 :]
    group = os.getpgid(0)

    def kill_group(*_):
        os.killpg(group, signal.SIGKILL)  # also ends this launcher

    def graceful(*_):
        child.terminate()  # the API server shuts its EngineCore down on SIGTERM
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            pass
        kill_group()

    if os.getppid() != parent:  # the trainer died before we got here
        return 1
    child = subprocess.Popen(cmd)  # inherits this process group
    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGINT, graceful)
    while True:
        if child.poll() is not None:
            kill_group()  # vLLM's own children (EngineCore) must not outlive the API server
        if os.getppid() != parent:
            kill_group()
        time.sleep(_POLL_S)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
