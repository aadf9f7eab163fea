"""The run's monitors: `RLHealthMonitor` (per-step RL health metrics and once-per-episode warnings, from
``experience_health_metrics``), `TokensSeen` (cumulative trained tokens) and `IterationLRMonitor` (the
learning rate at each iteration's step).

Metrics it adds each iteration (from the step's ``Experience``, after advantages are computed):

- ``health/zero_adv_frac``: rows whose advantage is zero on every generated token — they carry no policy
  gradient (a GRPO group whose completions all pass or all fail, or a row with an infra-error reward).
- ``health/zero_var_group_frac``: groups whose valid rewards have zero variance (fewer than two valid rows
  counts as zero variance); measured on the Experience actually trained on, i.e. after any dynamic-sampling
  refill (``rollout/zero_std_frac`` is the same quantity before the refill).
- ``health/invalid_frac``: rows whose reward is unavailable (infra errors: a fallen-over sandbox, a timeout).
- ``reward/domain/<domain>``: mean valid reward per task domain.
- ``health/warnings``: the number of warnings raised so far (a dashboard can alert on its increments).

It reads what other parts already log — ``actor/entropy``, ``is/max_weight`` (PolicyModule, into
``trainer.callback_metrics``), ``rollout/response_len_mean``, ``rollout/truncation_rate``, ``reward/mean``
(RolloutCallback, ``batch.metrics``) and held-out reward points (``HeldoutEval.history``) — and warns (rank
zero, category ``RLHealthWarning``) once per episode of trouble, see ``lit_rl.callbacks._health``.

`TokensSeen` logs ``tokens_seen``: the cumulative number of trained tokens (prompt + completion, TRL's
``num_tokens``), checkpointed; the CLI adds it to every run (``lit_rl/cli/loggers.py``). `IterationLRMonitor`
is Lightning's ``LearningRateMonitor`` logging at the step of the iteration the rate trains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_warn

from lit_rl.callbacks._health import (
    HealthChecks,
    HealthEvent,
    LengthBlowupCheck,
    RewardHackingCheck,
    ThresholdCheck,
)
from lit_rl.callbacks._learner import bound_rollout, rl_iteration
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners.binding import Evaluator
from lit_rl.learners.policy import PolicyModule


class RLHealthWarning(UserWarning):
    """A training-health warning from ``RLHealthMonitor`` (filter it with ``warnings.filterwarnings``)."""


def experience_health_metrics(exp: Experience, zero_adv_eps: float = 1e-8) -> dict[str, float]:
    """Zero-advantage / zero-variance fractions, invalid-reward fraction and reward per domain of one step.

    Shapes: ``exp.advantages`` and ``exp.loss_mask`` (B, C); ``exp.rewards``, ``exp.valid``,
    ``exp.group_ids`` (B,); ``exp.domains`` B strings (may be empty: no per-domain metrics then).

    A row is zero-advantage when ``max_t |A[b, t]| <= zero_adv_eps`` over its generated tokens (a row
    with no generated token counts as zero-advantage: it contributes no gradient either). The tolerance
    absorbs the rounding of ``r − mean(r)`` in a group of identical rewards.
    """
    B = exp.batch_size
    out: dict[str, float] = {"health/invalid_frac": 1.0 - float(exp.valid.double().mean()) if B else 0.0}
    if exp.advantages is not None:
        adv = exp.advantages.abs().masked_fill(~exp.loss_mask, 0.0)  # (B, C): padding never counts
        out["health/zero_adv_frac"] = float((adv.amax(-1) <= zero_adv_eps).float().mean()) if B else 0.0
    groups = torch.unique(exp.group_ids)
    flat = 0
    for g in groups.tolist():
        rows = (exp.group_ids == g) & exp.valid
        r = exp.rewards[rows]
        flat += int(len(r) < 2 or bool(r.max() == r.min()))
    out["health/zero_var_group_frac"] = flat / max(len(groups), 1)
    if exp.domains:
        if len(exp.domains) != B:
            raise ValueError(f"Experience has {len(exp.domains)} domains for {B} rows")
        for d in sorted(set(exp.domains)):
            rows = torch.tensor([x == d for x in exp.domains], device=exp.valid.device) & exp.valid
            if rows.any():
                out[f"reward/domain/{d}"] = float(exp.rewards[rows].mean())
    return out


def _heldout_eval(pl_module: pl.LightningModule) -> Evaluator | None:
    """The evaluator of the learner's rollout binding (the HeldoutEval callback, or the RolloutCallback's
    default); None without a binding."""
    rc = bound_rollout(pl_module)
    return rc.evaluator if rc is not None else None


class RLHealthMonitor(L.Callback):
    """Log RL health metrics every iteration and warn once per episode of trouble.

    Args:
        entropy_min: warn when ``actor/entropy`` (nats/token) falls below this (entropy collapse: the policy
            stops exploring). None disables.
        entropy_max: warn when it rises above this (entropy explosion: sampling turns to noise). None means
            ``0.9 · ln(vocab_size)`` of the policy model, resolved at setup; ``inf`` disables.
        length_factor / length_warmup / length_decay: warn when ``rollout/response_len_mean`` exceeds
            ``length_factor`` × its EMA baseline (decay ``length_decay``), after ``length_warmup`` steps.
        max_truncation_rate: warn when ``rollout/truncation_rate`` exceeds this (None disables).
        max_is_weight: warn when ``is/max_weight`` exceeds this (importance-weight spike; one weight of
            ~1,400 in a batch is enough to wreck a run). None disables.
        max_zero_adv_frac: warn when ``health/zero_adv_frac`` exceeds this (None, the default, disables:
            high values are normal once a task is mastered).
        hacking_window / hacking_heldout_window / hacking_min_rise / hacking_min_drop: the
            reward-hacking check (see ``RewardHackingCheck``); needs a ``HeldoutEval`` callback.
        zero_adv_eps: tolerance of the zero-advantage test.
    """

    def __init__(
        self,
        entropy_min: float | None = 0.01,
        entropy_max: float | None = None,
        length_factor: float = 2.0,
        length_warmup: int = 5,
        length_decay: float = 0.9,
        max_truncation_rate: float | None = 0.5,
        max_is_weight: float | None = 100.0,
        max_zero_adv_frac: float | None = None,
        hacking_window: int = 20,
        hacking_heldout_window: int = 3,
        hacking_min_rise: float = 0.05,
        hacking_min_drop: float = 0.05,
        zero_adv_eps: float = 1e-8,
    ):
        for name, v in (
            ("max_truncation_rate", max_truncation_rate),
            ("max_zero_adv_frac", max_zero_adv_frac),
        ):
            if v is not None and not 0.0 <= v < 1.0:
                raise ValueError(f"{name} must be in [0, 1) or None, got {v}")
        if max_is_weight is not None and max_is_weight <= 1.0:
            raise ValueError(
                f"max_is_weight must be > 1 (weights of exactly on-policy rows are 1), got {max_is_weight}"
            )
        if zero_adv_eps < 0:
            raise ValueError(f"zero_adv_eps must be >= 0, got {zero_adv_eps}")
        self.entropy_max, self.zero_adv_eps = entropy_max, zero_adv_eps
        checks: dict[str, Any] = {
            # high=inf is a placeholder until setup knows the vocabulary (never fires)
            "entropy": ThresholdCheck(
                "entropy",
                "actor/entropy",
                low=entropy_min,
                high=math.inf if entropy_max is None else entropy_max,
                what="policy entropy",
            ),
            "length": LengthBlowupCheck(length_factor, length_warmup, length_decay),
            "reward_hacking": RewardHackingCheck(
                hacking_window, hacking_heldout_window, hacking_min_rise, hacking_min_drop
            ),
        }
        if max_truncation_rate is not None:
            checks["truncation"] = ThresholdCheck(
                "truncation",
                "rollout/truncation_rate",
                high=max_truncation_rate,
                what="truncation rate (completions hitting max_new_tokens)",
            )
        if max_is_weight is not None:
            checks["is_weight"] = ThresholdCheck(
                "is_weight", "is/max_weight", high=max_is_weight, what="max importance weight"
            )
        if max_zero_adv_frac is not None:
            checks["zero_adv"] = ThresholdCheck(
                "zero_adv", "health/zero_adv_frac", high=max_zero_adv_frac, what="zero-advantage row fraction"
            )
        self.checks = HealthChecks(checks)
        self._heldout_seen = 0  # HeldoutEval.history entries already fed to the reward-hacking check

    @property
    def events(self) -> list[HealthEvent]:
        return self.checks.events

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.entropy_max is None:
            # a lit_rl learner's Hugging Face model; another LightningModule keeps the default threshold
            vocab = pl_module.model.config.vocab_size if isinstance(pl_module, PolicyModule) else None
            if vocab:
                self.checks.checks["entropy"].high = 0.9 * math.log(vocab)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        step = rl_iteration(trainer, pl_module)
        metrics = self._gather(trainer, batch)
        ev = _heldout_eval(pl_module)
        if ev is not None:
            for h in ev.history[self._heldout_seen :]:
                self.checks.checks["reward_hacking"].add_heldout(h.get("eval/reward_mean", math.nan))
            self._heldout_seen = len(ev.history)
        for e in self.checks.update(step, metrics):
            rank_zero_warn(e.message, category=RLHealthWarning)
        own = {k: v for k, v in metrics.items() if k.startswith(("health/", "reward/domain/"))}
        own["health/warnings"] = float(len(self.events))
        for k, v in own.items():
            pl_module.log(k, v, on_step=True, on_epoch=False, batch_size=1)

    def _gather(self, trainer: pl.Trainer, batch: PromptBatch) -> dict[str, float]:
        """This step's readings: logged module metrics, then rollout metrics, then the Experience's own."""
        out: dict[str, float] = {}
        for k, v in dict(trainer.callback_metrics).items():
            if (isinstance(v, torch.Tensor) and v.numel() == 1) or isinstance(v, (int, float)):
                out[k] = float(v)
        out.update({k: float(v) for k, v in batch.metrics.items() if isinstance(v, (int, float))})
        exp = batch.experience
        if exp is not None:
            out.update(experience_health_metrics(exp, self.zero_adv_eps))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"checks": self.checks.state_dict(), "heldout_seen": self._heldout_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.checks.load_state_dict(state["checks"])
        self._heldout_seen = int(state["heldout_seen"])


class TokensSeen(L.Callback):
    """Log ``tokens_seen``: prompt + completion tokens of every Experience trained on so far, summed over ranks
    (TRL's ``num_tokens``). Padding is not counted (``Experience.attention_mask``); rows that did not train
    (failed rewards, filtered) are counted, as TRL counts every generated row. Async Experiences dropped for
    staleness never reach a training batch and are not counted. The count is checkpointed, so a resumed run
    continues it. Logged as a float64 tensor: a float32 one is exact only up to 2**24 (16.7M) tokens.
    """

    def __init__(self) -> None:
        self.total = 0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        exp = batch.experience
        if exp is None:
            return
        n = exp.attention_mask.sum().to(torch.float64).reshape(1)
        if trainer.world_size > 1:  # every rank trains its own rows: the run's count is the sum
            n = trainer.strategy.reduce(n.to(pl_module.device), reduce_op="sum")
        self.total += int(n.item())
        # every rank holds the same total, so no sync_dist (which would average it with itself)
        pl_module.log(
            "tokens_seen",
            torch.tensor(float(self.total), dtype=torch.float64),
            on_step=True,
            on_epoch=False,
            batch_size=1,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.total = int(state["total"])


class IterationLRMonitor(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor``, logging the learning rate that iteration ``i`` trains with at step
    ``i``, the step every other metric of that iteration has (docs/architecture.md "CLI and runs"). The stock
    monitor logs it at the count of optimizer steps taken *before* the iteration (``i - 1``), so its rows were
    one step off and a resumed run wrote the boundary step twice."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if not trainer._logger_connector.should_update_logs or self.logging_interval == "epoch":
            return
        stats = self._extract_stats(trainer, "step" if self.logging_interval is None else "any")
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        for logger in trainer.loggers if stats else ():
            logger.log_metrics(stats, step=step)
