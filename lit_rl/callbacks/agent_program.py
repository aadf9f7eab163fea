"""``AgentProgramRolloutCallback``: train from a user's agent program through the OpenAI-compatible endpoint.

An ``AgentRolloutCallback`` whose agent is a ``rollout.agent_program.ProgramLoop`` (``program(base_url,
prompt) -> reward`` run per episode against the endpoint the loop serves from the rollout engine) and whose
score stage is ``ProgramRewards`` (the ``agent/*`` metrics: failures, prefix breaks, calls). The endpoint runs
while episodes do (the pipeline's lock is held, so no weight sync lands inside a batch) and stops at teardown.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lit_rl.callbacks.agent_rollout import AgentRolloutCallback
from lit_rl.core.settings import flat_settings
from lit_rl.rollout.agent_program import ProgramLoop, ProgramRewards
from lit_rl.rollout.settings import FilterSettings, RolloutSettings, SyncSettings


@flat_settings((RolloutSettings, FilterSettings, SyncSettings), before=1)
class AgentProgramRolloutCallback(AgentRolloutCallback):
    """``AgentRolloutCallback`` for agent programs (module doc); the settings are the same.

    Args:
        agent: the ``ProgramLoop`` (the program, its engine, ``deadline_s``, ``max_calls``, ...).
    """

    def __init__(self, agent: ProgramLoop, **settings: Any):
        if not isinstance(agent, ProgramLoop):
            raise TypeError(
                f"AgentProgramRolloutCallback: agent must be a lit_rl.rollout.agent_program.ProgramLoop, got "
                f"{type(agent).__name__} (an AgentLoop with an environment: AgentRolloutCallback)"
            )
        super().__init__(agent, **settings)
        self.program_loop = agent
        self.pipeline.score = ProgramRewards()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.program_loop.close()
        super().teardown(trainer, pl_module, stage)
