"""The schedulers of ``AgentLoop.run``: lock-step and asynchronous episodes, weight syncs between generate calls,
per-episode deadlines and budgets.

``lockstep`` (the original loop, kept for comparison): each turn generates for every active episode in one
call, then steps each environment in turn; one slow tool stalls every episode and the engine.

``async`` (continuous batching across episodes): every environment step runs in its own daemon thread (an
``async def step`` is awaited there on a private event loop) while the calling thread, the engine thread,
generates. Whenever the engine is free it drains the episodes whose observation is back (up to
``max_batch``) and generates their next turns as one batch, so an episode's turn is submitted the moment its
observation returns and no episode waits for another. An episode's row is built from exactly the same ids
either way (its context grows by the sampled ids and its observation's ids), so with greedy decoding the two
modes give the same rows (``tests/agent/test_agent_async.py``).

Straggler policy (the batch contract of ``run``: ``n`` episodes per prompt, every group whole). The batch is
complete when every episode has ended, or earlier when ``min_finished`` (a fraction, default 1.0) of them ended
on their own: the rest are cut where they stand, kept whole (every sampled token with its version and
log-prob) and masked from the loss (``Episode.status == "cut"``, counted in ``agent/episodes_cut``). An episode
still running at its deadline ``episode_timeout_s`` (wall seconds from its reset) is cut the same way and
counted in ``agent/episodes_timed_out``: a hung tool never hangs the run (its thread is abandoned: a daemon,
its late result ignored). Carrying stragglers into the next batch (verl/AReaL's partial rollouts) needs groups
that complete across calls: ``AgentLoop.stream`` runs episodes that way (refilled as groups finish, the
scheduler's other entry point); ``run`` keeps the whole-batch contract the pipeline relies on.

Faults, each counted and masked (``Episode.infra_error``), never a lost token: an environment that raises in
``reset`` or ``step`` (``agent/env_errors``; the turn's sampled tokens stay in the row, with no observation), an
episode whose completion (actions + observations) passes ``max_episode_tokens`` (``agent/episodes_over_budget``;
every token kept), a timeout or a cut as above.

Policy versions. Weights pushed with ``AgentLoop.sync_weights`` (any thread) are loaded by the engine thread
between two generate calls, never during one; each turn records the engine's ``policy_version`` at its
generate call (or the version the engine reported on the ``Completion``), so every sampled token carries the
version and the log-prob of the weights that sampled it (``Turn.action_versions``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.env import env_tool_schemas
from lit_rl.rollout.episode import Episode, Turn, as_text

if TYPE_CHECKING:
    from lit_rl.rollout.engine import SamplingConfig


class EpisodeLoop(Protocol):
    """What the schedulers read of their ``AgentLoop`` (declared here so this module never imports it)."""

    engine: EngineBase
    env_factory: Callable[[], Any]
    concurrency: str
    max_turns: int
    max_context_tokens: int
    max_episode_tokens: int | None
    episode_timeout_s: float | None
    min_finished: float
    max_batch: int | None

    def prompt_ids(
        self, tok: Any, opening: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def observation_ids(
        self,
        tok: Any,
        observation: str | list[dict[str, Any]],
        action_ids: list[int] | tuple[int, ...] = (),
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]: ...

    def apply_pending_weights(self) -> None: ...

    def running(self) -> AbstractContextManager[None]: ...


CONCURRENCY = ("lockstep", "async")
_NO_DEADLINE = math.inf


@dataclass
class RunStats:
    """Wall seconds of the last ``run``/``stream`` and the part of them the engine spent generating
    (``engine_idle_frac = 1 - generate_s / wall_s``), generate calls and the sequences they carried."""

    wall_s: float = 0.0
    generate_s: float = 0.0
    calls: int = 0
    sequences: int = 0

    @property
    def engine_idle_frac(self) -> float:
        return 1.0 - self.generate_s / self.wall_s if self.wall_s > 0 else 0.0


def call_step(env: Any, text: str, out: queue.Queue, key: Any) -> None:
    """Run ``env.step(text)`` in a daemon thread and put ``(key, result, error)`` on ``out``. A daemon: a step
    that never returns (a hung tool) is abandoned at its episode's deadline and cannot block the interpreter's
    exit; an ``async def step`` is awaited on the thread's own event loop."""

    def work() -> None:
        try:
            r = env.step(text)
            if inspect.isawaitable(r):
                r = asyncio.run(_awaited(r))
            out.put((key, r, None))
        except BaseException as e:  # noqa: BLE001 - an environment's failure is the episode's, reported
            out.put((key, None, e))

    threading.Thread(target=work, name="lit_rl-env-step", daemon=True).start()


