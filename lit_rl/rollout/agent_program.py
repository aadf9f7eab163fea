"""Any agent program as a rollout: ``agent(base_url, prompt) -> reward`` through the OpenAI-compatible endpoint.

``ProgramLoop`` is an ``AgentLoop`` whose episodes are a user's function instead of an ``Environment``: for each
(prompt, sample) it opens an episode on an ``OpenAIServer`` (``openai_server.py``) served from the loop's engine,
runs ``program(base_url, prompt)`` in its own thread (all episodes of a batch at once, their requests batched
into the engine's calls), and builds the ``Episode`` from the recorded calls, never from the agent's text:

- ``assemble``: call k+1 *continues* call j when its prompt ids begin with call j's prompt + completion ids
  (the endpoint builds such prompts when the agent sends its history back as it was answered). The calls form
  chains of continuations; the episode's row is the chain of its **last** call: its first prompt, then each
  call's sampled ids (the actions, with the engine's log-probs) and the ids between them (what the next prompt
  added: the end of turn, the tool results, the next generation prompt) as observation tokens. It is
  token-exact by construction: the row is the last call's prompt + completion.
- A **prefix break** (the agent rewrote, trimmed or edited its history, so a call continues no chain) starts a
  new chain. Only the last chain trains (its reward is the episode's); the calls of the other chains are not
  trained and counted (``agent/prefix_breaks``: chains - 1; ``agent/untrained_calls``). One row per episode
  keeps the G rows per group the advantage estimators take (separate rows per chain would give groups of
  varying size and count one episode's reward several times in its group's baseline).
- The program's return value is the reward, on the last action token. The row is masked (reward NaN,
  ``Experience.valid`` False: no loss on any of its tokens) and counted when the program raised
  (``agent/program_errors``), did not return by ``deadline_s`` (``agent/episodes_timed_out``: its thread is left
  behind, a daemon, and its episode closed, so a call it makes later is refused and never reaches the engine),
  returned no finite number (``agent/bad_rewards``) or never called the model (``agent/no_calls``: no sampled
  token to train); ``reward_errors`` (the inspector) says which, with the exception's text.

Weights pushed during a batch (``AgentLoop.sync_weights``) load in the endpoint's engine thread between two
generate calls, never during one; each call records the ``policy_version`` that sampled it, which becomes its
tokens' versions (``Turn.action_versions`` -> ``extras["token_versions"]``).

A reward of at least 1 is a success (``rollout/success_frac``, ``AgentEval``'s ``eval/accuracy``); each action's
``<tool_call>`` blocks count in ``tools/calls_per_episode`` / ``tools/valid_call_rate`` (the agent runs the
tools itself; a block that does not parse is ``malformed``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards, Episode, Turn
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.openai_server import Call, EpisodeRecord, OpenAIServer
from lit_rl.rollout.sampling import SamplingConfig
from lit_rl.rollout.tool_env import task_messages
from lit_rl.rollout.tools import parse_tool_calls

# Episode.status of a failed program -> its metric (a timeout is the agent loop's "timed_out":
# agent/episodes_timed_out, counted by EnvRewards)
FAILURES = {
    "program_error": "agent/program_errors",
    "bad_reward": "agent/bad_rewards",
    "no_calls": "agent/no_calls",
}


@dataclass
class ProgramEpisode(Episode):
    """An ``Episode`` from recorded calls: ``calls`` made, ``prefix_breaks`` (chains - 1), ``untrained_calls``
    (outside the trained chain), ``refused`` requests by error code. A failed program's episode has ``error``
    (why: it is masked) and ``status`` ``"timed_out"`` or a ``FAILURES`` key."""

    calls: int = 0
    prefix_breaks: int = 0
    untrained_calls: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def chains(calls: list[Call]) -> list[list[Call]]:
    """The calls as chains of continuations (module doc), each call appended to the first chain whose last call's
    prompt + completion ids begin its prompt, else starting a new chain."""
    out: list[list[Call]] = []
    for c in calls:
        for ch in out:
            full = ch[-1].prompt_ids + ch[-1].completion_ids
            if c.prompt_ids[: len(full)] == full:
                ch.append(c)
                break
        else:
            out.append([c])
    return out


def assemble(calls: list[Call], reward: float, tokenizer=None) -> ProgramEpisode:
    """The episode of recorded ``calls`` (in completion order) with the program's ``reward`` on its last action
    (module doc). Without calls: no turns and no prompt ids."""
    if not calls:
        return ProgramEpisode([], done=True, status="done")
    chs = chains(calls)
    chain = next(ch for ch in chs if ch[-1] is calls[-1])
    turns = []
    for k, c in enumerate(chain):
        obs: list[int] = []
        if k + 1 < len(chain):
            obs = chain[k + 1].prompt_ids[len(c.prompt_ids) + len(c.completion_ids) :]
        blocks = parse_tool_calls(c.text)
        info = {
            "tool_calls": float(len(blocks)),
            "tool_errors/malformed": float(sum(b.error is not None for b in blocks)),
        }
        obs_text = tokenizer.decode(obs, skip_special_tokens=False) if tokenizer is not None and obs else ""
        versions = None if c.policy_version is None else [c.policy_version] * len(c.completion_ids)
        turns.append(
            Turn(
                list(c.completion_ids),
                list(c.logprobs),
                c.text,
                obs,
                obs_text,
                0.0,
                info,
                action_versions=versions,
            )
        )
    turns[-1].reward = float(reward)
    turns[-1].info["success"] = float(reward >= 1.0)
    return ProgramEpisode(
        list(chain[0].prompt_ids),
        turns,
        done=True,
        status="done",
        calls=len(calls),
        prefix_breaks=len(chs) - 1,
        untrained_calls=len(calls) - len(chain),
    )


def resolve_program(program: Callable[..., Any] | str) -> Callable[..., Any]:
    """``program`` itself, or the function a string names (configs): ``"path/to/agent.py:function"`` (a file,
    relative to the working directory) or ``"package.module.function"``."""
    if callable(program):
        return program
    if isinstance(program, str) and ":" in program:
        path, _, name = program.rpartition(":")
        if not Path(path).is_file():
            raise ValueError(f"program={program!r}: no file {path!r} (from {Path.cwd()})")
        spec = importlib.util.spec_from_file_location(f"lit_rl_program_{Path(path).stem}", path)
        if spec is None or spec.loader is None:  # not a file Python can import as a module
            raise ValueError(f"program={program!r}: {path!r} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, name, None)
        if callable(fn):
            return fn
        raise ValueError(f"program={program!r}: {path} has no function {name!r}")
    if isinstance(program, str) and "." in program:
        mod, _, name = program.rpartition(".")
        fn = getattr(importlib.import_module(mod), name, None)
        if callable(fn):
            return fn
        raise ValueError(f"program={program!r}: module {mod!r} has no function {name!r}")
    raise TypeError(
        f"program must be a function agent(base_url, prompt) -> reward or its 'module.function' path, got {program!r}"
    )


class _Slot:
    """One episode's thread and what its program came to."""

    def __init__(self, eid: str):
        self.eid, self.finished = eid, threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class ProgramLoop(AgentLoop):
    """Run a user's agent program per episode through an ``OpenAIServer`` (module doc).

    Args:
        program: ``program(base_url, prompt, **program_args) -> reward`` (a function, or a string naming one:
            ``"path/to/agent.py:function"`` or ``"module.function"``); it talks to ``base_url`` with the
            ``openai`` client (any ``api_key``, any ``model`` name).
        engine: the rollout engine the endpoint generates with (default ``HFEngine``).
        program_args: keyword arguments passed to every call of ``program`` (a config's knobs for it).
        deadline_s: seconds an episode may take from the batch's start; past it the episode is a timeout.
        max_calls: chat completions per episode at most (the horizon's turns: ``max_calls x max_new_tokens``).
        max_obs_tokens, max_context_tokens: as ``AgentLoop`` (per new message; prompt + completion per call).
    """

    def __init__(
        self,
        program: str | Callable[..., Any],
        engine: EngineBase | None = None,
        program_args: dict[str, Any] | None = None,
        deadline_s: float = 300.0,
        max_calls: int = 8,
        max_obs_tokens: int = 1024,
        max_context_tokens: int = 4096,
    ):
        if not deadline_s > 0:
            raise ValueError(f"ProgramLoop: deadline_s must be > 0, got {deadline_s}")
        super().__init__(_no_environment, engine, max_calls, max_obs_tokens, max_context_tokens)
        self.program, self.deadline_s, self.max_calls = resolve_program(program), float(deadline_s), max_calls
        self.program_args = dict(program_args or {})
        self.server: OpenAIServer | None = None
        self._batches = 0

    def start(self) -> OpenAIServer:
        """The endpoint (started on first use; ``close`` stops it)."""
        if self.server is None:
            if self.engine.tokenizer is None:
                raise RuntimeError("ProgramLoop: the engine has no tokenizer; bind it to a module first")
            self.server = OpenAIServer(
                self.engine,
                max_context_tokens=self.max_context_tokens,
                max_obs_tokens=self.max_obs_tokens,
                max_calls=self.max_calls,
                before_generate=self.apply_pending_weights,
            )
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def run(self, prompts: list[Any], n: int, sampling: SamplingConfig) -> list[list[Episode]]:
        """``n`` episodes per prompt, each ``program(base_url, prompt)`` in its own thread; episode j of prompt i
        is ``result[i][j]``. Returns once every program returned, or at the deadline."""
        server = self.start()
        server.sampling = sampling
        with (
            self.running()
        ):  # weights pushed meanwhile (sync_weights) load between the endpoint's generate calls
            return self._run(server, prompts, n, sampling)

    def _run(
        self, server: OpenAIServer, prompts: list[Any], n: int, sampling: SamplingConfig
    ) -> list[list[Episode]]:
        self._batches += 1
        slots = []
        for i, p in enumerate(prompts):
            for j in range(n):
                slot = _Slot(f"b{self._batches}-p{i}-s{j}")
                url = server.open_episode(slot.eid)
                t = threading.Thread(
                    target=self._episode, args=(slot, url, p), daemon=True, name=f"agent-{slot.eid}"
                )
                slots.append(slot)
                t.start()
        end = time.monotonic() + self.deadline_s
        for s in slots:
            s.finished.wait(timeout=max(0.0, end - time.monotonic()))
        records = server.close_episodes([s.eid for s in slots])
        eps = [
            self._episode_of(s, rec, p)
            for s, rec, p in zip(slots, records, [p for p in prompts for _ in range(n)])
        ]
        return [list(eps[i * n : (i + 1) * n]) for i in range(len(prompts))]

    def _episode(self, slot: _Slot, url: str, prompt: Any) -> None:
        try:
            slot.result = self.program(url, prompt, **self.program_args)
        except BaseException as e:  # noqa: BLE001 - whatever the program raises (SystemExit too) is its failure
            slot.error = e
        finally:
            slot.finished.set()

    def _episode_of(self, slot: _Slot, rec: EpisodeRecord, prompt: Any) -> ProgramEpisode:
        tok = self.engine.tokenizer
        status, error, reward = "done", None, 0.0
        if not slot.finished.is_set():
            status, error = (
                "timed_out",
                f"the agent program did not return within deadline_s={self.deadline_s:g}",
            )
        elif slot.error is not None:
            status, error = (
                "program_error",
                f"the agent program raised {type(slot.error).__name__}: {slot.error}",
            )
        elif not (isinstance(slot.result, (int, float)) and math.isfinite(float(slot.result))):
            status, error = "bad_reward", f"the agent program returned {slot.result!r}, not a finite number"
        elif not rec.calls:
            status, error = "no_calls", "the agent program returned without calling the model"
        else:
            reward = float(slot.result)
        ep = assemble(rec.calls, reward, tok)
        if not ep.prompt_ids:  # no call: the task's messages as the row's prompt (the row is masked)
            ep.prompt_ids = list(self.prompt_ids(tok, task_messages(prompt)))
        ep.status, ep.error, ep.refused = status, error, dict(rec.refused)
        return ep


