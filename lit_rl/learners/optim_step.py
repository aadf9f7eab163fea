"""`OptimizerStep`: one optimizer step of ``PolicyModule`` over a minibatch's micro-batches, as one object.

What it owns, in order:

1. gradient accumulation: ``loss_fn(micro)`` → loss parts per micro-batch, ``backward(Σ parts)``; each part is
   already divided by the minibatch's global denominators, so the accumulated gradient is the minibatch's;
2. zero-weight passes: a ``None`` micro-batch (a rank with fewer token-budget micro-batches) runs
   ``zero_weight_fn()``'s loss × 0, so the ranks' collectives (DDP all-reduce, FSDP all-gathers) stay in step;
3. gradient clipping to ``max_grad_norm`` (norm over the parameters that have a gradient);
4. the non-finite guard: a non-finite norm skips the step (parameters and optimizer state untouched), counts
   it in ``skipped_steps`` and ``nonfinite_in_a_row``; ``max_nonfinite_steps`` in a row raise;
5. the LR scheduler, stepped only after an applied step;
6. the DeepSpeed adapter: under ZeRO the gradients live in the engine's partitions (``p.grad`` is None), so
   the engine's own step clips and skips, and the norm / applied flag are read back from it; a skipped step
   is taken back from Lightning's step count so ``max_steps`` means the same as on other strategies.

It returns the step's statistics: ``loss/<part>`` and the ``shares`` summed over micro-batches (the parts of one
minibatch quantity), the micro-batches' metrics reduced as declared in ``core.metrics``, and ``actor/grad_norm``;
zero-weight passes add nothing to any of them. The counters live
on the object and are checkpointed by ``PolicyModule`` (``_RESUME_ATTRS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from lit_rl.core.metrics import METRICS, MetricRegistry


class LossParts(dict):
    """The loss parts ``{name: scalar tensor}`` of one micro-batch, with that micro-batch's ``metrics``
    (``{name: float}``, reduced over micro-batches as declared in ``core.metrics``) and ``shares``
    (``{name: float}``: this micro-batch's share of a minibatch quantity, aggregated with the minibatch
    denominators like the parts, so summed over the step's micro-batches, e.g. ``critic/value_loss``) attached:
    a plain dict to everything that reads the parts."""

    def __init__(
        self,
        parts: dict[str, Tensor],
        metrics: dict[str, float] | None = None,
        shares: dict[str, float] | None = None,
    ):
        super().__init__(parts)
        self.metrics = dict(metrics or {})
        self.shares = dict(shares or {})


class OptimizerStep:
    """Accumulate, clip, guard and step (see the module doc).

    Args:
        max_grad_norm: clipping threshold (> 0).
        max_nonfinite_steps: this many skipped steps in a row raise ``RuntimeError``.
        metrics: how per-micro-batch metrics combine (``core.metrics.METRICS``).
    """

    def __init__(self, max_grad_norm: float, max_nonfinite_steps: int, metrics: MetricRegistry = METRICS):
        self.max_grad_norm, self.max_nonfinite_steps, self.metrics = (
            max_grad_norm,
            max_nonfinite_steps,
            metrics,
        )
        self.skipped_steps = 0
        self.nonfinite_in_a_row = 0

    def run(
        self,
        opt,
        sched,
        micros: Iterable[Any | None],
        loss_fn: Callable[[Any], dict[str, Tensor]],
        zero_weight_fn: Callable[[], dict[str, Tensor]],
        backward: Callable[[Tensor], None],
        params: Callable[[], Iterable[torch.nn.Parameter]],
        ds=None,
        uncount: Callable[[], None] = lambda: None,
    ) -> dict[str, float]:
        """One optimizer step.

        ``loss_fn(micro)`` returns the loss parts ``{name: scalar}``; a mapping with a ``metrics`` attribute
        (``LossParts``) also hands over the micro-batch's metrics. ``backward`` is the strategy's backward
        (``manual_backward``), ``params()`` the module's parameters, ``ds`` the DeepSpeed engine or None,
        ``uncount()`` takes a skipped step back from the trainer's step count (DeepSpeed only).
        """
        opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        per_micro: dict[str, list[float]] = {}
        for micro in micros:
            if (
                ds is not None
            ):  # what DeepSpeed's engine.forward does first (the model is called directly here):
                ds.optimizer.clear_backward_seen_flag()  # a new micro step; ZeRO-3 would overwrite, not add, grads
            if micro is None:  # zero-weight pass: same collectives, no contribution
                parts = zero_weight_fn()
                backward(_total(parts) * 0.0)
                continue
            parts = loss_fn(micro)
            backward(_total(parts))
            for k, v in parts.items():
                stats[f"loss/{k}"] = stats.get(f"loss/{k}", 0.0) + float(v.detach())
            for k, v in getattr(parts, "shares", {}).items():  # like the parts: the minibatch's value
                stats[k] = stats.get(k, 0.0) + v
            for k, v in getattr(parts, "metrics", {}).items():
                per_micro.setdefault(k, []).append(v)
        stats.update({k: self.metrics.reduce(k, v) for k, v in per_micro.items()})
        norm = self._clip_norm(opt, params, ds, uncount)
        stats["actor/grad_norm"] = norm
        if not math.isfinite(norm):
            opt.zero_grad(set_to_none=True)  # skip: parameters and optimizer state stay exactly as they were
            self.skipped_steps += 1
            self.nonfinite_in_a_row += 1
            if self.nonfinite_in_a_row >= self.max_nonfinite_steps:
                raise RuntimeError(
                    f"{self.nonfinite_in_a_row} optimizer steps in a row had a non-finite gradient norm "
                    f"(max_nonfinite_steps={self.max_nonfinite_steps}); training diverged. Lower the learning "
                    "rate, use float32, or check rewards/advantages for extreme values."
                )
            return stats
        self.nonfinite_in_a_row = 0
        if ds is None:
            opt.step()
        if sched is not None:
            sched.step()
        return stats

    def _clip_norm(self, opt, params, ds, uncount) -> float:
        """The gradient norm before clipping (clipping applied); ``inf`` for a step DeepSpeed skipped."""
        if ds is None:
            grads = [p for p in params() if p.requires_grad and p.grad is not None]
            return float(torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)) if grads else 0.0
        # ZeRO: only the engine knows the global norm over its partitions. Its step clips to max_grad_norm
        # (DeepSpeedZeROStrategy sets gradient_clipping) and itself skips a non-finite step; read both back.
        opt.step()
        got = ds.get_global_grad_norm()
        norm = float(got) if got is not None and ds.was_step_applied() else math.inf
        if not math.isfinite(norm):
            uncount()
        return norm


def default_adamw(params: Iterable[Tensor], lr: float) -> torch.optim.AdamW:
    """The modules' optimizer when a recipe names none: AdamW without weight decay, ``fused`` (each parameter's
    whole update in one kernel, on CPU as on GPU; what TRL steps with, transformers' ``adamw_torch_fused``).
    Same update as torch's default per-parameter loop up to float32 rounding, about 3x faster on a CPU, and
    without the loop's temporaries (``scripts/bench_optimizer.py``)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)


def _total(parts: dict[str, Tensor]) -> Tensor:
    """Σ of the loss parts, as ``sum`` adds them (never empty: the policy objective is always a part)."""
    values = list(parts.values())
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total