async def _awaited(x: Any) -> Any:
    return await x


@dataclass
class _Live:
    """One running episode: its environment, tools, context (the engine's next input) and deadline."""

    index: int
    env: Any
    episode: Episode
    tools: list[dict[str, Any]]
    context: list[int]
    deadline: float
    turn: int = 0  # the step key: a result of an abandoned step carries an older one and is ignored
    pending: Any = None  # the action waiting for its observation: (Completion, text, versions)
    ended: bool = field(default=False)


class Scheduler:
    """Runs episodes for one ``AgentLoop`` (module doc). ``start`` opens episodes, ``drive`` advances them."""

    def __init__(self, loop: EpisodeLoop, sampling: SamplingConfig, stats: RunStats):
        self.loop, self.sp, self.stats = loop, sampling, stats
        self.tok = loop.engine.tokenizer
        self.live: dict[int, _Live] = {}
        self.ready: deque[int] = deque()  # episodes whose next action can be generated
        self.results: queue.Queue = queue.Queue()
        self.finished = 0  # episodes that ended on their own (done, max_turns, max context, a fault)
        self.cut = 0

    # ---------------------------------------------------------------- episodes
    def start(self, index: int, prompt: Any, episode_cls: Callable[..., Episode]) -> Episode:
        """Reset a fresh environment for ``prompt`` and open its episode (ready for its first action)."""
        loop, t0 = self.loop, time.perf_counter()
        env = loop.env_factory()
        try:
            opening = env.reset(prompt)
            tools = env_tool_schemas(env)
            ep = episode_cls(list(loop.prompt_ids(self.tok, opening, tools)))
        except Exception as e:  # noqa: BLE001 - counted and masked; a placeholder prompt keeps the row real
            ep = episode_cls(list(loop.prompt_ids(self.tok, "")))
            ep.status, ep.error = "env_error", f"reset raised {type(e).__name__}: {e}"
            self.finished += 1
            return ep
        timeout = loop.episode_timeout_s
        deadline = t0 + timeout if timeout is not None else _NO_DEADLINE
        self.live[index] = _Live(index, env, ep, tools, list(ep.prompt_ids), deadline)
        self.ready.append(index)
        return ep

    def _end(self, lv: _Live, status: str, error: str | None = None) -> None:
        lv.ended = True
        lv.episode.status = status
        if error is not None:
            lv.episode.error = error
        self.live.pop(lv.index, None)
        if status == "cut":
            self.cut += 1
        else:
            self.finished += 1

    def _close_action(self, lv: _Live, status: str, error: str) -> None:
        """End an episode whose last action has no observation (timed out, cut, or its step raised): the
        action's tokens stay in the row with their versions and log-probs (never lost), no observation."""
        if lv.pending is not None:
            c, text, versions = lv.pending
            lv.episode.turns.append(_turn(c, text, versions, [], "", 0.0, {}))
            lv.pending = None
        self._end(lv, status, error)

    # ---------------------------------------------------------------- generation
    def generate(self, indices: list[int]) -> list[int]:
        """One generate call for ``indices`` (the engine thread), after loading pushed weights. Returns the
        episodes whose action now waits for its environment (one past its deadline is cut here instead)."""
        loop = self.loop
        loop.apply_pending_weights()
        version = loop.engine.policy_version
        t0 = time.perf_counter()
        comps = loop.engine.generate([self.live[i].context for i in indices], 1, self.sp)
        self.stats.generate_s += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.sequences += len(indices)
        now, waiting = time.perf_counter(), []
        for i, (c,) in zip(indices, comps):
            lv = self.live[i]
            v = c.policy_version if c.policy_version is not None else version
            text = self.tok.decode(c.token_ids, skip_special_tokens=True)
            lv.pending, lv.turn = (c, text, [v] * len(c.token_ids)), lv.turn + 1
            if now >= lv.deadline:
                self._close_action(lv, "timed_out", _timeout_reason(loop.episode_timeout_s))
            else:
                waiting.append(i)
        return waiting

    def step(self, i: int) -> None:
        """Hand episode ``i``'s pending action to its environment (a daemon thread)."""
        lv = self.live[i]
        call_step(lv.env, lv.pending[1], self.results, (i, lv.turn))

    def observe(self, key: Any, result: Any, error: BaseException | None) -> None:
        """An environment step came back: append the turn, then end the episode or queue its next action."""
        i, turn = key
        lv = self.live.get(i)
        if lv is None or lv.turn != turn or lv.pending is None:
            return  # an abandoned step (its episode timed out or was cut): its late result is ignored
        loop, ep = self.loop, lv.episode
        c, text, versions = lv.pending
        try:
            if error is not None:
                raise error
            obs, reward, done, info = result
            obs_ids = loop.observation_ids(self.tok, obs, c.token_ids, lv.tools)

            turn_ = _turn(c, text, versions, obs_ids, as_text(obs), float(reward), dict(info or {}))
        except Exception as e:  # noqa: BLE001 - the environment's fault: counted and masked, tokens kept
            self._close_action(lv, "env_error", f"step raised {type(e).__name__}: {e}")
            return
        lv.pending = None
        ep.turns.append(turn_)
        lv.context += list(c.token_ids) + obs_ids
        ep.done = bool(done)
        budget = loop.max_episode_tokens
        if budget is not None and len(lv.context) - len(ep.prompt_ids) > budget:
            self._end(lv, "over_budget", f"episode over its token budget ({budget} completion tokens)")
        elif ep.done:
            self._end(lv, "done")
        elif len(ep.turns) >= loop.max_turns:
            self._end(lv, "max_turns")
        elif len(lv.context) >= loop.max_context_tokens:
            self._end(lv, "max_context")
        else:
            self.ready.append(i)

    # ---------------------------------------------------------------- the two schedules
    def expire(self) -> None:
        """Cut the episodes past their deadline (their pending step abandoned)."""
        now = time.perf_counter()
        for lv in [lv for lv in self.live.values() if now >= lv.deadline]:
            if lv.index in self.ready:
                self.ready.remove(lv.index)
            self._close_action(lv, "timed_out", _timeout_reason(self.loop.episode_timeout_s))

    def cut_stragglers(self, total: int) -> None:
        """``min_finished`` of ``total`` episodes ended on their own: cut the rest (module doc)."""
        if self.live and self.finished >= math.ceil(self.loop.min_finished * total - 1e-9):
            for lv in list(self.live.values()):
                self._close_action(lv, "cut", "cut: the batch completed without it (min_finished)")
            self.ready.clear()

    def wait(self) -> None:
        """Block for the next environment result (or the nearest deadline) and handle everything back."""
        nearest = min((lv.deadline for lv in self.live.values()), default=_NO_DEADLINE)
        timeout = None if nearest == _NO_DEADLINE else max(0.0, nearest - time.perf_counter())
        try:
            self.observe(*self.results.get(timeout=timeout))
        except queue.Empty:
            pass
        self.drain()

    def drain(self) -> None:
        while True:
            try:
                item = self.results.get_nowait()
            except queue.Empty:
                return
            self.observe(*item)

    def drive_async(self, total: int, refill: Callable[[], None] | None = None) -> None:
        """Until no episode is live: generate for every ready episode (``max_batch`` at a time) while the
        others' environments run; with nothing ready, wait for the next observation or deadline."""
        cap = self.loop.max_batch
        while self.live:
            self.drain()
            self.expire()
            self.cut_stragglers(total)
            if refill is not None:
                refill()
            if self.ready:
                take = len(self.ready) if cap is None else min(cap, len(self.ready))
                for i in self.generate([self.ready.popleft() for _ in range(take)]):
                    self.step(i)
            elif self.live:
                self.wait()

    def drive_lockstep(self, total: int) -> None:
        """The original schedule: one generate for all active episodes, then each environment in turn."""
        while self.live:
            batch = list(self.ready)
            self.ready.clear()
            for i in self.generate(batch):  # one at a time, waiting for each (its deadline still applies)
                lv = self.live.get(i)
                if lv is None:  # cut meanwhile (its deadline passed while another episode's step ran)
                    continue
                self.step(i)
                while not lv.ended and lv.pending is not None:
                    nearest = lv.deadline
                    timeout = None if nearest == _NO_DEADLINE else max(0.0, nearest - time.perf_counter())
                    try:
                        key, result, error = self.results.get(timeout=timeout)
                    except queue.Empty:
                        self.expire()
                        continue
                    self.observe(key, result, error)
            self.cut_stragglers(total)


