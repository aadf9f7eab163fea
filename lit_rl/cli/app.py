"""`lit-rl`: LightningCLI entry point (``lit-rl fit --config configs/quickstart.yaml``).

What it adds to LightningCLI (see docs/guides/runs.md "Runs"):

- ``rollout``: the ``RolloutCallback`` as a first-class section (``--rollout.group_size 8``). A recipe that
  still lists ``lit_rl.callbacks.RolloutCallback`` under ``trainer.callbacks`` has it moved here.
- ``checkpoint``: an ``IterationCheckpoint`` into ``<run dir>/checkpoints`` (``--checkpoint.every_n_iterations``),
  unless ``trainer.enable_checkpointing`` is false or the callbacks already hold a ``ModelCheckpoint``.
- One run directory (``trainer.default_root_dir``): CSV + TensorBoard loggers (kept beside ``--trainer.logger``'s
  own, ``lit_rl/cli/loggers.py``) and ``config.yaml`` there; every run logs ``lr-AdamW`` and ``tokens_seen``.
- ``--ckpt_path last`` is an error when there is nothing to resume; ``last_or_new`` starts fresh then.
- Configuration errors print one line (``lit-rl: error: ...``); ``LIT_RL_TRACEBACK=1`` shows the traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from lit_rl.cli import quiet

quiet.install()  # before Lightning / transformers log anything

from jsonargparse import ActionYesNo, Namespace, set_parsing_settings  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback  # noqa: E402

from lit_rl.errors import ConfigError  # noqa: E402
from lit_rl.runs import (  # noqa: E402
    CHECKPOINT_SUBDIR,
    IterationCheckpoint,
    NothingToResume,
    checkpoint_log_step,
    resolve_ckpt_path,
)

ROLLOUT = "lit_rl.callbacks.RolloutCallback"
# Lightning's Trainer logs every 50 steps: an RL iteration is one step and takes seconds to minutes, so a short
# run would write no logs/metrics.csv at all. Every recipe writes 1; a config that does not gets it too.
TRAINER_DEFAULTS = {"log_every_n_steps": 1}
_ROLLOUT_PATHS = {ROLLOUT, "lit_rl.callbacks.rollout.RolloutCallback"}


def _patch_jsonargparse_serialization() -> None:
    """jsonargparse serializes a ``Callable | list[Callable] | dict[str, Callable]`` value by trying
    ``Callable`` first, whose serializer never fails: it turns a whole list or dict of reward specs into the
    string "Unable to serialize instance ...", so ``--print_config`` and the saved config.yaml could not be
    re-run. A list or dict is never an import path: raising lets the union try its list / dict members."""
    import jsonargparse._typehints as th

    original = th.serialize_as_import_path
    if getattr(original, "_lit_rl", False):
        return

    def serialize(val):
        if isinstance(val, (list, tuple, dict, Namespace)):
            raise ValueError(f"a {type(val).__name__} is not an import path")
        return original(val)

    setattr(serialize, "_lit_rl", True)  # noqa: B010 - marks the patch (a function attribute mypy cannot see)
    th.serialize_as_import_path = serialize


_patch_jsonargparse_serialization()
# omegaconf+ resolves ${...} interpolations on the final, merged config (after every -c file and flag), so
# ``model: ${trainer.default_root_dir}/model`` follows --trainer.default_root_dir. Recipes write absolute
# interpolation paths; this setting makes them work inside a subcommand's config.
set_parsing_settings(omegaconf_absolute_to_relative_paths=True)


class RunConfig(SaveConfigCallback):
    """Writes the parsed config to ``<run dir>/config.yaml`` (not into a logger's version folder); other
    subcommands write ``<run dir>/<subcommand>/config.yaml``."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            root = Path(trainer.default_root_dir)
            if stage != "fit":  # `lit-rl validate` on a run directory keeps the run's own config.yaml
                root = root / stage
            root.mkdir(parents=True, exist_ok=True)
            self.parser.save(
                self.config,
                str(root / self.config_filename),
                skip_none=False,
                overwrite=True,
                multifile=self.multifile,
            )
            self.already_saved = True


CKPT_PATH_HELP = {
    True: (
        "Resume a run: 'last' = <run dir>/checkpoints/last.ckpt (an error when there is none, never a silent "
        "fresh start); 'last_or_new' = that checkpoint, or a fresh run when there is none; or the path of a "
        ".ckpt file. Unset: a fresh run (refused when the run directory already holds one)."
    ),
    False: (
        "The checkpoint to evaluate: 'last' = <run dir>/checkpoints/last.ckpt (an error when there is none); "
        "'last_or_new' = that checkpoint, or the config's model as it is; or the path of a .ckpt file."
    ),
}


class LitRLParser(LightningArgumentParser):
    """Parse errors on one line (``lit-rl: error: Parser key "model.init_args.loss_agg": Expected ...``)."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("LIT_RL_TRACEBACK"):
            return super().error(message, ex)
        from lit_rl.cli.errors import pointed_parse_error

        print(f"lit-rl: error: {pointed_parse_error(self, message, _ARGV)}", file=sys.stderr)
        sys.exit(2)


# The arguments being parsed (sys.argv's or main(args=...)'s): an unknown key's error names the -c file and line.
_ARGV: list[str] = []


class LitRLCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        from lit_rl.callbacks.rollout import RolloutCallback
        from lit_rl.cli.loggers import RUN_LOGGERS_HELP

        parser.add_argument("--run_loggers", type=bool, default=True, help=RUN_LOGGERS_HELP)
        parser.add_argument(
            "--imports",
            type=list[str],
            default=[],
            help="Modules to import before the config is checked, e.g. the one registering your "
            "own advantage or policy loss (@ADVANTAGES.register('mine')): --imports '[my_pkg.rl]'",
        )

        # Not instantiated by jsonargparse: instantiate_trainer builds it (or drops it when a RolloutCallback
        # subclass is configured under trainer.callbacks instead).
        parser.add_class_arguments(
            RolloutCallback, "rollout", fail_untyped=False, instantiate=False, sub_configs=True
        )
        parser.add_class_arguments(
            IterationCheckpoint, "checkpoint", fail_untyped=False, instantiate=False, sub_configs=True
        )

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "fit":  # validate / test have Lightning's own --verbose (print the results)
            parser.add_argument("--verbose", action=ActionYesNo, default=False, help=quiet.VERBOSE_HELP)
        for (
            action
        ) in parser._actions:  # Lightning's stock text names "hpc" / "registry", which mean nothing here
            if action.dest == "ckpt_path":
                action.help = CKPT_PATH_HELP[subcommand == "fit"]
        return parser

    def parse_arguments(self, parser, args) -> None:
        """As LightningCLI's, without its warning about ``args`` beside ``sys.argv``: ``main(args=[...])`` is the
        programmatic entry point, and the caller's own command line (pytest's, a notebook's) is unrelated."""
        _ARGV[:] = (
            [str(a) for a in (sys.argv[1:] if args is None else args)]
            if isinstance(args, (list, type(None)))
            else []
        )
        from lit_rl.cli.errors import flow_mapping_message

        squashed = flow_mapping_message(
            _ARGV
        )  # `{acc:1.0}` parses, as a key with no value: fail at the cause
        if squashed:
            parser.error(squashed)
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """Off: ``-c`` says what the model is; Lightning re-read a .ckpt file's hparams and refused every module."""

    # ------------------------------------------------------------ before instantiation
    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        quiet.set_verbose(self.subcommand == "fit" and cfg.get("verbose"))  # before models, engines, data
        for module in cfg.get("imports") or []:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"imports: cannot import {module!r}: {e}") from e
        self._move_rollout_callback(cfg)
        if self._rollout_enabled:
            self._check_rollout_first(cfg)
            from lit_rl.cli import run_settings

            run_settings.check(
                cfg
            )  # max_steps, accumulate_grad_batches, a top-level optimizer (issues 36, 38)
        _one_prompt_source(cfg)
        trainer = cfg.trainer
        root = trainer.default_root_dir or os.getcwd()
        trainer.default_root_dir = root
        self._ckpt_dir = Path(_checkpoint_dir(cfg, root))
        self._resolved_ckpt, self._resume_step = None, None
        if "ckpt_path" in cfg:
            try:
                self._resolved_ckpt = resolve_ckpt_path(cfg.ckpt_path, self._ckpt_dir)
                if self._resolved_ckpt is not None and self.subcommand == "fit":
                    self._resume_step = checkpoint_log_step(self._resolved_ckpt)  # refuses a weights-only one
            except NothingToResume as e:
                raise ConfigError(str(e)) from None
        if (
            self.subcommand == "fit"
            and self._resolved_ckpt is None
            and (self._ckpt_dir / "last.ckpt").exists()
            and self._uses_own_checkpoint(cfg)
        ):
            raise ConfigError(
                f"run directory {root} already holds a run ({self._ckpt_dir / 'last.ckpt'}): resume it with "
                "--ckpt_path last, or start a new run with another --trainer.default_root_dir"
            )

    def _move_rollout_callback(self, cfg) -> None:
        """A ``RolloutCallback`` listed under ``trainer.callbacks`` becomes the ``rollout`` section (its values
        fill what the section leaves at defaults, so ``--rollout.group_size`` still wins); a subclass stays."""
        cbs = cfg.trainer.callbacks or []
        self._rollout_index, self._rollout_enabled = 0, True
        defaults = self._parser(self.subcommand).get_defaults().get("rollout")
        for i, cb in enumerate(list(cbs)):
            path = cb.get("class_path") if isinstance(cb, (dict, Namespace)) else None
            if path in _ROLLOUT_PATHS:
                for k, v in (cb.get("init_args") or Namespace()).items():
                    if cfg.rollout.get(k) == defaults.get(k):
                        cfg.rollout[k] = v
                cbs.pop(i)
                self._rollout_index = i
                return
            if path and path.rsplit(".", 1)[-1].endswith(
                "RolloutCallback"
            ):  # a subclass (AgentRolloutCallback)
                self._rollout_enabled = False
                return

    def _check_rollout_first(self, cfg) -> None:
        """Settings that need no model, checked before anything is built or written (the quickstart's model
        builder writes <run dir>/model when the model is instantiated)."""
        from lit_rl.core.advantages import check_group_size

        model = cfg.get("model")
        init = model.get("init_args") if isinstance(model, Namespace) else None
        init = init if isinstance(init, Namespace) else Namespace()
        try:
            check_group_size(init.get("advantage"), cfg.rollout.get("group_size"), init.get("rl_coef"))
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _uses_own_checkpoint(self, cfg) -> bool:
        return cfg.trainer.enable_checkpointing is not False and not _configured_checkpoints(cfg)

    # ------------------------------------------------------------ instantiation
    def instantiate_classes(self) -> None:
        try:
            self._check_data_first()
            super().instantiate_classes()
        except ConfigError:
            raise
        except (ValueError, TypeError, FileNotFoundError, ImportError, OSError) as e:
            from lit_rl.cli.errors import union_error_message

            line = _one_line(e)
            if line.startswith(
                "Expected a <class"
            ):  # the union's first member's complaint: find the real one
                union = union_error_message(
                    e, self.config
                )  # trainer.strategy=...: DeepSpeed is not installed
                hint = _strategy_hint(union) if union else None
                line = f"{union} {hint.removeprefix('lit_rl: ')}" if hint else union or line
            raise ConfigError(line) from e

    def _check_data_first(self) -> None:
        """jsonargparse builds the model (loading its weights) before the datamodule; a PromptDataModule reads
        and checks every record when built, so build one here first: a bad record fails in seconds."""
        from lit_rl.data.datamodule import PromptDataModule

        cfg = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        data = cfg.get("data")
        if not isinstance(data, Namespace) or not data.get("class_path"):
            return
        module, _, name = data.class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type) and issubclass(cls, PromptDataModule):
            cls(**_plain(data.get("init_args")))

    def instantiate_trainer(self, **kwargs):
        from lit_rl.checkpoint import use_atomic_checkpoint_io

        try:
            trainer = super().instantiate_trainer(**kwargs)
        except Exception as e:  # Lightning's own refusal, plus the alternative that runs here
            hint = _strategy_hint(str(e))
            if hint is None:
                raise
            raise type(e)(f"{e}\n{hint}") from e
        use_atomic_checkpoint_io(trainer)  # a kill mid-save must leave the previous checkpoint loadable
        return trainer

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        sub = (
            self.config_init.get(str(self.subcommand), self.config_init)
            if self.subcommand
            else self.config_init
        )
        cbs = list(config.get("callbacks") or [])
        if self._rollout_enabled:
            cbs.insert(min(self._rollout_index, len(cbs)), _build_rollout(sub.rollout))
        has_ckpt = any(type(c).__name__.endswith("Checkpoint") or hasattr(c, "last_model_path") for c in cbs)
        if config.get("enable_checkpointing", True) is not False and not has_ckpt:
            cbs.append(IterationCheckpoint(**_plain(sub.checkpoint)))
        if config.get("enable_progress_bar", True) is False:  # the flag wins over a recipe's bar
            cbs = [c for c in cbs if not _is_progress_bar(c)]
        elif not any(_is_progress_bar(c) for c in cbs):
            from lit_rl.callbacks.progress import IterationProgressBar

            cbs.append(IterationProgressBar())
        from lit_rl.cli.loggers import monitoring_callbacks, run_loggers

        config["logger"] = run_loggers(
            config.get("logger"),
            config["default_root_dir"],
            str(self.subcommand),
            self._resume_step,
            keep=sub.get("run_loggers", True) is not False,
        )
        config["callbacks"] = monitoring_callbacks(_later_wins(cbs), has_logger=bool(config["logger"]))
        return super()._instantiate_trainer(config, callbacks)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "ckpt_path" in kwargs:
            kwargs["ckpt_path"] = self._resolved_ckpt
        return kwargs


