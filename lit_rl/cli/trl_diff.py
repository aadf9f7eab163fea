"""``lit-rl explain-trl -c CONFIG [-c ...] [--flags]``: one line per setting of the run that differs from what
TRL 1.16's ``GRPOTrainer`` does by default, with both values (docs/guides/coming-from-trl.md "Every GRPOConfig
argument" has every argument).

The run's configuration is resolved exactly as ``lit-rl fit`` resolves it (``fit ... --print_config``: the
configs in order, the flags, the classes' defaults), so what is compared is what would train. Nothing is
built and no model is loaded. A value the config leaves to a default (``null``) is compared and printed as the
value that default is (the module's own optimizer, Lightning's precision), not as ``None``. TRL's defaults are
written here in lit_rl's terms (``TRL_DEFAULTS``; the TRL side of each line comes from ``trl_names.TRL_ARGS``):
e.g. ``loss_type="dapo"`` is ``policy_loss: ppo_clip`` and ``loss_agg: token_mean``. With a vLLM engine, TRL
corrects the engine/trainer mismatch (``vllm_importance_sampling_correction``); ``_correction_lines`` compares
``rollout_correction`` with that.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from collections.abc import Callable
from typing import Any

import yaml

from lit_rl.cli.trl_names import README_TABLE, TRL_ARGS, TRL_VERSION, callback_setting

_OPT = "model.init_args.optimizer"
_SCHED = "model.init_args.lr_scheduler"
_M = "model.init_args."
_MISSING = object()

# Lightning's Trainer values for a null ``trainer.X`` (tests/test_trl_explain.py reads them from a Trainer).
LIGHTNING_NULL = {"trainer.precision": "32-true", "trainer.log_every_n_steps": 50}
# What a null means where it is a choice, not a default value: printed beside the None.
NULL_MEANS = {f"{_SCHED}.class_path": "no schedule: a constant learning rate"}
VLLM_ENGINES = ("lit_rl.rollout.vllm.VLLMEngine", "lit_rl.rollout.server.VLLMServerEngine")
HF_ENGINE = "lit_rl.rollout.engine.HFEngine"


def _get(cfg: Any, path: str, missing: Any = None) -> Any:
    """The value at a dotted path; ``missing`` where a level is missing (e.g. no lr_scheduler). A
    ``trainer.callbacks[Class].init_args.arg`` path reads the first such callback's argument."""
    cb = callback_setting(path)
    if cb:
        for c in _get(cfg, "trainer.callbacks") or []:
            if isinstance(c, dict) and str(c.get("class_path", "")).endswith("." + cb[0]):
                return (c.get("init_args") or {}).get(cb[1], missing)
        return missing
    for key in path.split("."):
        if not isinstance(cfg, dict) or key not in cfg:
            return missing
        cfg = cfg[key]
    return cfg


def _warmup(cfg: dict) -> Any:
    """WarmupLinearDecay's warmup (steps, or the ratio); 0 under another schedule (the schedule's own line
    says that one differs)."""
    if not str(_get(cfg, f"{_SCHED}.class_path")).endswith("WarmupLinearDecay"):
        return 0
    args = _get(cfg, f"{_SCHED}.init_args") or {}
    return args.get("warmup_steps") or args.get("warmup_ratio") or 0


def _fused(cfg: dict) -> Any:
    """Whether the optimizer step is fused: a module's own default optimizer is (``default_adamw``, filled in
    by ``effective``); a named optimizer is when its ``fused`` says so."""
    opt = _get(cfg, _OPT)
    if not isinstance(opt, dict):
        return True
    return bool((opt.get("init_args") or {}).get("fused"))


def _coef(setting: str) -> Callable[[dict], Any]:
    """A callback's coefficient; 0.0 when the run has no such callback (the term is off, as TRL's 0.0)."""
    return lambda cfg: _get(cfg, setting, 0.0)


