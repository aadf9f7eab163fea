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
(``timeout_s`` then limits that call; a failed call fails that reward on every row); per-row rewards are one
call per row. ``async def`` TRL-style rewards run together in one event loop (``asyncio.gather``, each under
``timeout_s``) while the other rewards run in the workers.

Per component (TRL's nansum): a reward that returns ``None`` ("not applicable", ``reward/<name>/none_frac``) or
fails for a row (``reward/<name>/errors``) is left out of that row's weighted sum; the row keeps a reward when at
least one reward with a non-zero weight scored it. A row every weighted reward failed on (or some failed and the
rest returned ``None``) is an infrastructure error: NaN, ``valid=False``, counted in ``invalid_frac`` and the
failure window. A row every reward returned ``None`` for is *unscored*: NaN, ``valid=False`` (out of its group's
baseline, advantage 0), counted in ``reward/none_rows``, never a failure. A reward failing on more than
``max_invalid_frac`` of the window's rows (or on every row of one call) stops the run too, although the other
rewards kept those rows valid: a broken component never trains silently on the rest.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lit_rl.rewards._warn_site import warn_at_reward
from lit_rl.rewards._workers import _ProcessWorkers, _ThreadWorkers
from lit_rl.rewards.adapters import BatchScores, TRLRewardAdapter, adapt_reward, record_columns
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
    # per row: what TRL-style rewards logged with log_extra ({column: value}) and "<reward>/error" for a
    # component that failed on a row that stayed valid; [] = nothing logged (the inspector's "extra")
    extras: list[dict[str, Any]] = field(default_factory=list)


class RewardPool:
    """Score completions with one or several reward functions.

    Args:
        rewards: one function, a list (named by their ``__name__``/class) or a dict name -> function. Each is
            ``fn(prompt, completion) -> float | RewardResult`` or TRL-style ``fn(prompts, completions,
            **columns) -> list[float]`` (adapted; see ``lit_rl.rewards.adapters``); anything else is refused here.
        weights: name -> weight of each component in the total (default 1.0 each), or a list with one weight
            per reward in the order of ``rewards`` (TRL's ``reward_weights``).
        timeout_s: per-call limit; past it the call is an infra error.
        num_workers: parallel calls.
        executor: ``"auto"`` (default: processes if a reward declares ``executor = "process"``, else threads;
            the choice is made for the whole pool, so a reward model sharing a pool with ``MathAnswerReward``
            gets a copy per worker process -- give it its own pool or set ``executor``), ``"thread"`` or
            ``"process"`` (see module doc).
        max_invalid_frac: stop (``RewardFailureError``) when more than this fraction of the rows scored by
            the last ``window`` calls had no reward because a reward failed, or one reward failed on more than
            this fraction of them, or when every row of one call failed, or one reward failed on every row of a
            call (rows every reward returned ``None`` for never count); ``None`` never stops. In [0, 1).
        window: number of scoring calls (one per training step) the fraction is measured over; the check
            starts once that many calls were made, so a reward that always fails stops the run at step ``window``.
        max_error_chars: error texts are cut to this many characters.
        warn_rows: how many row errors one ``RewardErrorWarning`` quotes.
    """

    def __init__(
        self,
        rewards: Callable | list[Callable] | dict[str, Callable],
        weights: dict[str, float] | list[float] | None = None,
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
        if isinstance(weights, (list, tuple)):
            if len(weights) != len(rewards):
                raise ValueError(
                    f"RewardPool: weights has {len(weights)} entries but there are {len(rewards)} "
                    f"rewards ({', '.join(rewards)}); give one weight per reward in that order, or a "
                    "dict name -> weight"
                )
            weights = dict(zip(rewards, weights))
        weights = dict(weights or {})
        bad = {
            n: w
            for n, w in weights.items()
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)
        }
        if bad:
            raise ValueError(f"RewardPool: weights must be finite numbers, got {bad}")
        unknown = set(weights) - set(rewards)
        if unknown:
            raise ValueError(
                f"RewardPool: weights name unknown rewards {sorted(unknown)}; rewards are {sorted(rewards)}"
            )
        if not timeout_s > 0:  # `not >` also rejects NaN, which would disable the timeout
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r}; valid values: {', '.join(EXECUTORS)}")
        if max_invalid_frac is not None and not 0.0 <= max_invalid_frac < 1.0:
            raise ValueError(
                f"max_invalid_frac must be in [0, 1) or None (never stop), got {max_invalid_frac}"
            )
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
        # per call: (failed rows, rows, error texts, {reward: rows it failed on})
        self._recent: deque[tuple[int, int, Counter, Counter]] = deque(maxlen=window)
        self._workers = None
        self.trainer_state = (
            TrainerState()
        )  # what TRL-style rewards get as trainer_state (RolloutCallback updates it)

    def _pool(self):
        if self._workers is None:
            fns = list(self.rewards.values())
            self._workers = (
                _ThreadWorkers(self.num_workers)
                if self.executor == "thread"
                else _ProcessWorkers(self.num_workers, fns)
            )
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

    def score(
        self,
        prompts: list[Any],
        completions: list[str],
        completion_ids: list[list[int]] | None = None,
        trainer_state: TrainerState | None = None,
    ) -> RewardBatch:
        """Score B rows. Per-row rewards are called once per row, TRL-style ones once with the whole batch
        (with ``completion_ids`` and ``trainer_state``; default: the pool's ``trainer_state``, which the
        RolloutCallback keeps current). Per-component rule: module doc."""
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        if completion_ids is not None and len(completion_ids) != len(completions):
            raise ValueError(
                f"score: {len(completion_ids)} completion_ids but {len(completions)} completions"
            )
        state = trainer_state if trainer_state is not None else self.trainer_state
        names = list(self.rewards)
        B = len(prompts)
        batch_args = (list(prompts), list(completions), completion_ids, state)
        calls: list[tuple[int, tuple]] = []  # (reward index, call arguments)
        where: list[tuple[int, int | None]] = []  # call j: (reward index, row; None: a whole-batch call)
        async_ks: list[int] = []
        async_fns: list[TRLRewardAdapter] = []
        for k, n in enumerate(names):
            fn = self.rewards[n]
            if isinstance(fn, TRLRewardAdapter) and fn.is_async:
                async_ks.append(k)
                async_fns.append(fn)
            elif getattr(fn, "batched", False):
                calls.append((k, batch_args))
                where.append((k, None))
            else:
                calls += [(k, (p, c)) for p, c in zip(prompts, completions)]
                where += [(k, i) for i in range(B)]
        t0 = time.monotonic()
        if not B:
            calls, where, async_ks, async_fns = [], [], [], []
        pending = self._start_async(async_fns, batch_args) if async_fns else None
        raw = self._run(calls, names) if calls else []
        if pending is not None:  # TRL runs async rewards concurrently with asyncio.gather: so do we
            raw += self._join_async(*pending)
            where += [(k, None) for k in async_ks]
        wall = time.monotonic() - t0
        comps = {n: torch.full((B,), float("nan"), dtype=torch.float64) for n in names}
        # per reward, per row: why it could not score the row
        failed: dict[str, list[str | None]] = {n: [None] * B for n in names}
        latency = dict.fromkeys(names, 0.0)
        n_calls = dict.fromkeys(names, 0)
        none_rows = dict.fromkeys(names, 0)
        extras: list[dict[str, Any]] = [{} for _ in range(B)]
        logged: dict[str, list[float]] = {}

        for (k, row), (ok, val, dt) in zip(where, raw):
            n = names[k]
            latency[n] += dt
            n_calls[n] += 1
            rows = range(B) if row is None else [row]
            if ok and isinstance(val, BatchScores):
                for col, vals in val.extra.items():
                    for r, v in zip(rows, vals):
                        extras[r][col] = v
                for m, vs in val.metrics.items():
                    logged.setdefault(f"reward/{n}/{m}", []).extend(vs)
                val = val.scores
            vals = val if (ok and row is None) else [val] * len(rows)
            for r, v in zip(rows, vals):
                if not ok:
                    failed[n][r] = str(v)
                    continue
                if v is None:  # not applicable (TRL): left out of the weighted sum
                    none_rows[n] += 1
                    continue
                try:
                    res = as_result(v)
                except TypeError as e:
                    failed[n][r] = f"TypeError: {e}"
                    continue
                if not res.ok:
                    failed[n][r] = _not_ok_text(res)
                    continue
                comps[n][r] = res.score
        weighted = [n for n in names if self.weights[n] != 0.0]
        errors: list[str | None] = [None] * B
        failed_rows = 0  # invalid because a reward failed (the failure window counts these)
        for r in range(B):
            fails = [(n, why) for n in names if (why := failed[n][r]) is not None]
            if any(not comps[n][r].isnan() for n in weighted):  # scored by a weighted reward: valid
                for n, why in fails:
                    extras[r][f"{n}/error"] = _cut(why, self.max_error_chars)
            elif fails:
                errors[r] = _cut(f"{fails[0][0]}: {fails[0][1]}", self.max_error_chars)
                failed_rows += 1
            elif any(not comps[n][r].isnan() for n in names):
                errors[r] = "only rewards with weight 0 scored this row"
            else:
                errors[r] = "no reward applies to this row (every reward returned None)"
        valid = torch.tensor([e is None for e in errors], dtype=torch.bool)
        weighted_sum = (self.weights[n] * comps[n].nan_to_num(0.0) for n in names)
        total = sum(weighted_sum, torch.zeros(B, dtype=torch.float64))
        total = torch.where(valid, total, torch.full_like(total, float("nan")))
        n_invalid = B - int(valid.sum())
        n_errors = sum(f is not None for n in names for f in failed[n])
        n_timeouts = sum(f is not None and "timed out" in f for n in names for f in failed[n])
        unscored = sum(e is not None and e.startswith("no reward applies") for e in errors)
        metrics = {
            "reward/infra_errors": float(n_errors),
            "reward/timeouts": float(n_timeouts),
            "reward/invalid_frac": n_invalid / max(B, 1),
            "perf/reward_s": wall,
            "reward/none_rows": float(unscored),
        }
        for n in names:
            ok_mask = ~comps[n].isnan()
            metrics[f"reward/{n}"] = float(comps[n][ok_mask].mean()) if ok_mask.any() else math.nan
            metrics[f"reward/{n}/errors"] = float(sum(f is not None for f in failed[n]))
            metrics[f"perf/reward_{n}_call_s"] = latency[n] / max(n_calls[n], 1)
            if none_rows[n]:
                metrics[f"reward/{n}/none_frac"] = none_rows[n] / max(B, 1)
        metrics.update(
            {k: sum(v) / len(v) for k, v in logged.items()}
        )  # log_metric: mean over the step's calls
        self._report(errors, failed_rows, {n: sum(f is not None for f in failed[n]) for n in names}, failed)
        return RewardBatch(total, valid, comps, errors, metrics, extras if any(extras) else [])

    def _report(
        self,
        errors: list[str | None],
        failed_rows: int,
        comp_fails: dict[str, int],
        failed: dict[str, list[str | None]],
    ) -> None:
        """Warn once per call with rows lacking a reward or failed components; raise when a reward failed on
        every row of the call, or the window's failed fraction (rows, or one reward's rows) is over the limit."""
        B = len(errors)
        bad = [(i, e) for i, e in enumerate(errors) if e is not None]
        partial = [
            (i, f"{n}: {failed[n][i]}")
            for n in failed
            for i in range(B)
            if failed[n][i] is not None and errors[i] is None
        ]
        if (bad or partial) and self.warn_rows:
            first = (bad + partial)[: self.warn_rows]
            shown = "; ".join(f"row {i}: {_cut(e, self.max_error_chars)}" for i, e in first)
            head = f"{len(bad)}/{B} rows have no reward (masked out of training)" if bad else ""
            if partial:
                head += ("; " if head else "") + (
                    f"{len(partial)} reward calls failed on rows that other rewards "
                    "scored (left out of their weighted sum)"
                )
            culprit = next((n for n in failed if any(f is not None for f in failed[n])), None)
            warn_at_reward(
                f"RewardPool: {head}; first {min(len(bad) + len(partial), self.warn_rows)}: {shown}",
                self.rewards.get(culprit) if culprit is not None else None,
                RewardErrorWarning,
                __name__,
            )
        texts = Counter(e for i, e in bad if e and not _unscored(e))
        texts.update(_cut(t, self.max_error_chars) for _, t in partial)
        self._recent.append((failed_rows, B, texts, Counter(comp_fails)))
        if self.max_invalid_frac is None or not B:
            return
        every = [n for n, c in comp_fails.items() if c == B]
        if failed_rows == B and not every:  # every row failed, on different rewards
            err, times = texts.most_common(1)[0]
            raise RewardFailureError(
                f"RewardPool: none of the {B} rows of this scoring call has a reward. Most frequent error ({times}x): "
                f"{err}. Fix the reward function (or the data it reads); set max_invalid_frac to null to train on "
                "whatever rows do get a reward."
            )
        if every:  # a reward that failed on every row of a call is broken, whatever the others scored
            n = every[0]
            err, times = Counter(_cut(f"{n}: {f}", self.max_error_chars) for f in failed[n]).most_common(1)[0]
            rows = "none of the" if failed_rows == B else f"reward {n!r} failed on all"
            has = " has a reward" if failed_rows == B else ""
            raise RewardFailureError(
                f"RewardPool: {rows} {B} rows of this scoring call{has}. Most frequent error ({times}x): {err}. "
                "Fix the reward function (or the data it reads); set max_invalid_frac to null to train on "
                "whatever rows do get a reward."
            )
        if len(self._recent) < self.window:
            return
        n_rows = sum(n for _, n, _, _ in self._recent)
        n_bad = sum(b for b, _, _, _ in self._recent)
        per_comp = sum((c for _, _, _, c in self._recent), Counter())
        worst, n_worst = per_comp.most_common(1)[0] if per_comp else ("", 0)
        if n_rows and max(n_bad, n_worst) / n_rows > self.max_invalid_frac:
            counts = sum((c for _, _, c, _ in self._recent), Counter())
            err, times = counts.most_common(1)[0]
            what = (
                f"{n_bad}/{n_rows} rows ({n_bad / n_rows:.0%})"
                if n_bad >= n_worst
                else f"reward {worst!r} failed on {n_worst}/{n_rows} rows ({n_worst / n_rows:.0%})"
            )
            raise RewardFailureError(
                f"RewardPool: {what} of the last {len(self._recent)} scoring calls had no reward "
                f"(max_invalid_frac={self.max_invalid_frac}). Most frequent error ({times}x): "
                f"{err}. Fix the reward function (or the data it reads), or raise max_invalid_frac / set it to "
                "null to train on the valid rows only."
            )

    def _start_async(self, fns: list[TRLRewardAdapter], args: tuple) -> tuple:
        """Run the async rewards' ``acall`` in one event loop in its own thread (a loop may already run in the
        caller's thread), each under ``asyncio.wait_for(timeout_s)``; ``_join_async`` collects them."""
        out: list[Any] = [None] * len(fns)

        async def one(i: int, fn: TRLRewardAdapter) -> None:
            t0 = time.monotonic()
            try:
                out[i] = (
                    True,
                    await asyncio.wait_for(fn.acall(*args), self.timeout_s),
                    time.monotonic() - t0,
                )
            except TimeoutError:  # asyncio's is the builtin since 3.11
                out[i] = (False, f"timed out after {self.timeout_s}s", time.monotonic() - t0)
            except BaseException as e:  # noqa: BLE001 - any failure of user code is an infra error
                out[i] = (False, f"{type(e).__name__}: {e}", time.monotonic() - t0)

        async def gather() -> None:
            await asyncio.gather(*(one(i, f) for i, f in enumerate(fns)))

        thread = threading.Thread(
            target=asyncio.run, args=(gather(),), daemon=True, name="lit_rl-reward-async"
        )
        thread.start()
        return thread, out, time.monotonic()

    def _join_async(self, thread: threading.Thread, out: list, t0: float) -> list[tuple[bool, Any, float]]:
        # a coroutine that blocks its loop (time.sleep in an async def) cannot be cancelled: abandon the thread
        thread.join(max(0.0, self.timeout_s + 1.0 - (time.monotonic() - t0)))
        late = (False, f"timed out after {self.timeout_s}s", self.timeout_s)
        return [o if o is not None else late for o in out]

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


def _unscored(error: str) -> bool:
    """Error texts of rows no weighted reward scored although none failed (not failures)."""
    return error.startswith(("no reward applies", "only rewards with weight 0"))


def _cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())  # one line: tracebacks and multi-line messages stay readable in tables
    return text if len(text) <= n else text[: n - 3] + "..."


def _name_of(fn: Callable) -> str:
    name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return str(name)
