"""`HeldoutValidation`: held-out evaluation as the policy module's ``validation_step``.

Lightning's validation loop decides *when* (``val_check_interval``, ``check_val_every_n_epoch``, the sanity
check, ``lit-rl validate``); the ``HeldoutEval`` callback decides *how* (greedy generation with the
RolloutCallback's engine, scorers, torchmetrics accumulation). Both are handed to the module at setup
(``heldout_eval``, ``rollout_source``); without a ``HeldoutEval`` callback the RolloutCallback hands a default
one, so ``lit-rl validate`` works on any recipe. Batches come from
``PromptDataModule.val_dataloader`` (the held-out prompts).
"""

from __future__ import annotations

import math


class HeldoutValidation:
    """Mixin for a policy ``LightningModule`` (``PolicyModule`` inherits it)."""

    # Handed over at setup (explicit wiring, no search of trainer.callbacks): the RolloutCallback sets
    # ``rollout_source`` (itself) and, when no HeldoutEval callback set one, a default ``heldout_eval``.
    rollout_source = None
    heldout_eval = None

    def _heldout_eval(self):
        if self.heldout_eval is None:
            raise RuntimeError(
                "held-out validation needs a RolloutCallback (it hands the module its engine and an "
                "evaluator at setup); add lit_rl.callbacks.RolloutCallback (the `rollout:` section)"
            )
        return self.heldout_eval

    def on_validation_start(self) -> None:
        if (
            self.trainer.state.fn != "fit"
        ):  # validate/test: RolloutCallback.setup binds its engine for fit only
            import torch

            # Lightning runs this hook under inference mode; an engine's own weights (a private copy, vLLM's)
            # made here would be inference tensors that its weight loads cannot write in place.
            with torch.inference_mode(False):
                self._heldout_eval()  # fails naming the missing RolloutCallback
                self.rollout_source.engine.bind(self)
        self._heldout_eval().start(self)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._heldout_eval().score_batch(self.trainer, self, batch.prompts)

    def on_validation_epoch_end(self) -> None:
        metrics = self._heldout_eval().finish(self.trainer, self)
        if (
            self.trainer.sanity_checking
        ):  # Lightning drops what is logged now: the step-0 baseline goes directly
            if getattr(self, "iteration", 0) == 0:
                for lg in self.trainer.loggers:
                    lg.log_metrics(metrics, step=0)
            return
        for k, v in metrics.items():
            if not math.isnan(v):  # already reduced over ranks by torchmetrics
                self.log(k, v, prog_bar=k == "eval/accuracy", batch_size=1, on_epoch=True, on_step=False)
