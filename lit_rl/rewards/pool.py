"""`RewardPool`: run reward functions with per-call timeouts, weights and infra-error masking.

Every (completion, per-row reward function) pair is one call. A call that raises, returns a non-number, reports
``ok=False`` or runs past ``timeout_s`` is an *infrastructure error*: the row's reward becomes NaN with
``valid=False`` (masked out of advantages downstream) and is counted — never silently scored 0.

Workers are daemon threads (``executor="thread"``: right for I/O-bound or GIL-releasing rewards, e.g.
sandboxed subprocesses) or forked processes (``executor="process"``: CPU-bound pure-Python rewards run in
parallel; a hung call is killed). A hung thread cannot be killed in Python, so it is abandoned and replaced
(daemon threads never block interpreter exit); training waits at most ``timeout_s`` per call. The default,
``executor="auto"``, picks processes when any reward declares ``executor = "process"`` (``MathAnswerReward``
does: sympy can hang on adversarial input, and math-verify's own timeout needs a main thread) and threads
otherwise.

Failures are loud: each invalid row keeps its error text (``"<reward>: <ExceptionType>: <message>"``,
truncated to ``max_error_chars``) in ``RewardBatch.errors`` (the rollout puts it into
``Experience.reward_errors``); every scoring call with errors emits one ``RewardErrorWarning`` quoting the
first few; and when more than ``max_invalid_frac`` of the rows of the last ``window`` scoring calls had no
reward, ``score`` raises ``RewardFailureError`` quoting the most frequent error, so a run whose reward never
works stops instead of finishing green: at the first scoring call where no row has a reward, and within
``window`` steps when only some rows do.

TRL-style rewards (``fn(prompts, completions, **kwargs)``) are one call per scoring call with the whole batch
(``timeout_s`` then limits that call; a failed call fails every row); per-row rewards are one call per row.
A ``None`` score means "not applicable": skipped in the weighted sum (as TRL), counted in
``reward/<name>/none_frac``; a row no reward applies to has no reward.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import queue
import threading
import time
import warnings
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from lit_rl.rewards.adapters import TRLRewardAdapter, adapt_reward, record_columns
from lit_rl.rewards.base import RewardResult, TrainerState, as_result

EXECUTORS = ("auto", "thread", "process")


class RewardErrorWarning(UserWarning):
    """Some rows of a scoring call have no reward (the message quotes the first few errors)."""


class RewardFailureError(RuntimeError):
    """Too many rows without a reward over the pool's window: the reward function is broken."""


@dataclass
class RewardBatch:
    total: torch.Tensor  # (B,) float64 weighted sum; NaN where invalid
    valid: torch.Tensor  # (B,) bool
    components: dict[str, torch.Tensor]  # name -> (B,) float64, NaN where that call failed
    errors: list[str | None]  # per row: why it is invalid
    metrics: dict[str, float] = field(default_factory=dict)


class _ThreadWorkers:
    def __init__(self, n: int):
        self.n, self.q, self.lock, self.alive = n, queue.Queue(), threading.Lock(), 0
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

    def submit(self, fn: Callable, *args) -> Future:
        fut: Future = Future()
        fut.started_at = None
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


