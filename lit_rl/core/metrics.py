"""How each logged metric combines over micro-batches, optimizer steps and ranks: declared per metric.

A metric of one iteration is computed many times — once per micro-batch, once per optimizer step
(``ppo_epochs`` × minibatches), once per rank — and ``PolicyModule`` folds those values into the one number it
logs. Most are averages (every micro-batch / rank holds an equal share of rows), but an extreme must stay an
extreme: a spike of ``is/max_weight`` in one micro-batch is the point of the metric. The reduction is
declared here, next to the name, instead of guessed from the name (a reward component called ``admin`` or
``format_min`` is not an extreme).

    reduce   folds values v_1..v_n into
    mean     (Σ v_i) / n
    max      max v_i
    min      min v_i
    sum      Σ v_i       (counts that add up across micro-batches and ranks)

Undeclared metrics are averaged. Declarations are exact names (``actor/ratio_max``); a producer of a new
extreme declares it with ``METRICS.declare(Metric(name, reduce="max"))`` at import time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REDUCTIONS = ("mean", "max", "min", "sum")


@dataclass(frozen=True)
class Metric:
    """A logged metric's name and how its values combine (one of ``REDUCTIONS``)."""

    name: str
    reduce: str = "mean"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Metric.name must be a non-empty string, got {self.name!r}")
        if self.reduce not in REDUCTIONS:
            raise ValueError(
                f"Metric {self.name!r}: reduce={self.reduce!r}; valid values: {', '.join(REDUCTIONS)}"
            )


class MetricRegistry:
    """Declared reductions by exact metric name; undeclared names reduce with ``default``."""

    def __init__(self, metrics: Iterable[Metric] = (), default: str = "mean"):
        if default not in REDUCTIONS:
            raise ValueError(f"default={default!r}; valid values: {', '.join(REDUCTIONS)}")
        self.default = default
        self._reduce: dict[str, str] = {}
        for m in metrics:
            self.declare(m)

    def declare(self, metric: Metric) -> Metric:
        """Add ``metric``; declaring a name again with another reduction is an error (one meaning per name)."""
        old = self._reduce.get(metric.name)
        if old is not None and old != metric.reduce:
            raise ValueError(
                f"metric {metric.name!r} is already declared with reduce={old!r}, not {metric.reduce!r}"
            )
        self._reduce[metric.name] = metric.reduce
        return metric

    def reduce_fx(self, name: str) -> str:
        """The reduction of ``name`` (also Lightning's ``self.log(reduce_fx=...)`` over ranks)."""
        return self._reduce.get(name, self.default)

    def reduce(self, name: str, values: Sequence[float]) -> float:
        """Fold the non-empty ``values`` of ``name`` with its declared reduction."""
        if not values:
            raise ValueError(f"metric {name!r}: no values to reduce")
        fx = self.reduce_fx(name)
        if fx == "max":
            return max(values)
        if fx == "min":
            return min(values)
        total = sum(values)
        return total if fx == "sum" else total / len(values)

    def reduce_ranks(self, per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
        """One dict from every rank's ``{name: value}``: each name over the ranks that have a finite value for
        it, with its declared reduction; NaN where none has. Ranks may differ in which values are NaN (a
        rank with no stopped row has no stopped-length statistics) or missing: reducing the gathered dicts
        instead of one collective per logged name keeps every rank in the same collectives."""
        names = list(dict.fromkeys(k for d in per_rank for k in d))
        out: dict[str, float] = {}
        for k in names:
            vals = [float(d[k]) for d in per_rank if k in d and not math.isnan(float(d[k]))]
            out[k] = self.reduce(k, vals) if vals else math.nan
        return out

    def declared(self) -> dict[str, str]:
        return dict(self._reduce)


# The extremes and counts among the metrics PolicyModule logs (everything else is a mean):
METRICS = MetricRegistry(
    [
        Metric("actor/ratio_max", "max"),
        Metric("actor/ratio_min", "min"),  # core.policy_losses, per micro-batch
        Metric("is/max_weight", "max"),  # core.importance.rollout_correction, per micro-batch
        Metric("actor/signal_rows", "sum"),  # PolicyModule: rows forwarded, per optimizer step and rank
        Metric("adv/max", "max"),
        Metric("adv/min", "min"),  # core.advantages, per rank
        # rollout.stats (via rollout.build), per rank:
        Metric("rollout/response_len_max", "max"),
        Metric("response_length/max", "max"),
        Metric("rollout/response_len_min", "min"),
        Metric("response_length/min", "min"),
        Metric("rollout/response_len_stopped_max", "max"),
        Metric("rollout/response_len_stopped_min", "min"),
        Metric("async/staleness_max", "max"),  # callbacks.rollout (async), per rank
        Metric("reward/none_rows", "sum"),  # rewards.pool: rows no reward applied to, over all ranks
    ]
)
