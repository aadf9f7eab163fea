"""`HeldoutValidation`: held-out evaluation as the policy module's ``validation_step``.

Lightning's validation loop decides *when* (``val_check_interval``, ``check_val_every_n_epoch``, the sanity
check, ``lit-rl validate``); the ``HeldoutEval`` callback decides *how* (greedy generation with the
RolloutCallback's engine, scorers, torchmetrics accumulation). Without a ``HeldoutEval`` in the callbacks a
default one is used, so ``lit-rl validate`` works on any recipe. Batches come from
``PromptDataModule.val_dataloader`` (the held-out prompts).
"""
from __future__ import annotations

import math


class HeldoutValidation:
    """Mixin for a policy ``LightningModule`` (``PolicyModule`` inherits it)."""

    def _heldout_eval(self):
        from lit_rl.callbacks.eval import HeldoutEval

        ev = next((cb for cb in self.trainer.callbacks if isinstance(cb, HeldoutEval)), None)
        if ev is None:
            ev = self.__dict__.get("_default_heldout_eval")
            if ev is None:
                ev = self.__dict__["_default_heldout_eval"] = HeldoutEval()
        return ev

    def on_validation_start(self) -> None:
        from lit_rl.callbacks.eval import _rollout_cb

        if self.trainer.state.fn != "fit":  # validate/test: RolloutCallback.setup binds its engine for fit only
            import torch

            # Lightning runs this hook under inference mode; an engine's own weights (a private copy, vLLM's)
            # made here would be inference tensors that its weight loads cannot write in place.
            with torch.inference_mode(False):
                _rollout_cb(self.trainer).engine.bind(self)
        self._heldout_eval().start(self)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._heldout_eval().score_batch(self.trainer, self, batch.prompts)

    def on_validation_epoch_end(self) -> None:
        metrics = self._heldout_eval().finish(self.trainer, self)
        if self.trainer.sanity_checking:  # Lightning drops what is logged now: the step-0 baseline goes directly
            if getattr(self, "iteration", 0) == 0:
                for lg in self.trainer.loggers:
                    lg.log_metrics(metrics, step=0)
            return
        for k, v in metrics.items():
            if not math.isnan(v):  # already reduced over ranks by torchmetrics
                self.log(k, v, prog_bar=k == "eval/accuracy", batch_size=1, on_epoch=True, on_step=False)
