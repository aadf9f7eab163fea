"""Progress bars that count RL iterations, not Lightning epochs.

An RL run is bounded by ``max_steps`` with ``max_epochs: -1``; an "epoch" is one pass over the prompt set
and means nothing to the user, and Lightning's bars show ``Epoch 0/-2``. These bars show ``Iteration`` with
one bar for the whole run: iteration k of ``total``, where ``total`` is ``max_steps`` (optimizer steps) divided by
the optimizer steps one iteration takes (``ppo_epochs`` × minibatches: ``RolloutCallback.setup`` binds it in
the learner's rollout binding, ``steps_per_iteration``, so the total is right from the first draw; without it,
measured after the first iteration).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar

from lit_rl.callbacks._learner import bound_rollout, rl_iteration


def _iteration(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    return rl_iteration(trainer, pl_module)


def _total(trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
    """Iterations the run will take (inf without max_steps)."""
    if not trainer.max_steps or trainer.max_steps < 0:
        return math.inf
    it = _iteration(trainer, pl_module)
    rc = bound_rollout(pl_module)
    per_iter = (rc.steps_per_iteration if rc is not None else None) or (
        trainer.global_step / it if it else 1.0
    )
    return max(it, math.ceil(trainer.max_steps / max(per_iter, 1e-9)))


class IterationProgressBar(TQDMProgressBar):
    """tqdm bar over RL iterations (``lit-rl``'s default bar)."""

    _started = False  # the one bar of the run has been set up (a new "epoch" does not reset it)

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if self.train_progress_bar is None or self._started:
            return  # one bar for the whole run: a new "epoch" does not reset it
        self._started = True
        pl_module = trainer.lightning_module
        total = _total(trainer, pl_module)
        self.train_progress_bar.reset(total=None if math.isinf(total) else total)
        self.train_progress_bar.initial = 0
        self.train_progress_bar.n = _iteration(trainer, pl_module)  # a resumed run starts where it was
        self.train_progress_bar.set_description("Iteration")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        total = _total(trainer, pl_module)
        bar.total = None if math.isinf(total) else total
        bar.n = _iteration(trainer, pl_module)
        bar.set_postfix(self.get_metrics(trainer, pl_module))
        bar.refresh()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pass  # the bar stays open across epochs; on_train_end closes it


class RichIterationProgressBar(RichProgressBar):
    """Rich bar over RL iterations (``callbacks/rich_progress.yaml``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        return "Iteration"

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.train_progress_bar_id is None:
            super().on_train_epoch_start(trainer, pl_module)
            self._sync(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
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
        self.progress.update(
            self.train_progress_bar_id,
            total=None if math.isinf(total) else total,
            completed=_iteration(trainer, pl_module),
        )


class ProgressLog(Callback):
    """Progress as plain lines when stdout is not a terminal (a run piped to a file, a batch job's log).

    There a progress bar shows nothing useful: the rich bar draws only its final state, at the end; tqdm's
    carriage-return redraws pile up on one line. This prints ``Iteration k/N: reward/mean 0.41, 1.23 s/it`` at
    the first iteration, every ``every_n_iterations`` and the last one, and ``Evaluation at iteration k:
    eval/accuracy 0.52, ...`` after each held-out evaluation. Added by ``lit-rl`` to every run; prints nothing
    on a terminal, or when the progress bar is off (``--trainer.enable_progress_bar false``).
    """

    def __init__(self, every_n_iterations: int = 10):
        if every_n_iterations < 1:
            raise ValueError(f"ProgressLog: every_n_iterations must be >= 1, got {every_n_iterations}")
        self.every_n_iterations = every_n_iterations
        self._last: tuple[int, float] | None = None  # (iteration, time) of the last line, or of the start
        self._printed = False

    @staticmethod
    def _active(trainer) -> bool:
        bar = trainer.progress_bar_callback
        return trainer.is_global_zero and bar is not None and bar.is_enabled and not _isatty(sys.stdout)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = (_iteration(trainer, pl_module), time.monotonic())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        it, total = _iteration(trainer, pl_module), _total(trainer, pl_module)
        last_it, last_t = self._last or (it - 1, time.monotonic())
        if it <= last_it or not self._active(trainer):
            return
        if self._printed and it % self.every_n_iterations and it < total:  # the first (a resumed run's too)
            return
        now = time.monotonic()
        self._last, self._printed = (it, now), True
        of = "" if math.isinf(total) else f"/{int(total)}"
        bar = trainer.progress_bar_metrics
        parts = [f"{k} {_fmt(v)}" for k, v in bar.items() if not k.startswith("eval/")]
        parts.append(f"{(now - last_t) / (it - last_it):.2f} s/it")
        _print(trainer, f"Iteration {it}{of}: {', '.join(parts)}")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._active(trainer):
            return
        evals = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("eval/")}
        if evals:
            parts = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(evals.items()))
            _print(trainer, f"Evaluation at iteration {_iteration(trainer, pl_module)}: {parts}")


def _print(trainer, line: str) -> None:
    if isinstance(trainer.progress_bar_callback, TQDMProgressBar):  # a line of its own, not after the bar
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream: not a terminal
        return False


def _fmt(v) -> str:
    v = float(v)
    return f"{v:.4g}"
