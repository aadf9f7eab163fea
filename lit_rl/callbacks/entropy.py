"""`EntropyRegularization`: an entropy bonus, fixed or kept inside a target band.

RL on language models tends to collapse the policy's entropy (exploration dies, the reward curve
plateaus) or, with a too-strong bonus, to blow it up (gibberish). A fixed bonus −α·H is the classic
remedy (PPO, arXiv 1707.06347, eq. 9); the adaptive mode moves α once per RL iteration so the mean
token entropy stays in [low, high] (``core.controllers.adaptive_entropy_update``).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch

from lit_rl.callbacks._rank_sums import global_sums
from lit_rl.core.controllers import AdaptiveEntropyController, FixedController
from lit_rl.core.logprobs import entropy_from_logits
from lit_rl.learners.protocols import LossTerm


class EntropyRegularization(L.Callback, LossTerm):
    """Entropy bonus as a LossTerm (docs/architecture.md "Contracts").

    Adds ``{"entropy": −α · agg(H_t)}`` to every micro-batch.

    Args:
        coef: α (the initial α in adaptive mode). 0 with no band logs the entropy and adds nothing.
        band: ``[low, high]`` target range of the mean token entropy (nats); None = fixed α.
        step: how much α moves per iteration when the entropy is outside the band.
        coef_min, coef_max: bounds of α in adaptive mode (a negative ``coef_min`` allows an entropy penalty).

    H_t = H(π_θ(·|s_t)) is the entropy of the model's full softmax(logits / the module's temperature) over the
    whole vocabulary at each generated position s_t of the rollouts, aggregated with the module's ``loss_agg``:
    with top-k / top-p / min-p / a repetition penalty it is not the entropy of the truncated sampler π^s over its
    kept set (the model's uncertainty, docs/architecture.md "Truncated sampling"). A function of the state, so
    −α·agg(H_t) differentiated directly is its exact gradient whatever the sampler (float64 enumeration,
    tests/callbacks/test_reference_kl_truncated.py). Metrics per iteration: ``entropy/mean``
    (mean over loss-mask tokens of all micro-batches of the update) and ``entropy/coef`` (α used).
    """

    def __init__(
        self,
        coef: float = 0.001,
        band: tuple[float, float] | None = None,
        step: float = 0.0005,
        coef_min: float = 0.0,
        coef_max: float = 0.01,
    ):
        if not math.isfinite(coef):
            raise ValueError(f"coef must be finite, got {coef}")
        if band is None:
            self.controller = FixedController(coef)
        else:
            if len(band) != 2 or not all(math.isfinite(b) for b in band) or band[0] > band[1]:
                raise ValueError(f"band must be [low, high] with finite low <= high, got {band!r}")
            if not (math.isfinite(step) and step >= 0):
                raise ValueError(f"step must be a finite number >= 0, got {step}")
            if not coef_min <= coef <= coef_max:  # also rejects NaN bounds
                raise ValueError(f"coef={coef} must lie in [coef_min, coef_max] = [{coef_min}, {coef_max}]")
            self.controller = AdaptiveEntropyController(
                coef, float(band[0]), float(band[1]), step, coef_min, coef_max
            )
        self.adaptive = band is not None
        self._sum, self._count, self._rows = 0.0, 0, 0

    @property
    def coef(self) -> float:
        return self.controller.value

    def loss_terms(self, module, micro, fwd: dict[str, Any]) -> dict[str, torch.Tensor]:
        mask = fwd["mask"]
        ent = fwd.get("entropy")  # (b, C) from the module's chunked pass through the LM head (differentiable)
        if ent is None:  # materialised path: from the logits
            chunk = module.config.forward.logprob_chunk_size
            # the rollout binding's sampler temperature (learners/binding.py)
            temperature = module.temperature
            logits = fwd["logits"] if self.coef != 0.0 else fwd["logits"].detach()
            ent = entropy_from_logits(logits, chunk, temperature)  # (b, C)
        self._accumulate(ent.detach(), mask, micro.batch_size)
        if self.coef == 0.0:  # nothing to differentiate: measure only
            return {"entropy": torch.zeros((), device=ent.device)}
        return {"entropy": -self.coef * module.aggregate(ent, mask, fwd)}

    def _accumulate(self, ent: torch.Tensor, mask: torch.Tensor, rows: int) -> None:
        self._sum += float(ent[mask].double().sum())
        self._count += int(mask.sum())
        self._rows += rows

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the iteration's mean entropy and the α used, then (adaptive) move α for the next one.

        Entropy sum and token count are summed over ranks (``_rank_sums.global_sums``): ``entropy/mean`` is
        the global per-token mean and every rank holds the same α (the checkpointed one). Every rank takes
        part in the reduce, also one whose iteration had no trainable token.
        """
        local_rows = self._rows
        total, count = global_sums(trainer, pl_module, [self._sum, self._count])
        self._sum, self._count, self._rows = 0.0, 0, 0
        if count == 0:  # the same decision on every rank: the counts are global
            return
        mean = total / count
        pl_module.log("entropy/mean", mean, on_step=True, on_epoch=False, batch_size=max(local_rows, 1))
        pl_module.log("entropy/coef", self.coef, on_step=True, on_epoch=False, batch_size=max(local_rows, 1))
        self.controller.update(mean)

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
