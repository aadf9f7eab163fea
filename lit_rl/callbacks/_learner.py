"""Typed reads of the learner and its rollout binding from a callback hook (no attribute probes).

Lightning hands every hook a ``pl.LightningModule``; lit_rl's callbacks narrow it with ``isinstance`` to the
learner they were written for (``PolicyModule``), so what they read is declared, checked by mypy and fails with
a message naming the expected class rather than an ``AttributeError`` deep inside a hook.
"""

from __future__ import annotations

from typing import TypeVar

import lightning.pytorch as pl

from lit_rl.data.datamodule import PromptDataModule
from lit_rl.learners.binding import RolloutBinding, RolloutBound
from lit_rl.learners.policy import PolicyModule

T = TypeVar("T")


def learner(pl_module: pl.LightningModule, who: str) -> PolicyModule:
    """``pl_module`` as the lit_rl learner ``who`` (a callback's name) needs."""
    if not isinstance(pl_module, PolicyModule):
        raise TypeError(
            f"{who} works with a lit_rl learner (PolicyModule or a subclass), got {type(pl_module).__name__}"
        )
    return pl_module


def rl_iteration(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    """The RL iteration of a lit_rl learner; for another LightningModule, the trainer's global step."""
    return pl_module.iteration if isinstance(pl_module, PolicyModule) else trainer.global_step


def bound_rollout(pl_module: pl.LightningModule | None) -> RolloutBinding | None:
    """The learner's rollout binding (``learners/binding.py``); None without one (another module, no
    RolloutCallback, or before its setup)."""
    return pl_module.bound_rollout if isinstance(pl_module, RolloutBound) else None


def datamodule_of(trainer: pl.Trainer) -> pl.LightningDataModule | None:
    """``trainer.datamodule``, typed."""
    # A probe of a foreign attribute: Lightning assigns ``trainer.datamodule`` from its data connector, outside
    # the Trainer class, so its type declares no such attribute (and a bare trainer in a test has none).
    return getattr(trainer, "datamodule", None)


def prompt_data(trainer: pl.Trainer) -> PromptDataModule | None:
    """The run's ``PromptDataModule``; None without one (no datamodule, or a user's own)."""
    dm = datamodule_of(trainer)
    return dm if isinstance(dm, PromptDataModule) else None


def one_callback(trainer: pl.Trainer, cls: type[T], name: str) -> T | None:
    """The trainer's one callback of type ``cls``; None when it has none, an error when it has several."""
    # Lightning assigns ``trainer.callbacks`` from its callback connector: undeclared on the class, as above.
    callbacks: list[pl.Callback] = getattr(trainer, "callbacks", [])
    found = [cb for cb in callbacks if isinstance(cb, cls)]
    if len(found) > 1:
        raise ValueError(
            f"trainer.callbacks has {len(found)} {name} callbacks; the rollout binds one to the learner"
        )
    return found[0] if found else None
