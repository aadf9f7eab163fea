"""Log a step-level metric only at the steps that produced it.

Lightning keeps every ``self.log(..., on_step=True)`` value in its result collection for the whole epoch and
sends *all* of them to the loggers after each batch, so a metric logged at step 3 but not at step 4 (a reward's
``none_frac`` on a step without ``None`` rows, a NaN skipped by ``PolicyModule``, a weight sync every k steps)
is written again at step 4 with step 3's value: a number nobody measured. ``StepMetricsOnly`` drops those
repeats: in ``on_train_batch_end`` -- the last hook before Lightning hands the batch's metrics to the loggers
-- a step value whose cached tensor is the very object that was there at the previous batch's end was not
logged during this batch (every ``self.log`` stores a fresh clone), so it is hidden from this step's logs.
Epoch-level accumulation and ``trainer.callback_metrics`` (checkpoint monitors) are untouched.
"""

from __future__ import annotations

from typing import Any


def drop_unlogged(results: Any, seen: dict[str, Any]) -> dict[str, Any]:
    """Hide the step values in ``results`` (Lightning's ``_ResultCollection``) that are the same objects as in
    ``seen`` (the previous batch's); returns this batch's ``{key: cached value}`` for the next call."""
    now: dict[str, Any] = {}
    for key, item in (results or {}).items():
        cache = getattr(item, "_forward_cache", None)
        if cache is None or not getattr(getattr(item, "meta", None), "on_step", False):
            continue
        if seen.get(key) is cache:
            item._forward_cache = None  # Lightning skips a step value whose cache is None
        else:
            now[key] = cache
    return now


class StepMetricsOnly:
    """LightningModule mixin: each step's logs hold only the metrics that step logged (module doc)."""

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            seen = getattr(self, "_step_metrics_seen", None) or {}
            self._step_metrics_seen = drop_unlogged(getattr(trainer, "_results", None), seen)
