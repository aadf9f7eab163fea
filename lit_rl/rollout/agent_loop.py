"""Multi-turn agents: ``AgentLoop`` runs episodes against an ``Environment`` and builds ``Experience`` rows.

One row per episode. After the (left-padded) prompt -- the rendered first observation -- the completion
interleaves the policy's actions with the environment's observations::

    [prompt: task]  a_1 a_1 a_1 | o_1 o_1 | a_2 a_2 | o_2 o_2 o_2 | ... | a_K | o_K
    loss_mask        T   T   T    F   F     T   T     F   F   F           T     F
    obs_mask         F   F   F    T   T     F   F     T   T   T           F     T

``loss_mask`` is True only on tokens the policy generated, so no observation token carries policy loss
(the usual choice: "loss on actions only"). ``extras["obs_mask"]`` marks observation tokens for the
optional world-model term ``ObservationLoss`` (predict the environment's response; off unless added with a
non-zero coefficient). Turn rewards r_k go on the last token of action k: ``token_rewards`` holds
r_1..r_{K-1} and ``rewards`` holds the reward that lands on the row's last action token (r_K), so that the
core estimators see the episode return ``rewards + sum(token_rewards)`` (grpo, rloo, ...) or a per-turn
reward-to-go (``reinforce``, ``gae``: gamma applies per action token, observation tokens are skipped).

Token-exact: each turn appends the engine's sampled ids, then only the observation's new ids (``chat.ChatRenderer``:
the rest of the end of turn, the observation messages, the generation prompt) to the episode's context, which is
the engine's next input as is; the row trains on exactly those ids, never on a re-rendered or re-tokenised history
(``tests/agent/test_token_exact.py``). Tool calls and their results: ``tool_env.ToolEnv``.

The loop plugs into the rollout pipeline (``rollout/pipeline.py``) as three stages: ``AgentGenerator`` (episodes
instead of completions), ``EnvRewards`` (the environment's returns instead of a reward pool) and the one
``ExperienceBuilder`` with the episode layout (``AgentLoop.episode_rows``, ``AgentLoop.experience_builder``);
``callbacks.agent_rollout.AgentRolloutCallback`` wires them to Lightning. Scheduling (lock step or asynchronous
episodes), weight syncs inside an episode, deadlines and budgets: ``agent_async.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from lit_rl.data.experience import Experience
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.agent_async import CONCURRENCY, RunStats, fault_metrics, run_episodes, stream_episodes
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.build import ExperienceBuilder, Rows
from lit_rl.rollout.chat import ChatRenderer
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.env import Environment
from lit_rl.rollout.episode import Episode
from lit_rl.rollout.episode import Turn as Turn  # re-exported: Episode and Turn lived here first
from lit_rl.rollout.episode import as_messages as _as_messages
from lit_rl.rollout.episode import as_text as _as_text
from lit_rl.rollout.pipeline import RolloutPipeline
from lit_rl.rollout.render import PromptRenderer, engine_context_len
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.settings import FilterSettings, RolloutSettings
from lit_rl.rollout.tools import ERROR_KINDS


class AgentLoop:
    """Run multi-turn episodes with a rollout engine and turn them into ``Experience`` rows.

    Args:
        env_factory: builds a fresh ``Environment`` (one per episode; episodes of a batch run side by side).
        engine: the ``EngineBase`` that generates each action (default ``HFEngine``); its tokenizer is used.
        max_turns: actions per episode at most.
        max_obs_tokens: observations are cut to this many tokens (the tail is dropped).
        max_context_tokens: an episode stops once its context (prompt + turns) reaches this length.
        concurrency: ``"lockstep"`` (default: every turn generates for the whole batch, then steps each
            environment in turn) or ``"async"`` (continuous batching: environment steps run in threads while the
            engine generates the turns of the episodes that are ready; ``agent_async.py``). Same rows either way.
        episode_timeout_s: per-episode deadline in wall seconds from its reset (None = none): an episode still
            running is cut, masked and counted (``agent/episodes_timed_out``); a hung tool never hangs the run.
        max_episode_tokens: completion tokens (actions + observations) an episode may hold; one that passes it
            is ended, masked and counted (``agent/episodes_over_budget``), its tokens kept. None = no budget.
        min_finished: the batch is complete once this fraction of its episodes ended on their own; the rest are
            cut, masked and counted (``agent/episodes_cut``). 1.0 (default) waits for every episode.
        max_batch: most sequences per generate call in async mode (the engine's batch capacity); None = all
            the ready episodes.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        engine: EngineBase | None = None,
        max_turns: int = 4,
        max_obs_tokens: int = 256,
        max_context_tokens: int = 2048,
        concurrency: str = "lockstep",
        episode_timeout_s: float | None = None,
        max_episode_tokens: int | None = None,
        min_finished: float = 1.0,
        max_batch: int | None = None,
    ):
        if concurrency not in CONCURRENCY:
            raise ValueError(f"concurrency must be one of {CONCURRENCY}, got {concurrency!r}")
        if episode_timeout_s is not None and not episode_timeout_s > 0:
            raise ValueError(f"episode_timeout_s must be > 0 seconds or None, got {episode_timeout_s}")
        if max_episode_tokens is not None and max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or None, got {max_episode_tokens}")
        if not 0 < min_finished <= 1:
            raise ValueError(f"min_finished must be a fraction in (0, 1], got {min_finished}")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")
        if max_turns < 1 or max_obs_tokens < 1 or max_context_tokens < 2:
            raise ValueError(
                f"max_turns, max_obs_tokens must be >= 1 and max_context_tokens >= 2; got "
                f"{max_turns}, {max_obs_tokens}, {max_context_tokens}"
            )
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be callable (returning an Environment), got {type(env_factory).__name__}"
            )
        self.env_factory, self.engine = env_factory, engine if engine is not None else HFEngine()
        self.max_turns, self.max_obs_tokens, self.max_context_tokens = (
            max_turns,
            max_obs_tokens,
            max_context_tokens,
        )
        self.concurrency, self.episode_timeout_s, self.max_episode_tokens = (
            concurrency,
            episode_timeout_s,
            max_episode_tokens,
        )
        self.min_finished, self.max_batch = min_finished, max_batch
        self.last_stats = RunStats()  # wall and generate seconds of the last run (engine idle share)
        self._renderers: dict[tuple[int, str], ChatRenderer] = {}
        self._weights_lock = threading.Lock()
        self._pending_weights: list[tuple[str, torch.Tensor]] | None = None
        self._running = 0

    # ------------------------------------------------------------------ weight syncs inside episodes
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push new weights from any thread: loaded into the engine (``update_weights``) before its next generate
        call, never during one; at once when no run is in progress. Tokens sampled after the load carry the
        engine's new ``policy_version`` (``Turn.action_versions``)."""
        snap = [(n, t.detach().clone()) for n, t in named_tensors]
        with self._weights_lock:
            self._pending_weights = snap  # a newer push replaces one not loaded yet
            idle = not self._running
        if idle:
            self.apply_pending_weights()

    def apply_pending_weights(self) -> None:
        """Load the newest pushed weights, if any (the engine thread, between generate calls)."""
        with self._weights_lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is not None:
            self.engine.update_weights(pending)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A run in progress: pushed weights wait for the next generate call; loaded at its end otherwise."""
        with self._weights_lock:
            self._running += 1
        try:
            yield
        finally:
            with self._weights_lock:
                self._running -= 1
            self.apply_pending_weights()

    # ------------------------------------------------------------------ text <-> tokens
    def _chat(self, tok) -> bool:
        return getattr(tok, "chat_template", None) is not None

    def renderer(self, tok, tools: list[dict[str, Any]] | None = None) -> ChatRenderer:
        """The ``ChatRenderer`` for ``tok`` and a tool set (built once per tool set: it probes the template)."""
        key = (id(tok), json.dumps(tools or [], sort_keys=True, default=str))
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(tok, tools, self.max_obs_tokens)
        return self._renderers[key]

    def prompt_ids(self, tok, opening: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None):
        """The opening observation as the first prompt: a user turn (or the messages an environment returned)
        through the chat template with the generation prompt; without a template the raw text then
        ``Action:``."""
        if self._chat(tok):
            return self.renderer(tok, tools).prompt_ids(_as_messages(opening))
        return tok(_as_text(opening) + "\nAction: ", add_special_tokens=False)["input_ids"]

    def observation_ids(
        self,
        tok,
        observation: str | list[dict[str, Any]],
        action_ids: list[int] | tuple[int, ...] = (),
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The tokens that follow ``action_ids``: with a chat template the rest of the assistant's end of turn,
        the observation (a string is a user turn, a list holds messages, e.g. ``tool`` results) and the next
        generation prompt (``ChatRenderer.observation_ids``: only these new tokens, the history is never
        re-rendered); without one ``Observation: ... Action:``. Each observation is cut to ``max_obs_tokens``
        (the tail dropped); an empty message list is no tokens (an episode that ended on a final answer)."""
        if isinstance(observation, list) and not observation:
            return []
        if self._chat(tok):
            return self.renderer(tok, tools).observation_ids(list(action_ids), _as_messages(observation))
        text = _as_text(observation)
        body = tok(text, add_special_tokens=False)["input_ids"]
        if len(body) > self.max_obs_tokens:
            text = tok.decode(body[: self.max_obs_tokens]) + " [truncated]"
        return tok(f"\nObservation: {text}\nAction: ", add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------------ episodes
    def run(self, prompts: list[Any], n: int, sampling: SamplingConfig) -> list[list[Episode]]:
        """``n`` episodes per prompt; episode j of prompt i is ``result[i][j]``. Each turn appends the engine's
        sampled ids and then the observation's ids to the episode's context, which is the next input as is.
        Scheduling (``concurrency``), deadlines, budgets and the straggler policy: ``agent_async.py``;
        ``last_stats`` holds the run's wall and generate seconds."""
        if self.engine.tokenizer is None:
            raise RuntimeError("AgentLoop.run: the engine has no tokenizer; bind it to a module first")
        self.last_stats = RunStats()
        return run_episodes(self, prompts, n, sampling, self.last_stats)

    def stream(
        self, prompts: Iterable[Any], n: int, sampling: SamplingConfig, max_groups_in_flight: int
    ) -> Iterator[tuple[Any, list[Episode]]]:
        """Groups of ``n`` episodes per prompt of ``prompts``, yielded as ``(prompt, episodes)`` the moment a
        group's last episode ends, with up to ``max_groups_in_flight`` groups running at once (async scheduling
        whatever ``concurrency`` says): stragglers are carried while the next groups start, so their tools
        overlap other episodes' generation. ``last_stats`` covers the whole stream once it is exhausted."""
        if self.engine.tokenizer is None:
            raise RuntimeError("AgentLoop.stream: the engine has no tokenizer; bind it to a module first")
        self.last_stats = RunStats()
        return stream_episodes(self, prompts, n, sampling, max_groups_in_flight, self.last_stats)

    def to_experience(
        self,
        prompts: list[Any],
        episodes: list[list[Episode]],
        pad_id: int,
        first_group: int = 0,
        policy_version: int = 0,
    ) -> Experience:
        """Pack episodes into an Experience (layout and reward placement in the module doc; no horizon: the
        pipeline's ``experience_builder`` sets it). ``policy_version``: the version of turns that recorded none.

        Shapes: B = number of episodes, P = longest prompt, C = longest interleaved completion.
        """
        G = len(episodes[0]) if episodes else 1
        group_ids = torch.arange(first_group, first_group + len(episodes)).repeat_interleave(G)
        return ExperienceBuilder().pack(
            self.episode_rows(Rollouts(list(prompts), [], episodes), policy_version),
            pad_id,
            group_ids,
            policy_version=policy_version,
        )

    def episode_rows(self, batch: Rollouts, default_version: int | None = None) -> Rows:
        """The episode layout of ``ExperienceBuilder``: one row per episode, the completion its actions and
        observations interleaved (loss on actions only, ``extras["obs_mask"]`` on observations), turn rewards
        r_1..r_{K-1} in ``token_rewards`` and r_K as the row's reward; ``batch.rewards`` (when scored) gives
        the rows' ``reward_errors`` (unscored: the faulted episodes' ``Episode.error``). Each sampled token's
        policy version (``Turn.action_versions``; ``default_version`` or the engine's for turns without) becomes
        ``extras["token_versions"]`` and the row's ``policy_version`` its oldest (``Rows.policy_versions``)."""
        rows = [e for group in batch.groups for e in group]
        segs = [_segments(e) for e in rows]
        logprobs, token_rewards, finals, versions = [], [], [], []
        # the version of turns that recorded none (built by hand): the given one, else the engine's now
        now = self.engine.policy_version if default_version is None else default_version
        for e, (ids, _) in zip(rows, segs):
            lp = [0.0] * len(ids)
            ver = [-1] * len(ids)  # -1: not sampled by the policy (observations)
            tr = torch.zeros(len(ids), dtype=torch.float32)
            pos, last = 0, None
            for t in e.turns:
                if t.action_ids:
                    lp[pos : pos + len(t.action_ids)] = t.action_logprobs
                    v = t.action_versions if t.action_versions is not None else [now] * len(t.action_ids)
                    ver[pos : pos + len(t.action_ids)] = v
                    last = pos + len(t.action_ids) - 1
                if last is not None:  # an empty action credits the previous action's last token
                    tr[last] += t.reward
                pos += len(t.action_ids) + len(t.obs_ids)
            final = 0.0
            if last is not None:  # the reward on the final action token is the row's sequence reward
                final, tr[last] = tr[last].item(), 0.0
            logprobs.append(lp)
            versions.append(ver)
            token_rewards.append(tr)
            finals.append(final)
        valid = torch.tensor([not e.infra_error for e in rows], dtype=torch.bool)
        rewards = torch.tensor(finals, dtype=torch.float32)
        rewards = torch.where(valid, rewards, torch.full_like(rewards, float("nan")))
        returns = torch.tensor([e.total_reward for e in rows], dtype=torch.float32)
        G = len(batch.groups[0]) if batch.groups else 1
        tok = self.engine.tokenizer
        errors = [e.error for e in rows]
        fields: dict[str, Any] = {
            "reward_components": {
                "env_return": torch.where(valid, returns, torch.full_like(returns, float("nan")))
            },
            "finish_reasons": ["stop" if e.done else "length" for e in rows],
            "texts": [tok.decode(ids, skip_special_tokens=True) for ids, _ in segs],
        }
        if batch.rewards is not None:  # the inspector shows why a row has no reward
            fields["reward_errors"] = list(batch.rewards.errors)
        elif any(errors):
            fields["reward_errors"] = errors
        return Rows(
            prompt_ids=[e.prompt_ids for e in rows],
            completion_ids=[ids for ids, _ in segs],
            prompts=[p for p in batch.prompts for _ in range(G)],
            rewards=rewards,
            valid=valid,
            logprobs=logprobs,
            action_masks=[[k == "a" for k in kinds] for _, kinds in segs],
            token_rewards=token_rewards,
            policy_versions=versions,
            fields=fields,
        )

    def experience_builder(self, sampling: SamplingConfig) -> ExperienceBuilder:
        """The build stage of the agent path: the episode layout with run-wide group ids and the agent horizon,
        Dr. GRPO's constant for an episode being the action-token budget of all its turns,
        ``max_turns x sampling.max_new_tokens``."""
        return ExperienceBuilder(
            self.engine, horizon=self.max_turns * sampling.max_new_tokens, layout=self.episode_rows
        )


def _segments(e: Episode) -> tuple[list[int], list[str]]:
    """The interleaved completion of an episode and, per token, "a" (action) or "o" (observation)."""
    ids: list[int] = []
    kinds: list[str] = []
    for t in e.turns:
        ids += t.action_ids + t.obs_ids
        kinds += ["a"] * len(t.action_ids) + ["o"] * len(t.obs_ids)
    return ids, kinds


class AgentGenerator:
    """Generate stage of the agent path: ``n = group_size`` episodes per prompt with ``AgentLoop.run``.

    The episodes render their own first observation (``env.reset(prompt)``), so the rendered ``prompt_ids``
    are not used; the render stage still applies the prompt-length policy and its counters.
    """

    def __init__(self, agent: AgentLoop, settings: RolloutSettings, lock: threading.RLock | None = None):
        self.agent, self.settings = agent, settings
        self.lock = lock if lock is not None else threading.RLock()

    @property
    def engine(self) -> EngineBase:
        """The agent's engine (the pipeline's ``GenerateStage.engine``)."""
        return self.agent.engine

    def __call__(self, prompts: list[Any], prompt_ids: Any = None) -> tuple[list[list[Episode]], float]:
        """(N groups of G ``Episode``, wall seconds)."""
        t0 = time.perf_counter()
        with self.lock:
            groups = self.agent.run(prompts, self.settings.group_size, self.settings.sampling)
        return groups, time.perf_counter() - t0


class EnvRewards:
    """Score stage of the agent path: an episode's reward is its environment return.

    An episode with an infrastructure error is invalid (reward NaN, counted in ``reward/infra_errors``, with
    its reason in ``errors``), never scored 0. Metrics: ``rollout/turns_mean``, ``rollout/episodes_done_frac``,
    ``reward/hack_detected`` (episodes in which the environment detected a reward hack, ``env.py``), the
    faults (``agent/episodes_timed_out``, ``agent/env_errors``, ``agent/episodes_over_budget``,
    ``agent/episodes_cut``: ``agent_async.py``; each such episode is masked, its reason in ``errors``) and the
    episode metrics of ``episode_metrics`` (tokens, tool calls, success).
    """

    def __call__(self, prompts: list[Any], groups: list[list[Episode]]) -> RewardBatch:
        rows = [e for g in groups for e in g]
        valid = torch.tensor([not e.infra_error for e in rows], dtype=torch.bool)
        ret = torch.tensor([e.total_reward for e in rows], dtype=torch.float64)
        ret = torch.where(valid, ret, torch.full_like(ret, float("nan")))
        metrics = {
            "reward/infra_errors": float((~valid).sum()),
            "reward/timeouts": 0.0,
            "rollout/turns_mean": sum(len(e.turns) for e in rows) / max(len(rows), 1),
            "rollout/episodes_done_frac": sum(e.done for e in rows) / max(len(rows), 1),
            "reward/hack_detected": float(
                sum(any(t.info.get("hack_detected", 0.0) for t in e.turns) for e in rows)
            ),
            **fault_metrics(rows),
            **episode_metrics(rows),
        }
        errors = [
            None if v else e.error or "environment reported an infrastructure error"
            for v, e in zip(valid.tolist(), rows)
        ]
        return RewardBatch(ret, valid, {"env_return": ret.clone()}, errors, metrics)


def episode_metrics(rows: list[Episode]) -> dict[str, float]:
    """Per-batch means over episodes: ``rollout/tokens_per_episode`` (actions + observations, the prompt
    excluded) and ``rollout/action_tokens_per_episode``; with tools (turn ``info`` from ``tool_env.ToolEnv``)
    ``tools/calls_per_episode``, ``tools/valid_call_rate`` (calls that ran without error / calls; 0 without
    calls) and ``tools/errors/<kind>`` (the batch's failed calls of each ``tools.ERROR_KINDS`` kind); with
    ``info["success"]`` or tools ``rollout/success_frac`` (episodes that succeeded; one cut by ``max_turns``
    did not)."""
    n = max(len(rows), 1)
    out = {
        "rollout/tokens_per_episode": sum(len(t.action_ids) + len(t.obs_ids) for e in rows for t in e.turns)
        / n,
        "rollout/action_tokens_per_episode": sum(len(t.action_ids) for e in rows for t in e.turns) / n,
    }
    infos = [t.info for e in rows for t in e.turns]
    calls = sum(i.get("tool_calls", 0.0) for i in infos)
    if any("tool_calls" in i for i in infos):
        failed = {k: sum(i.get(f"tool_errors/{k}", 0.0) for i in infos) for k in ERROR_KINDS}
        out["tools/calls_per_episode"] = calls / n
        out["tools/valid_call_rate"] = (calls - sum(failed.values())) / calls if calls else 0.0
        out.update({f"tools/errors/{k}": v for k, v in failed.items()})
    if any("success" in i or "tool_calls" in i for i in infos):  # an episode cut by max_turns did not succeed
        out["rollout/success_frac"] = sum(any(t.info.get("success", 0.0) for t in e.turns) for e in rows) / n
    return out


def agent_pipeline(
    agent: AgentLoop,
    settings: RolloutSettings,
    filters: FilterSettings | None = None,
    lock: threading.RLock | None = None,
) -> RolloutPipeline:
    """The agent path as a pipeline: the render stage of ``settings`` (prompt-length policy and counters),
    then ``AgentGenerator`` (episodes), ``EnvRewards`` (environment returns: no reward pool) and the episode
    ``ExperienceBuilder``; dynamic sampling refills as on the single-turn path. The overlong filter and
    shaping act on one completion cut by its budget, which an episode is not: refused."""
    filters = filters if filters is not None else FilterSettings()
    for name in ("overlong_filter", "overlong_buffer"):
        if getattr(filters, name) != getattr(FilterSettings(), name):
            raise ValueError(
                f"{name} is a single-turn setting (an episode is not one completion cut by its "
                "budget): remove it from the agent rollout"
            )
    sp = settings.sampling
    render = PromptRenderer(
        settings.max_prompt_len,
        settings.overlong_prompts,
        context_len=lambda: engine_context_len(agent.engine),
        max_new_tokens=sp.max_new_tokens,
    )
    return RolloutPipeline(
        render=render,
        generate=AgentGenerator(agent, settings, lock),
        score=EnvRewards(),
        build=agent.experience_builder(sp),
        settings=settings,
        filters=filters,
    )