def _no_environment() -> Any:
    raise RuntimeError("ProgramLoop runs agent programs, not environments")


class ProgramRewards(EnvRewards):
    """Score stage of the program path: ``EnvRewards`` (returns, masks, each failed episode's reason in ``errors``,
    episode metrics, ``agent/episodes_timed_out``) and the program metrics: the ``FAILURES`` counts,
    ``agent/prefix_breaks`` and ``agent/untrained_calls`` (sums), ``agent/calls_per_episode`` (mean) and
    ``agent/refused/<code>`` (requests the endpoint refused: ``context_length_exceeded``, ``max_calls``)."""

    def __call__(self, prompts: list[Any], groups: list[list[Episode]]) -> RewardBatch:
        rb = super().__call__(prompts, groups)
        rows = [e for g in groups for e in g]
        eps = [e for e in rows if isinstance(e, ProgramEpisode)]
        m = {name: float(sum(e.status == status for e in eps)) for status, name in FAILURES.items()}
        m["agent/prefix_breaks"] = float(sum(e.prefix_breaks for e in eps))
        m["agent/untrained_calls"] = float(sum(e.untrained_calls for e in eps))
        m["agent/calls_per_episode"] = sum(e.calls for e in eps) / max(len(eps), 1)
        for code in sorted({c for e in eps for c in e.refused}):
            m[f"agent/refused/{code}"] = float(sum(e.refused.get(code, 0) for e in eps))
        rb.metrics.update(m)
        return rb