class RewardPool:
    """Score completions with one or several reward functions.

    Args:
        rewards: one function, a list (named by their ``__name__``/class) or a dict name -> function. Each is
            ``fn(prompt, completion) -> float | RewardResult`` or TRL-style ``fn(prompts, completions,
            **columns) -> list[float]`` (adapted; see ``lit_rl.rewards.adapters``); anything else is refused here.
        weights: name -> weight of each component in the total (default 1.0 each).
        timeout_s: per-call limit; past it the call is an infra error.
        num_workers: parallel calls.
        executor: ``"auto"`` (default: processes if a reward declares ``executor = "process"``, else threads;
            the choice is made for the whole pool, so a reward model sharing a pool with ``MathAnswerReward``
            gets a copy per worker process -- give it its own pool or set ``executor``), ``"thread"`` or
            ``"process"`` (see module doc).
        max_invalid_frac: stop (``RewardFailureError``) when more than this fraction of the rows scored by
            the last ``window`` calls had no reward, or when one call has no row with a reward; ``None`` never
            stops. In [0, 1).
        window: number of scoring calls (one per training step) the fraction is measured over; the check
            starts once that many calls were made, so a reward that always fails stops the run at step ``window``.
        max_error_chars: error texts are cut to this many characters.
        warn_rows: how many row errors one ``RewardErrorWarning`` quotes.
    """

    def __init__(
        self,
        rewards: Callable | list[Callable] | dict[str, Callable],
        weights: dict[str, float] | None = None,
        timeout_s: float = 10.0,
        num_workers: int = 1,
        executor: str = "auto",
        max_invalid_frac: float | None = 0.5,
        window: int = 5,
        max_error_chars: int = 300,
        warn_rows: int = 3,
    ):
        if callable(rewards) and not isinstance(rewards, (list, dict)):
            rewards = [rewards]
        if isinstance(rewards, list):
            rewards = {_name_of(f): f for f in rewards}
        if not rewards:
            raise ValueError("RewardPool: rewards is empty; pass at least one reward function")
        for name, fn in rewards.items():
            if not callable(fn):
                raise TypeError(f"RewardPool: reward {name!r} is not callable ({type(fn).__name__})")
        weights = dict(weights or {})
        unknown = set(weights) - set(rewards)
        if unknown:
            raise ValueError(f"RewardPool: weights name unknown rewards {sorted(unknown)}; rewards are {sorted(rewards)}")
        if not timeout_s > 0:  # `not >` also rejects NaN, which would disable the timeout
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r}; valid values: {', '.join(EXECUTORS)}")
        if max_invalid_frac is not None and not 0.0 <= max_invalid_frac < 1.0:
            raise ValueError(f"max_invalid_frac must be in [0, 1) or None (never stop), got {max_invalid_frac}")
        if window < 1:
            raise ValueError(f"window must be >= 1 (scoring calls), got {window}")
        if max_error_chars < 20:
            raise ValueError(f"max_error_chars must be >= 20, got {max_error_chars}")
        if warn_rows < 0:
            raise ValueError(f"warn_rows must be >= 0, got {warn_rows}")
        self.rewards = {n: adapt_reward(n, f) for n, f in rewards.items()}
        self.weights = {n: float(weights.get(n, 1.0)) for n in self.rewards}
        if executor == "auto":
            wants = [n for n, f in self.rewards.items() if getattr(f, "executor", None) == "process"]
            executor = "process" if wants else "thread"
        self.timeout_s, self.num_workers, self.executor = timeout_s, num_workers, executor
        self.max_invalid_frac, self.window = max_invalid_frac, window
        self.max_error_chars, self.warn_rows = max_error_chars, warn_rows
        self._recent: deque[tuple[int, int, Counter]] = deque(maxlen=window)  # (invalid rows, rows, error texts)
        self._workers = None
        self.trainer_state = TrainerState()  # what TRL-style rewards get as trainer_state (RolloutCallback updates it)

    def _pool(self):
        if self._workers is None:
            fns = list(self.rewards.values())
            self._workers = _ThreadWorkers(self.num_workers) if self.executor == "thread" else _ProcessWorkers(
                self.num_workers, fns)
        return self._workers

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __call__(self, prompts: list[Any], completions: list[str], **kw) -> RewardBatch:
        return self.score(prompts, completions, **kw)

    def check_columns(self, records: list[Any]) -> None:
        """Refuse, at setup, a TRL-style reward with a required parameter that neither the trainer passes nor
        the data has as a column (``records``: the prompt records); the error names what is available."""
        columns = {k for r in records for k in record_columns(r)}
        for fn in self.rewards.values():
            if isinstance(fn, TRLRewardAdapter):
                fn.check_columns(columns)

    def score(self, prompts: list[Any], completions: list[str], completion_ids: list[list[int]] | None = None,
              trainer_state: TrainerState | None = None) -> RewardBatch:
        """Score B rows. Per-row rewards are called once per row, TRL-style ones once with the whole batch
        (with ``completion_ids`` and ``trainer_state``; default: the pool's ``trainer_state``, which the
        RolloutCallback keeps current). A ``None`` score is "not applicable": skipped in the weighted sum."""
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        if completion_ids is not None and len(completion_ids) != len(completions):
            raise ValueError(f"score: {len(completion_ids)} completion_ids but {len(completions)} completions")
        state = trainer_state if trainer_state is not None else self.trainer_state
        names = list(self.rewards)
        B = len(prompts)
        calls, where = [], []  # where[j]: (reward index, row or None for a whole-batch call)
        for k, n in enumerate(names):
            if getattr(self.rewards[n], "batched", False):
                calls.append((k, (list(prompts), list(completions), completion_ids, state)))
                where.append((k, None))
            else:
                calls += [(k, (p, c)) for p, c in zip(prompts, completions)]
                where += [(k, i) for i in range(B)]
        t0 = time.monotonic()
        raw = self._run(calls, names) if B else []
        wall = time.monotonic() - t0
        comps = {n: torch.full((B,), float("nan"), dtype=torch.float64) for n in names}
        applies = torch.zeros(B, dtype=torch.bool)  # some reward returned a score (not None) for the row
        errors: list[str | None] = [None] * B
        latency = {n: 0.0 for n in names}
        n_calls = {n: 0 for n in names}
        n_timeouts = n_errors = 0
        none_rows = {n: 0 for n in names}

        def fail(k: int, row: int, why: str) -> None:
            nonlocal n_errors, n_timeouts
            n_errors += 1
            n_timeouts += "timed out" in why
            errors[row] = errors[row] or _cut(f"{names[k]}: {why}", self.max_error_chars)

        for (k, row), (ok, val, dt) in zip(where, raw):
            latency[names[k]] += dt
            n_calls[names[k]] += 1
            rows = range(B) if row is None else [row]
            vals = val if (ok and row is None) else [val] * len(rows)
            for r, v in zip(rows, vals):
                if not ok:
                    fail(k, r, str(v))
                    continue
                if v is None:  # not applicable (TRL): skipped in the weighted sum
                    none_rows[names[k]] += 1
                    continue
                try:
                    res = as_result(v)
                except TypeError as e:
                    fail(k, r, f"TypeError: {e}")
                    continue
                if not res.ok:
                    fail(k, r, _not_ok_text(res))
                    continue
                comps[names[k]][r] = res.score
                applies[r] = True
        for r in range(B):
            if errors[r] is None and not applies[r]:
                errors[r] = "no reward applies to this row (every reward returned None)"
        valid = torch.tensor([e is None for e in errors], dtype=torch.bool)
        total = sum(self.weights[n] * comps[n].nan_to_num(0.0) for n in names)
        total = torch.where(valid, total, torch.full_like(total, float("nan")))
        n_invalid = B - int(valid.sum())
        metrics = {"reward/infra_errors": float(n_errors), "reward/timeouts": float(n_timeouts),
                   "reward/invalid_frac": n_invalid / max(B, 1), "perf/reward_s": wall}
        for n in names:
            ok_mask = ~comps[n].isnan()
            metrics[f"reward/{n}"] = float(comps[n][ok_mask].mean()) if ok_mask.any() else math.nan
            metrics[f"perf/reward_{n}_call_s"] = latency[n] / max(n_calls[n], 1)
            if none_rows[n]:
                metrics[f"reward/{n}/none_frac"] = none_rows[n] / max(B, 1)
        self._report(errors)
        return RewardBatch(total, valid, comps, errors, metrics)

    def _report(self, errors: list[str | None]) -> None:
        """Warn once per call with errors; raise when the window's invalid fraction is over the limit."""
        bad = [(i, e) for i, e in enumerate(errors) if e is not None]
        if bad and self.warn_rows:
            shown = "; ".join(f"row {i}: {e}" for i, e in bad[: self.warn_rows])
            warnings.warn(f"RewardPool: {len(bad)}/{len(errors)} rows have no reward (masked out of training); "
                          f"first {min(len(bad), self.warn_rows)}: {shown}", RewardErrorWarning, stacklevel=3)
        self._recent.append((len(bad), len(errors), Counter(e for _, e in bad)))
        if self.max_invalid_frac is None:
            return
        if bad and len(bad) == len(errors):  # not one row scored: no point waiting for the window
            err, times = Counter(e for _, e in bad).most_common(1)[0]
            raise RewardFailureError(
                f"RewardPool: none of the {len(errors)} rows of this scoring call has a reward. Most frequent error "
                f"({times}x): {err}. Fix the reward function (or the data it reads); set max_invalid_frac to null "
                "to train on whatever rows do get a reward.")
        if len(self._recent) < self.window:
            return
        n_bad = sum(b for b, _, _ in self._recent)
        n_rows = sum(n for _, n, _ in self._recent)
        if n_rows and n_bad / n_rows > self.max_invalid_frac:
            counts = sum((c for _, _, c in self._recent), Counter())
            err, times = counts.most_common(1)[0]
            raise RewardFailureError(
                f"RewardPool: {n_bad}/{n_rows} rows ({n_bad / n_rows:.0%}) of the last {len(self._recent)} scoring "
                f"calls had no reward (max_invalid_frac={self.max_invalid_frac}). Most frequent error ({times}x): "
                f"{err}. Fix the reward function (or the data it reads), or raise max_invalid_frac / set it to "
                "null to train on the valid rows only.")

    def _run(self, calls, names) -> list[tuple[bool, Any, float]]:
        pool = self._pool()
        if isinstance(pool, _ProcessWorkers):
            t0 = time.monotonic()
            res = pool.run_all(calls, self.timeout_s)
            dt = (time.monotonic() - t0) / max(len(calls), 1)  # processes don't report per-call time
            return [(ok, v, dt) for ok, v in res]
        fns = [self.rewards[n] for n in names]
        futs = [pool.submit(fns[k], *args) for k, args in calls]
        out: list[Any] = [None] * len(futs)
        while any(o is None for o in out):
            now = time.monotonic()
            for i, f in enumerate(futs):
                if out[i] is not None:
                    continue
                if f.done():
                    dt = now - (f.started_at or now)
                    exc = f.exception()
                    out[i] = (exc is None, f.result() if exc is None else f"{type(exc).__name__}: {exc}", dt)
                elif f.started_at is not None and now - f.started_at > self.timeout_s:
                    f.cancel()
                    pool.abandon(f)
                    out[i] = (False, f"timed out after {self.timeout_s}s", self.timeout_s)
            time.sleep(0.0005)
        return out


def _not_ok_text(res: RewardResult) -> str:
    if res.error:
        return res.error
    flags = ", ".join(f"{k}={v:g}" for k, v in res.info.items() if v)
    return "reward reported ok=False" + (f" ({flags})" if flags else "")


def _cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())  # one line: tracebacks and multi-line messages stay readable in tables
    return text if len(text) <= n else text[: n - 3] + "..."


def _name_of(fn: Callable) -> str:
    name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return str(name)
