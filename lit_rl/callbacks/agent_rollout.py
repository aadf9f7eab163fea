"""Agent training callbacks: ``AgentRolloutCallback`` (episodes as rollouts), ``AgentEval`` (held-out episodes)
and ``ObservationLoss``.

``AgentRolloutCallback`` is a ``RolloutCallback`` handed the agent pipeline (``agent_loop.agent_pipeline``:
``AgentGenerator``, ``EnvRewards``, the episode ``ExperienceBuilder``) in place of the single-turn one;
ExperienceHooks, advantages, weight sync and checkpointed state are the base callback's.
"""

from __future__ import annotations

import threading
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lit_rl.callbacks.eval import HeldoutEval
from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.core.settings import flat_settings, flat_values, split_settings
from lit_rl.data.experience import Experience
from lit_rl.learners.binding import RolloutBinding
from lit_rl.learners.policy import PolicyModule
from lit_rl.learners.protocols import LossTerm
from lit_rl.rollout.agent_loop import AgentLoop, agent_pipeline, episode_metrics
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.settings import FilterSettings, RolloutSettings, SyncSettings


class ObservationLoss(L.Callback, LossTerm):
    """World-model auxiliary loss: ``coef`` x negative log-likelihood of observation tokens.

    Trains the policy to predict the environment's responses as well (the "agents learn a world model
    for free" idea from the seeds); off by default (``coef=0`` adds nothing). A ``LossTerm``: add it to
    ``trainer.callbacks`` next to an ``AgentRolloutCallback``.

    The NLL of the observation tokens (``extras["obs_mask"]``, (b, C)) is aggregated like every other term,
    with ``module.aggregate`` and the minibatch denominators in ``fwd`` (``num_tokens`` / ``num_seqs``, global
    over ranks): with ``token_mean`` it is Σ obs-token NLL / (trainable tokens of the minibatch). Only rows in
    ``Experience.train_rows`` count: a row without a reward or filtered out (overlong) trains nothing. The micro-batch
    terms then sum to the minibatch term, so its weight does not depend on ``micro_batch_size`` or the number
    of ranks (a per-micro-batch mean would count once per micro-batch).
    """

    def __init__(self, coef: float = 0.0):
        if coef < 0:
            raise ValueError(f"ObservationLoss.coef must be >= 0, got {coef}")
        self.coef = coef

    def loss_terms(self, module, micro: Experience, fwd: dict[str, Any]) -> dict[str, Tensor]:
        obs = micro.extras.get("obs_mask")
        if self.coef == 0 or obs is None:
            return {}
        # only rows that train: a failed or filtered row (``train_rows`` False) is out of every loss term
        obs = obs.to(fwd["logprobs"].device).bool() & micro.train_rows.to(fwd["logprobs"].device)[:, None]
        return {"world_model": self.coef * module.aggregate(-fwd["logprobs"], obs, fwd)}


@flat_settings((RolloutSettings, FilterSettings, SyncSettings), before=1)
class AgentRolloutCallback(RolloutCallback):
    """``RolloutCallback`` whose pipeline is the agent path (``agent_loop.agent_pipeline``): ``AgentLoop``
    episodes scored by the environment, no reward pool.

    Everything else (prompt checks, dynamic sampling, ExperienceHooks, advantages, weight sync, checkpointed
    state) is the base callback's, and so are the settings: the same groups, names and defaults
    (``lit_rl.rollout.settings``; the single-turn ``overlong_filter`` / ``overlong_buffer`` are refused). The
    loop's engine generates; there is no ``rewards``.

    Args:
        agent: the ``AgentLoop`` that runs the episodes.
    """

    def __init__(self, agent: AgentLoop, **settings: Any):
        rollout, filters, sync = split_settings("AgentRolloutCallback", type(self).settings_groups, settings)
        pipeline = agent_pipeline(agent, rollout, filters, threading.RLock())
        super().__init__(engine=agent.engine, pipeline=pipeline, **flat_values(sync))
        self.agent = agent

    def _make_default_eval(self) -> HeldoutEval:
        # validation without an evaluator of the user's runs episodes (HeldoutEval scores with a reward pool)
        return AgentEval()

    def _agent_loop(self) -> AgentLoop:
        return self.agent  # in the rollout binding: AgentEval runs its held-out episodes with it


# per held-out episode, averaged over the evaluation: (eval metric, episode_metrics key)
_EPISODE_EVAL = {
    "eval/tokens_per_episode": "rollout/tokens_per_episode",
    "eval/tool_calls_per_episode": "tools/calls_per_episode",
}


class AgentEval(HeldoutEval):
    """``HeldoutEval`` for agents: one greedy episode per held-out prompt with the ``AgentRolloutCallback``'s
    ``AgentLoop`` (its engine, environment and limits).

    ``eval/accuracy`` is the fraction of episodes whose return is ``>= correct_threshold`` (1.0; an episode with
    an infrastructure error is not a success), or whose final reply ``scorer(prompt, reply)`` scores so when a
    scorer is given; ``eval/reward_mean`` the mean return; ``eval/turns_mean``, ``eval/tokens_per_episode``
    (actions + observations) and ``eval/tool_calls_per_episode`` per episode; ``eval/valid_call_rate`` the
    calls that ran without error over all calls of the evaluation (episodes without calls add nothing). When
    and how often: ``HeldoutEval``'s settings (``val_check_interval``, ``baseline``, ``max_prompts``, ...)."""

    def start(self, pl_module: PolicyModule) -> None:
        super().start(pl_module)
        from torchmetrics import MeanMetric

        for k in ("eval/turns_mean", *_EPISODE_EVAL, "eval/valid_call_rate"):
            self._metrics[k] = MeanMetric(nan_strategy="ignore").to(pl_module.device)

    def _score(self, rc: RolloutBinding, pl_module: PolicyModule, prompts: list) -> None:
        agent = rc.agent
        if agent is None:
            raise RuntimeError(
                "AgentEval runs episodes with an AgentRolloutCallback's AgentLoop; the run has none"
            )
        budget = self.max_new_tokens or rc.settings.sampling.max_new_tokens
        rc.apply_pending()  # the learner's latest pushed weights (as eval_generate)
        groups = agent.run(prompts, 1, SamplingConfig(temperature=0.0, max_new_tokens=budget))
        eps = [g[0] for g in groups]
        dev = pl_module.device
        ok = torch.tensor([not e.infra_error for e in eps], device=dev)
        ret = torch.tensor([e.total_reward for e in eps], dtype=torch.float64, device=dev)
        if self.scorer is None:
            score = ret
        else:
            last = [e.turns[-1].action_text if e.turns else "" for e in eps]
            score = torch.tensor([float(self.scorer(p, t)) for p, t in zip(prompts, last)], device=dev)
        self._metrics["eval/accuracy"].update((ok & (score >= self.correct_threshold)).float())
        if ok.any():
            self._metrics["eval/reward_mean"].update(ret[ok].float())
        for e in eps:
            self._metrics["eval/turns_mean"].update(torch.tensor(float(len(e.turns)), device=dev))
            m = episode_metrics([e])
            for k, src in _EPISODE_EVAL.items():
                self._metrics[k].update(torch.tensor(m.get(src, 0.0), device=dev))
            calls = m.get("tools/calls_per_episode", 0.0)
            if calls:  # weighted by the episode's calls: the rate over every call of the evaluation
                self._metrics["eval/valid_call_rate"].update(
                    torch.tensor(m["tools/valid_call_rate"], device=dev), weight=calls
                )