def _one_prompt_source(cfg) -> None:
    """Prompt files or a dataset replace the recipe's built-in ``task`` (PromptDataModule ignores it then): the
    config says so, so the saved config.yaml names one source of prompts, not ``task: addition`` beside them."""
    data = cfg.get("data")
    init = data.get("init_args") if isinstance(data, Namespace) else None
    if isinstance(init, Namespace) and (init.get("train_files") or init.get("dataset")) and init.get("task"):
        init.task = None
        if "task_args" in init:
            init.task_args = {}


def _checkpoint_dir(cfg, root: str) -> str:
    """Where ``--ckpt_path last`` looks: a configured ModelCheckpoint's dirpath, the ``checkpoint`` section's,
    else ``<run dir>/checkpoints``."""
    for cb in _configured_checkpoints(cfg):
        d = (cb.get("init_args") or Namespace()).get("dirpath")
        if d:
            return str(Path(root) / d) if not Path(d).is_absolute() else d
    d = cfg.get("checkpoint", Namespace()).get("dirpath") if cfg.get("checkpoint") else None
    return str(Path(root) / (d or CHECKPOINT_SUBDIR)) if not (d and Path(d).is_absolute()) else d


def _configured_checkpoints(cfg) -> list:
    out = []
    for cb in cfg.trainer.callbacks or []:
        path = cb.get("class_path", "") if isinstance(cb, (dict, Namespace)) else ""
        if path.endswith(("ModelCheckpoint", "IterationCheckpoint")):
            out.append(cb)
    return out


