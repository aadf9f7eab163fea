"""Run-level settings refused before anything is built (issues 36 and 38), each with one line naming the
replacement. Called from ``LitRLCLI.before_instantiate_classes`` on the parsed config of a subcommand.

- ``trainer.max_steps`` that is not a whole number of RL iterations (``lit_rl.core.steps``).
- ``trainer.accumulate_grad_batches`` (TRL's ``gradient_accumulation_steps``): lit_rl steps its optimizer
  itself (manual optimization), so Lightning would raise mid-setup with a traceback; lit_rl accumulates over
  ``micro_batch_size`` rows within each ``minibatch_size`` optimizer step.
- A top-level ``--optimizer`` / ``--lr_scheduler`` beside the module's own ``model.init_args.optimizer``:
  LightningCLI would silently replace the module's (the log then shows ``lr-SGD`` instead of the recipe's AdamW).
"""

from __future__ import annotations

import importlib
import inspect

from jsonargparse import Namespace

from lit_rl.core.steps import max_steps_message
from lit_rl.errors import ConfigError
from lit_rl.learners.config import StepSettings


def check(cfg) -> None:
    trainer = cfg.get("trainer") or Namespace()
    model = cfg.get("model")
    init = model.get("init_args") if isinstance(model, Namespace) else None
    init = init if isinstance(init, Namespace) else Namespace()
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate not in (None, 1):
        raise ConfigError(
            f"trainer.accumulate_grad_batches={accumulate}: lit_rl steps the optimizer itself (manual "
            "optimization), so Lightning cannot accumulate; set model.init_args.minibatch_size (rows per optimizer "
            "step, TRL's per_device_train_batch_size x gradient_accumulation_steps) and "
            "model.init_args.micro_batch_size (rows per forward/backward, accumulated within that step) instead"
        )
    module_args = _init_parameters(model)
    for key in ("optimizer", "lr_scheduler"):
        top = cfg.get(key)
        if top is not None and key in module_args:
            path = top.get("class_path") if isinstance(top, Namespace) else top
            raise ConfigError(
                f"{key}={path}: a top-level --{key} would silently replace the module's own "
                f"model.init_args.{key} (the recipe's); set --model.init_args.{key} {path} instead (its "
                f"arguments as --model.init_args.{key}.NAME)"
            )
    data = cfg.get("data")
    data_init = data.get("init_args") if isinstance(data, Namespace) else None
    batch = data_init.get("batch_size") if isinstance(data_init, Namespace) else None
    group = (cfg.get("rollout") or Namespace()).get("group_size")
    if "ppo_epochs" in module_args and isinstance(batch, int) and isinstance(group, int):
        why = max_steps_message(
            trainer.get("max_steps"),
            batch * group,
            init.get("ppo_epochs") or StepSettings.ppo_epochs,
            init.get("minibatch_size"),
        )
        if why and _fixed_steps(model):
            raise ConfigError(why)


def _module_class(model):
    path = model.get("class_path") if isinstance(model, Namespace) else None
    if not path:
        return None
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # the parser names a bad class path itself
        return None


def _init_parameters(model) -> set[str]:
    cls = _module_class(model)
    if not isinstance(cls, type):
        return set()
    names: set[str] = set()
    for klass in cls.__mro__:  # a subclass's **kwargs reach its base's arguments
        if "__init__" in vars(klass):
            names |= set(inspect.signature(vars(klass)["__init__"]).parameters)
    return names


def _fixed_steps(model) -> bool:
    """Whether the module takes ppo_epochs x minibatches optimizer steps per iteration (a DistillModule with
    teacher-data steps takes one more only when some rank has survivors: not checked)."""
    cls = _module_class(model)
    init = model.get("init_args") or Namespace()
    if cls is None or not hasattr(cls, "optimizer_steps_per_iteration"):
        return False
    from lit_rl.learners.distill import DistillModule

    if issubclass(cls, DistillModule):
        losses = init.get("losses") or {}
        return not ("sft_on_success" in losses or init.get("kd_on", "student") != "student")
    return True
