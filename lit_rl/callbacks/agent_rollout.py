"""Agent training callbacks: ``AgentRolloutCallback`` (episodes as rollouts) and ``ObservationLoss``.

``AgentRolloutCallback`` is a ``RolloutCallback`` handed the agent pipeline (``agent_loop.agent_pipeline``:
``AgentGenerator``, ``EnvRewards``, the episode ``ExperienceBuilder``) in place of the single-turn one;
ExperienceHooks, advantages, weight sync and checkpointed state are the base callback's.
"""

from __future__ import annotations

import threading
from typing import Any

import lightning as L
from torch import Tensor

from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.core.settings import flat_settings, flat_values, split_settings
from lit_rl.data.experience import Experience
from lit_rl.learners.protocols import LossTerm
from lit_rl.rollout.agent_loop import AgentLoop, agent_pipeline
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