def _plain(ns) -> dict[str, Any]:
    return dict(vars(ns)) if isinstance(ns, Namespace) else dict(ns or {})


def _build_rollout(ns):
    from lit_rl.callbacks.rollout import RolloutCallback
    from lit_rl.rollout.engine import SamplingConfig

    kw = _plain(ns)
    if isinstance(kw.get("sampling"), (Namespace, dict)):
        kw["sampling"] = SamplingConfig(**_plain(kw["sampling"]))
    if kw.get("rewards") is None:
        raise ConfigError(
            "rollout.rewards is required: a RewardPool or reward function(s), e.g. "
            "--rollout.rewards lit_rl.rewards.ExactAnswerReward (see configs/quickstart.yaml)"
        )
    try:
        return RolloutCallback(**kw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"rollout: {_one_line(e)}") from e


def _later_wins(cbs: list) -> list:
    """Of callbacks with the same Lightning ``state_key`` (two ``HeldoutEval`` from a recipe and a fragment),
    keep the later one, at the earlier one's position: Lightning refuses duplicates, and a fragment added
    with ``-c`` is meant to override the recipe."""
    out: list = []
    for cb in cbs:
        key = getattr(cb, "state_key", None)
        same = next(
            (i for i, c in enumerate(out) if key is not None and getattr(c, "state_key", None) == key), None
        )
        if same is None:
            out.append(cb)
        else:
            out[same] = cb
    return out


