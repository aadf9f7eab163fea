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
from lit_rl.core.seeds import run_seed
from lit_rl.data.experience import Experience
from lit_rl.modules.protocols import LossTerm
from lit_rl.rollout.agent_loop import AgentLoop, agent_pipeline
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.pipeline import RolloutConfig


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


class AgentRolloutCallback(RolloutCallback):
    """``RolloutCallback`` whose pipeline is the agent path (``agent_loop.agent_pipeline``): ``AgentLoop``
    episodes scored by the environment, no reward pool.

    Everything else (prompt checks, dynamic sampling, ExperienceHooks, advantages, weight sync, checkpointed
    state) is the base callback's. Args are the base callback's, minus ``rewards`` and ``engine`` (the loop's
    engine is used).
    """

    def __init__(self, agent: AgentLoop, group_size: int = 4, sampling: SamplingConfig | None = None,
                 sync_every: int = 1, max_prompt_len: int = 1024, dynamic_sampling: bool = False,
                 max_resample_tries: int = 3, seed: int | None = None):
        seed = run_seed(seed)  # None: the run's seed_everything
        config = RolloutConfig(group_size=group_size, sampling=sampling or SamplingConfig(),
                               max_prompt_len=max_prompt_len, dynamic_sampling=dynamic_sampling,
                               max_resample_tries=max_resample_tries, seed=seed)
        lock = threading.RLock()
        super().__init__(engine=agent.engine, pipeline=agent_pipeline(agent, config, lock), sync_every=sync_every,
                         seed=seed)
        self.agent = agent