def _turn(c, text: str, versions: list[int], obs_ids, obs_text: str, reward: float, info: dict):

    return Turn(
        list(c.token_ids), list(c.logprobs), text, obs_ids, obs_text, reward, info, action_versions=versions
    )


def _timeout_reason(timeout_s: float | None) -> str:
    return f"episode timed out (episode_timeout_s={timeout_s})"


_FAULTS = {
    "agent/episodes_timed_out": "timed_out",
    "agent/env_errors": "env_error",
    "agent/episodes_over_budget": "over_budget",
    "agent/episodes_cut": "cut",
}


def fault_metrics(rows: list[Episode]) -> dict[str, float]:
    """Episodes of the batch that ended on each fault (``Episode.status``; all masked from the loss; ``EnvRewards``)."""
    return {k: float(sum(e.status == v for e in rows)) for k, v in _FAULTS.items()}


def run_episodes(
    loop: EpisodeLoop, prompts: list[Any], n: int, sampling: SamplingConfig, stats: RunStats
) -> list[list[Episode]]:
    """``n`` episodes per prompt under ``loop.concurrency``; ``result[i][j]`` is episode j of prompt i."""
    sched = Scheduler(loop, sampling, stats)
    t0 = time.perf_counter()
    eps = [sched.start(i * n + j, p, Episode) for i, p in enumerate(prompts) for j in range(n)]
    with loop.running():
        if loop.concurrency == "async":
            sched.drive_async(len(eps))
        else:
            sched.drive_lockstep(len(eps))
    stats.wall_s += time.perf_counter() - t0
    return [eps[i * n : (i + 1) * n] for i in range(len(prompts))]