# (what; where in the run's config, or a reader of it; the TRL arguments; their default in lit_rl's terms; a
# remark on TRL's side). The TRL text is "name=default" of each argument, from trl_names.TRL_ARGS.
TRL_DEFAULTS: list[tuple[str, str | Callable[[dict], Any], tuple[str, ...], Any, str]] = [
    ("seed_everything", "seed_everything", ("seed",), 42, ""),
    ("learning rate", f"{_OPT}.init_args.lr", ("learning_rate",), 1e-6, ""),
    ("optimizer", f"{_OPT}.class_path", ("optim",), "torch.optim.AdamW", ""),
    ("fused optimizer step", _fused, ("optim",), True, ""),
    ("weight decay", f"{_OPT}.init_args.weight_decay", ("weight_decay",), 0.0, ""),
    ("Adam betas", f"{_OPT}.init_args.betas", ("adam_beta1", "adam_beta2"), [0.9, 0.999], ""),
    ("Adam eps", f"{_OPT}.init_args.eps", ("adam_epsilon",), 1e-8, ""),
    ("lr schedule", f"{_SCHED}.class_path", ("lr_scheduler_type",), "lit_rl.learners.WarmupLinearDecay", ""),
    ("warmup", _warmup, ("warmup_steps", "warmup_ratio"), 0, ""),
    ("gradient clipping", _M + "max_grad_norm", ("max_grad_norm",), 1.0, ""),
    ("gradient checkpointing", _M + "gradient_checkpointing", ("gradient_checkpointing",), True, ""),
    ("dropout off", _M + "disable_dropout", ("disable_dropout",), False, ""),
    ("precision", "trainer.precision", ("bf16",), "bf16-mixed", "bf16 mixed precision unless fp16"),
    ("advantage", _M + "advantage", ("scale_rewards",), "grpo", "GRPO advantages"),
    ("std scaling", _M + "std_normalize", ("scale_rewards",), True, ""),
    ("std scope", _M + "std_scope", ("scale_rewards",), "group", ""),
    ("policy loss", _M + "policy_loss", ("loss_type",), "ppo_clip", ""),
    ("loss aggregation", _M + "loss_agg", ("loss_type",), "token_mean", ""),
    ("clip low", _M + "clip_low", ("epsilon",), 0.2, ""),
    ("clip high", _M + "clip_high", ("epsilon_high",), 0.2, "= epsilon"),
    ("dual clip", _M + "dual_clip", ("delta",), None, ""),
    ("passes per batch", _M + "ppo_epochs", ("num_iterations",), 1, ""),
    (
        "KL to the reference",
        _coef("trainer.callbacks[ReferenceKL].init_args.beta"),
        ("beta",),
        0.0,
        "no reference model",
    ),
    (
        "entropy bonus",
        _coef("trainer.callbacks[EntropyRegularization].init_args.coef"),
        ("entropy_coef",),
        0.0,
        "",
    ),
    (
        "prompts per rank and step",
        "data.init_args.batch_size",
        ("per_device_train_batch_size", "num_generations"),
        1,
        "8 completions: 1 prompt x 8",
    ),
    ("group size", "rollout.group_size", ("num_generations",), 8, ""),
    ("completion budget", "rollout.sampling.max_new_tokens", ("max_completion_length",), 512, ""),
    ("temperature", "rollout.sampling.temperature", ("temperature",), 1.0, ""),
    ("top_p", "rollout.sampling.top_p", ("top_p",), 1.0, ""),
    ("top_k", "rollout.sampling.top_k", ("top_k",), 0, ""),
    ("min_p", "rollout.sampling.min_p", ("min_p",), 0.0, ""),
    ("repetition penalty", "rollout.sampling.repetition_penalty", ("repetition_penalty",), 1.0, ""),
    ("truncated rows", "rollout.overlong_filter", ("mask_truncated_completions",), False, ""),
    ("rollout engine", "rollout.engine.class_path", ("use_vllm",), HF_ENGINE, ""),
    ("logging", "trainer.log_every_n_steps", ("logging_steps",), 10, ""),
    ("checkpoints", "checkpoint.every_n_iterations", ("save_steps",), 500, ""),
]


