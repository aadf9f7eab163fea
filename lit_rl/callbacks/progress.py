"""Progress bars that count RL iterations, not Lightning epochs.

An RL run is bounded by ``max_steps`` with ``max_epochs: -1``; an "epoch" is one pass over the prompt set
and means nothing to the user, and Lightning's bars show ``Epoch 0/-2``. These bars show ``Iteration`` with
one bar for the whole run: iteration k of ``total``, where ``total`` is ``max_steps`` (optimizer steps) divided by
the optimizer steps one iteration takes (``ppo_epochs`` × minibatches: ``RolloutCallback.setup`` sets
``pl_module.steps_per_iteration``, so the total is right from the first draw; without it, measured after the
first iteration).
"""
from __future__ import annotations

import math

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


def _iteration(trainer, pl_module) -> int:
    return int(getattr(pl_module, "iteration", trainer.global_step))


def _total(trainer, pl_module) -> float:
    """Iterations the run will take (inf without max_steps)."""
    if not trainer.max_steps or trainer.max_steps < 0:
        return math.inf
    it = _iteration(trainer, pl_module)
    per_iter = getattr(pl_module, "steps_per_iteration", None) or (trainer.global_step / it if it else 1.0)
    return max(it, math.ceil(trainer.max_steps / max(per_iter, 1e-9)))


class IterationProgressBar(TQDMProgressBar):
    """tqdm bar over RL iterations (``lit-rl``'s default bar)."""

    def on_train_epoch_start(self, trainer, *_) -> None:
        if self.train_progress_bar is None or getattr(self, "_started", False):
            return  # one bar for the whole run: a new "epoch" does not reset it
        self._started = True
        pl_module = trainer.lightning_module
        total = _total(trainer, pl_module)
        self.train_progress_bar.reset(total=None if math.isinf(total) else total)
        self.train_progress_bar.initial = 0
        self.train_progress_bar.n = _iteration(trainer, pl_module)  # a resumed run starts where it was
        self.train_progress_bar.set_description("Iteration")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        total = _total(trainer, pl_module)
        bar.total = None if math.isinf(total) else total
        bar.n = _iteration(trainer, pl_module)
        bar.set_postfix(self.get_metrics(trainer, pl_module))
        bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        pass  # the bar stays open across epochs; on_train_end closes it


class RichIterationProgressBar(RichProgressBar):
    """Rich bar over RL iterations (``callbacks/rich_progress.yaml``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        return "Iteration"

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.train_progress_bar_id is None:
            super().on_train_epoch_start(trainer, pl_module)
            self._sync(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.is_disabled:
            return
        if self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._sync(trainer, pl_module)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def _sync(self, trainer, pl_module) -> None:
        if self.progress is None or self.train_progress_bar_id is None:
            return
        total = _total(trainer, pl_module)
        self.progress.update(self.train_progress_bar_id, total=None if math.isinf(total) else total,
                             completed=_iteration(trainer, pl_module))