def stream_episodes(
    loop: EpisodeLoop,
    prompts: Iterable[Any],
    n: int,
    sampling: SamplingConfig,
    max_groups_in_flight: int,
    stats: RunStats,
) -> Iterator[tuple[Any, list[Episode]]]:
    """Groups of ``n`` episodes, each yielded (with its prompt) as soon as its last episode ends, while up to
    ``max_groups_in_flight`` groups run: a finished group's slot is refilled at once, so the engine keeps
    generating for other groups while stragglers' tools run (``AgentLoop.stream``)."""
    if max_groups_in_flight < 1:
        raise ValueError(f"max_groups_in_flight must be >= 1, got {max_groups_in_flight}")
    sched = Scheduler(loop, sampling, stats)
    it = iter(prompts)
    groups: dict[int, tuple[Any, list[Episode]]] = {}
    done: deque[tuple[Any, list[Episode]]] = deque()
    counter = [0]

    def refill() -> None:
        for g in [g for g, (_, eps) in groups.items() if all(e.status for e in eps)]:
            done.append(groups.pop(g))
        while len(groups) < max_groups_in_flight:
            try:
                p = next(it)
            except StopIteration:
                return
            g = counter[0]
            counter[0] += 1
            groups[g] = (p, [sched.start(g * n + j, p, Episode) for j in range(n)])

    t0 = time.perf_counter()
    with loop.running():
        refill()
        while groups or done:
            while done:
                yield done.popleft()
            if not sched.live:
                refill()
                if not sched.live and not done:
                    break
                continue
            # one scheduling round: generate for the ready ones or wait for an observation
            sched.drain()
            sched.expire()
            refill()
            if sched.ready:
                cap = loop.max_batch
                take = len(sched.ready) if cap is None else min(cap, len(sched.ready))
                for i in sched.generate([sched.ready.popleft() for _ in range(take)]):
                    sched.step(i)
            elif sched.live:
                sched.wait()
            refill()
    stats.wall_s += time.perf_counter() - t0