def trl_text(names: tuple[str, ...], remark: str = "") -> str:
    """``name=default, ...`` of TRL's arguments (from the one table), with a remark in parentheses."""
    text = ", ".join(f"{n}={TRL_ARGS[n].default}" for n in names)
    return f"{text} ({remark})" if remark else text


def _optimizer_of(factory: str) -> dict | None:
    """The optimizer a module builds when the config names none (``optimizer:`` is then the import path of
    the module's own factory, e.g. ``lit_rl.learners.policy._default_optimizer``), as a class_path and its
    init_args: the factory is called on one scalar parameter and the optimizer it returns is read."""
    import torch

    module, _, name = factory.rpartition(".")
    try:
        opt = getattr(importlib.import_module(module), name)([torch.nn.Parameter(torch.zeros(1))])
    except Exception:  # noqa: BLE001 - not a parameterless factory: the config's value is shown as it is
        return None
    if not isinstance(opt, torch.optim.Optimizer):
        return None
    cls = type(opt)
    short = f"torch.optim.{cls.__name__}" if getattr(torch.optim, cls.__name__, None) is cls else None
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in opt.defaults.items()}
    return {"class_path": short or f"{cls.__module__}.{cls.__qualname__}", "init_args": args}


def effective(cfg: dict) -> dict:
    """``cfg`` with the values its nulls stand for: the module's own optimizer (a factory's import path),
    Lightning's Trainer defaults, the default engine (``HFEngine``). A copy; the rest is unchanged."""
    import copy

    out = copy.deepcopy(cfg)
    init = _get(out, "model.init_args")
    if isinstance(init, dict) and isinstance(init.get("optimizer"), str):
        built = _optimizer_of(init["optimizer"])
        if built is not None:
            init["optimizer"] = built
    trainer = out.get("trainer")
    if isinstance(trainer, dict):
        for path, value in LIGHTNING_NULL.items():
            key = path.split(".", 1)[1]
            if trainer.get(key) is None:
                trainer[key] = value
    rollout = out.get("rollout")
    if isinstance(rollout, dict) and rollout.get("engine") is None:
        rollout["engine"] = {"class_path": HF_ENGINE}
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _shown(path: str, value: Any) -> str:
    if value is True and path == "seed_everything":
        return "True (a new random seed each run)"
    if value is None and path in NULL_MEANS:
        return f"None ({NULL_MEANS[path]})"
    return repr(value)


def _line(key: str, ours: Any, trl_value: Any, trl: str) -> str:
    return f"{key}: {_shown(key, ours)} here, {trl_value!r} under TRL {TRL_VERSION}'s {trl}"


def _correction_lines(cfg: dict) -> list[str]:
    """TRL corrects the engine/trainer probability mismatch when it generates with vLLM
    (``vllm_importance_sampling_correction=True``, ``vllm_importance_sampling_mode="sequence_mask"``: a sequence
    whose ratio is outside [clip_min, clip_max] = [none, 3.0] is left out of the loss), and never without it.
    lit_rl's ``rollout_correction`` is ``none`` unless set, on every engine (``mis`` + ``correction_level:
    sequence`` + ``correction_cap: 3.0`` is TRL's; its ``correction_low`` null is 1/cap, TRL's is no bound)."""
    engine = str(_get(cfg, "rollout.engine.class_path"))
    mode = _get(cfg, _M + "rollout_correction", _MISSING)
    if mode is _MISSING:  # a module without the correction (e.g. a reward model's): nothing to compare
        return []
    if engine not in VLLM_ENGINES:
        if mode in (None, "none"):
            return []
        return [
            _line(
                _M + "rollout_correction",
                mode,
                "none",
                trl_text(("use_vllm",), "TRL corrects vLLM rollouts only"),
            )
        ]
    trl = trl_text(
        ("vllm_importance_sampling_correction", "vllm_importance_sampling_mode"),
        "with vLLM, TRL leaves out of the loss each sequence whose trainer/engine probability ratio is above "
        "vllm_importance_sampling_clip_max=3.0; lit_rl: --model.init_args.rollout_correction mis "
        "--model.init_args.correction_level sequence --model.init_args.correction_cap 3.0",
    )
    if mode != "mis":
        return [_line(_M + "rollout_correction", mode, "mis", trl)]
    lines = []
    level = _get(cfg, _M + "correction_level")
    if level != "sequence":
        lines.append(
            _line(_M + "correction_level", level, "sequence", trl_text(("vllm_importance_sampling_mode",)))
        )
    cap = _get(cfg, _M + "correction_cap")
    if not _same(cap, 3.0):
        lines.append(_line(_M + "correction_cap", cap, 3.0, trl_text(("vllm_importance_sampling_clip_max",))))
    low = _get(cfg, _M + "correction_low")
    if low != 0:  # 0 = no lower bound, TRL's
        shown = f"{low!r}" if low is not None else f"{1 / cap!r} (1/correction_cap)"
        lines.append(
            f"{_M}correction_low: {shown} here, 0 (no lower bound) under TRL {TRL_VERSION}'s "
            f"{trl_text(('vllm_importance_sampling_clip_min',))}"
        )
    return lines