def _is_progress_bar(cb) -> bool:
    from lightning.pytorch.callbacks import ProgressBar

    return isinstance(cb, ProgressBar)


def _one_line(e: BaseException) -> str:
    """The innermost message of a (chained) exception, on one line (bad data records: one line each)."""
    from lit_rl.data.prompts import DataError

    while e.__cause__ is not None and str(e.__cause__):
        e = e.__cause__
    if isinstance(e, DataError):  # one line per bad record, each starting with file:line
        return str(e)
    msg = " ".join(str(e).split())
    return msg or type(e).__name__


def _strategy_hint(message: str) -> str | None:
    low = message.lower()
    if "fsdp" in low and ("gpu" in low or "cuda" in low):
        return (
            "lit_rl: on CPU use FSDP2 through ModelParallelStrategy instead: "
            "-c configs/strategies/fsdp.yaml (or configs/strategies/ddp.yaml for plain data parallel)."
        )
    if "deepspeed" in low:
        return (
            "lit_rl: DeepSpeed is the optional `deepspeed` extra (pip install -e .[deepspeed]); with it "
            "-c configs/strategies/deepspeed_zero2.yaml / deepspeed_zero3.yaml (lit_rl.strategies."
            "DeepSpeedZeROStrategy) run on CPU and GPU. Without it: configs/strategies/fsdp.yaml or ddp.yaml."
        )
    return None


def main(args: list[str] | None = None) -> LitRLCLI:
    """Run the CLI; returns the LightningCLI object (its ``trainer`` and ``model``) for programmatic use."""
    import lightning as L

    from lit_rl.cli.packaged import resolve_configs
    from lit_rl.cli.precheck import check

    if isinstance(args, list):  # -c callbacks/trl_defaults.yaml outside a clone: the shipped fragment
        args = resolve_configs(args)
    early = (
        check(list(sys.argv[1:] if args is None else args)) if isinstance(args, (list, type(None))) else None
    )
    if early is not None:  # the console script found it before importing Lightning; the same text here
        raise ConfigError(early)

    return LitRLCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_class=LitRLParser,
        parser_kwargs={"parser_mode": "omegaconf+"},
        save_config_callback=RunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
    )
