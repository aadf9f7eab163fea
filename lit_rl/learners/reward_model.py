"""`RewardModelModule`: a Bradley-Terry reward model (RLHF, InstructGPT arXiv 2203.02155).

A causal-LM backbone with a scalar head read at the last real token of ``prompt + completion``: the
``transformers`` ``AutoModelForSequenceClassification`` (``num_labels=1``) of the same architecture, so
the trained model saves and loads in plain Hugging Face format and ``RewardModelReward`` can score with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor

from lit_rl.core.preference import bradley_terry_loss
from lit_rl.core.seeds import run_seed
from lit_rl.core.settings import check_choices, flat_settings, flat_values, setting, split_settings
from lit_rl.data.preferences import PreferencePair
from lit_rl.learners.config import ModelSettings, PrecisionSettings, record_settings
from lit_rl.learners.optim_step import default_adamw
from lit_rl.models.reward_head import load_reward_model, score_texts  # moved below: rewards use them too


def _default_optimizer(params) -> torch.optim.Optimizer:
    return default_adamw(params, lr=1e-5)


@dataclass(frozen=True)
class RewardModelConfig:
    """``RewardModelModule``'s settings, built once: the model path and its two groups."""

    model: str
    load: ModelSettings
    precision: PrecisionSettings
    rm: RewardModelSettings


@dataclass(frozen=True, kw_only=True)
class RewardModelSettings:
    """The settings only ``RewardModelModule`` has (its model's are ``ModelSettings`` /
    ``PrecisionSettings``, as the policy's)."""

    margin: float = setting(
        0.0, "Constant margin m in -log sigmoid(r_c - r_r - m) (0 = plain Bradley-Terry)."
    )
    max_length: int | None = setting(
        None, "Truncate prompt + completion to this many tokens; null = no truncation."
    )
    save_dir: str | None = setting(
        None, "If set, the model and tokenizer are saved there (HF format) when training ends."
    )


@flat_settings((ModelSettings, PrecisionSettings, RewardModelSettings))
class RewardModelModule(L.LightningModule):
    """Bradley-Terry training on (prompt, chosen, rejected) pairs; settings in ``self.config``.

    Metrics: ``rm/loss``, ``rm/accuracy`` (train pairs), ``rm/val_accuracy`` and ``rm/val_loss`` (held-out).

    Args:
        model: causal LM to start from (local dir or hub id).
        optimizer: LightningCLI ``OptimizerCallable`` (default AdamW, lr 1e-5).
    """

    settings_groups: ClassVar[tuple[type, ...]]  # set by @flat_settings

    def __init__(self, model: str, *, optimizer: Callable = _default_optimizer, **settings: Any):
        super().__init__()
        settings["seed"] = run_seed(settings.get("seed"))  # None: the run's seed_everything, resolved once
        load, precision, rm = split_settings("RewardModelModule", RewardModelModule.settings_groups, settings)
        check_choices(precision)
        self.config = RewardModelConfig(model, load, precision, rm)
        record_settings(self, {"model": model, **flat_values(load, precision, rm)})
        if load.tiny_if_missing is not None and not (Path(model) / "config.json").exists():
            from lit_rl.models.tiny import ensure_tiny_model

            ensure_tiny_model(model, **{"seed": load.seed, **load.tiny_if_missing})
        torch.manual_seed(load.seed)
        self.model, self.tokenizer = load_reward_model(model, precision.dtype)
        self.optimizer_factory = optimizer

    def configure_optimizers(self):
        return self.optimizer_factory([p for p in self.parameters() if p.requires_grad])

    def rewards(self, prompts: list[str], completions: list[str]) -> Tensor:
        return score_texts(
            self.model,
            self.tokenizer,
            [p + c for p, c in zip(prompts, completions)],
            self.config.rm.max_length,
        )

    def _pair_loss(self, batch: list[PreferencePair]) -> tuple[Tensor, dict[str, float]]:
        prompts = [p.prompt for p in batch]
        # one forward for both sides: rows [0, P) chosen, [P, 2P) rejected
        r = self.rewards(prompts * 2, [p.chosen for p in batch] + [p.rejected for p in batch])  # (2P,)
        n = len(batch)
        m = self.config.rm.margin
        margin = None if not m else torch.full((n,), float(m), device=r.device)
        return bradley_terry_loss(r[:n], r[n:], margin)

    def training_step(self, batch: list[PreferencePair], batch_idx: int) -> Tensor:
        loss, m = self._pair_loss(batch)
        self.log("rm/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=len(batch))
        self.log("rm/accuracy", m["accuracy"], on_step=True, on_epoch=False, batch_size=len(batch))
        return loss

    def validation_step(self, batch: list[PreferencePair], batch_idx: int) -> None:
        loss, m = self._pair_loss(batch)
        self.log("rm/val_loss", loss, on_epoch=True, batch_size=len(batch))
        self.log("rm/val_accuracy", m["accuracy"], on_epoch=True, batch_size=len(batch), prog_bar=True)

    def save_hf(self, path: str) -> None:
        """Save model + tokenizer in Hugging Face format (``AutoModelForSequenceClassification`` loads it)."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def on_train_end(self) -> None:
        if self.config.rm.save_dir and self.trainer.is_global_zero:
            self.save_hf(self.config.rm.save_dir)