def differences(cfg: dict) -> list[str]:
    """One line per entry of ``TRL_DEFAULTS`` whose value in the resolved ``cfg`` (its nulls read as the
    values they stand for) differs from TRL's, then the mismatch correction's (``_correction_lines``); an agent
    run's rollout settings are read from its ``AgentRolloutCallback`` and its tool settings added
    (``trl_agent``)."""
    from lit_rl.cli.trl_agent import agent_lines, with_agent_rollout

    cfg = effective(with_agent_rollout(cfg))
    lines = []
    for what, where, names, trl_value, remark in TRL_DEFAULTS:
        ours = where(cfg) if callable(where) else _get(cfg, where)
        if not _same(ours, trl_value):
            lines.append(
                _line(where if isinstance(where, str) else what, ours, trl_value, trl_text(names, remark))
            )
    return lines + _correction_lines(cfg) + agent_lines(cfg, TRL_VERSION)


class ResolveError(Exception):
    """``lit-rl fit`` refused the configuration; it printed its one-line error already (the exit code)."""


def resolved_config(argv: list[str]) -> dict:
    """The config ``lit-rl fit ARGV`` would run, as ``--print_config`` prints it (nothing is instantiated).
    Raises ``ResolveError`` when the parser refused it (its error line is on stderr)."""
    from lit_rl.cli.app import main as fit_main

    out = io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out):
        try:
            fit_main(["fit", *argv, "--print_config"])
        except SystemExit as e:
            code = e.code
    if code not in (0, None):
        raise ResolveError(code)
    cfg = yaml.safe_load(out.getvalue())
    if not isinstance(cfg, dict):
        raise ResolveError(2)
    return cfg


USAGE = (
    "usage: lit-rl explain-trl -c CONFIG [-c MORE] [--key value ...]\n\n"
    f"The settings of that `lit-rl fit` run that differ from TRL {TRL_VERSION} GRPOTrainer's defaults, one line "
    "each with both values (the configs and flags are resolved as `lit-rl fit` resolves them; nothing is built). "
    f"Every GRPOConfig argument and the lit_rl setting it becomes: {README_TABLE}."
)


def main(argv: list[str]) -> int:
    """``lit-rl explain-trl``: print the differences; exit code 0 (they are information, not errors)."""
    if not argv or "-h" in argv or "--help" in argv:
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    from lit_rl.errors import ConfigError

    try:
        lines = differences(resolved_config(argv))
    except ConfigError as e:  # the one-line configuration errors of `lit-rl fit`
        print(f"lit-rl: error: {e}", file=sys.stderr)
        return 2
    except ResolveError as e:  # the parser printed its own one-line error
        code = e.args[0]
        return code if isinstance(code, int) else 2
    for line in lines:
        print(line)
    print(
        f"{len(lines)} setting(s) differ from TRL {TRL_VERSION}'s defaults; every GRPOConfig argument: {README_TABLE}"
    )
    return 0
