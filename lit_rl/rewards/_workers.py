"""The reward pool's workers: daemon threads, or forked processes holding copies of the reward functions.

A hung thread cannot be killed in Python, so ``_ThreadWorkers.abandon`` replaces it (daemon threads never block
interpreter exit); a hung process is killed and replaced (``_ProcessWorkers.run_all``). See ``pool.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class TimedFuture(Future):
    """A call's future and when a worker started it (None while queued): the pool's timeout starts there."""

    started_at: float | None = None


class _ThreadWorkers:
    def __init__(self, n: int):
        self.n, self.lock, self.alive = n, threading.Lock(), 0
        self.q: queue.Queue[tuple[TimedFuture, Callable, tuple]] = queue.Queue()
        for _ in range(n):
            self._spawn()

    def _spawn(self) -> None:
        with self.lock:
            self.alive += 1
        threading.Thread(target=self._loop, daemon=True, name="lit_rl-reward").start()

    def _loop(self) -> None:
        while True:
            fut, fn, args = self.q.get()
            fut.started_at = time.monotonic()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - any failure of user code is an infra error
                fut.set_exception(e)
            with self.lock:  # a replacement was spawned while we hung: retire to keep n workers
                if self.alive > self.n:
                    self.alive -= 1
                    return

    def submit(self, fn: Callable, *args) -> TimedFuture:
        fut = TimedFuture()
        self.q.put((fut, fn, args))
        return fut

    def abandon(self, fut: Future) -> None:
        self._spawn()  # the stuck thread keeps running but no longer counts towards capacity

    def close(self) -> None:
        pass


def _proc_loop(conn, fns) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        idx, args = msg
        try:
            out = (True, fns[idx](*args))
        except BaseException as e:  # noqa: BLE001
            out = (False, f"{type(e).__name__}: {e}")
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable return value
            msg = f"reward result could not be sent back from the worker process: {type(e).__name__}: {e}"
            conn.send((False, msg))


class _ProcessWorkers:
    """Forked workers holding copies of the reward functions; a hung call's worker is killed and replaced."""

    def __init__(self, n: int, fns: list[Callable]):
        self.fns, self.ctx = fns, mp.get_context("fork")
        self.idle: list = [self._spawn() for _ in range(n)]

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_proc_loop, args=(child, self.fns), daemon=True)
        p.start()
        return p, parent

    def run_all(self, calls: list[tuple[int, tuple]], timeout: float) -> list[tuple[bool, Any]]:
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        busy: dict[int, tuple] = {}  # call index -> (worker, started)
        while pending or busy:
            while pending and self.idle:
                i = pending.pop(0)
                w = self.idle.pop()
                w[1].send(calls[i])
                busy[i] = (w, time.monotonic())
            time.sleep(0.0005)
            for i, (w, t0) in list(busy.items()):
                if w[1].poll():
                    try:
                        results[i] = w[1].recv()
                        self.idle.append(w)
                    except (EOFError, OSError):
                        results[i] = (False, f"reward worker process died (exit code {w[0].exitcode})")
                        self.idle.append(self._spawn())
                    del busy[i]
                elif not w[0].is_alive():
                    results[i] = (False, f"reward worker process died (exit code {w[0].exitcode})")
                    self.idle.append(self._spawn())
                    del busy[i]
                elif time.monotonic() - t0 > timeout:
                    w[0].kill()
                    w[0].join(1)
                    results[i] = (False, f"timed out after {timeout}s")
                    self.idle.append(self._spawn())
                    del busy[i]
        return results

    def close(self) -> None:
        for p, conn in self.idle:
            try:
                conn.send(None)
            except OSError:
                pass
            p.join(0.5)
            if p.is_alive():
                p.kill()
        self.idle = []
