"""`HeldoutValidation`: held-out evaluation as the policy module's ``validation_step``.

Lightning's validation loop decides *when* (``val_check_interval``, ``check_val_every_n_epoch``, the sanity
check, ``lit-rl validate``); the ``HeldoutEval`` callback decides *how* (greedy generation with the
RolloutCallback's engine, scorers, torchmetrics accumulation). Both come in the module's rollout binding
(``self.rollout.engine``, ``self.rollout.evaluator``, ``learners/binding.py``); without a ``HeldoutEval``
callback the RolloutCallback binds a default one, so ``lit-rl validate`` works on any recipe. Batches come from
``PromptDataModule.val_dataloader`` (the held-out prompts).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lit_rl.learners.host import PolicyHost

if TYPE_CHECKING:
    from lit_rl.learners.binding import Evaluator, RolloutBinding


class HeldoutValidation(PolicyHost):
    """Mixin for a policy ``LightningModule`` (``PolicyModule`` inherits it)."""

    # The evaluator and engine come from the rollout binding (``RolloutBound.rollout``, which fails naming
    # the missing RolloutCallback): PolicyModule inherits both mixins.
    rollout: RolloutBinding
    iteration: int  # PolicyModule's RL iteration

    def _heldout_eval(self) -> Evaluator:
        return self.rollout.evaluator

    def on_validation_start(self) -> None:
        if (
            self.trainer.state.fn != "fit"
        ):  # validate/test: RolloutCallback.setup binds its engine for fit only
            import torch

            # Lightning runs this hook under inference mode; an engine's own weights (a private copy, vLLM's)
            # made here would be inference tensors that its weight loads cannot write in place.
            with torch.inference_mode(False):
                self.rollout.engine.bind(self)  # fails naming the missing RolloutCallback
        self._heldout_eval().start(self)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._heldout_eval().score_batch(self.trainer, self, batch.prompts)

    def on_validation_epoch_end(self) -> None:
        metrics = self._heldout_eval().finish(self.trainer, self)
        if (
            self.trainer.sanity_checking
        ):  # Lightning drops what is logged now: the step-0 baseline goes directly
            if self.iteration == 0:
                for lg in self.trainer.loggers:
                    lg.log_metrics(metrics, step=0)
            return
        for k, v in metrics.items():
            if not math.isnan(v):  # already reduced over ranks by torchmetrics
                self.log(k, v, prog_bar=k == "eval/accuracy", batch_size=1, on_epoch=True, on_step=False)
