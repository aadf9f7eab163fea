"""``lit-rl explain-trl -c CONFIG [-c ...] [--flags]``: one line per setting of the run that differs from what
TRL 1.16's ``GRPOTrainer`` does by default, with both values (README "Every GRPOConfig argument" has every
argument).

The run's configuration is resolved exactly as ``lit-rl fit`` resolves it (``fit ... --print_config``: the
configs in order, the flags, the classes' defaults), so what is compared is what would train. Nothing is
built and no model is loaded. TRL's defaults are written here in lit_rl's terms (``TRL_DEFAULTS``): e.g.
``loss_type="dapo"`` is ``policy_loss: ppo_clip`` and ``loss_agg: token_mean``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from typing import Any

import yaml

TRL_VERSION = "1.16"
_OPT = "model.init_args.optimizer"
_SCHED = "model.init_args.lr_scheduler"
_M = "model.init_args."


def _get(cfg: dict, path: str) -> Any:
    """The value at a dotted path; None where a level is missing (e.g. no lr_scheduler)."""
    for key in path.split("."):
        if not isinstance(cfg, dict) or key not in cfg:
            return None
        cfg = cfg[key]
    return cfg


def _callback_arg(cls: str, arg: str, absent: Any) -> Callable[[dict], Any]:
    """``arg`` of the first ``cls`` callback in trainer.callbacks; ``absent`` when the run has none."""

    def read(cfg: dict) -> Any:
        for cb in _get(cfg, "trainer.callbacks") or []:
            if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("." + cls):
                return (cb.get("init_args") or {}).get(arg, absent)
        return absent

    return read


def _warmup(cfg: dict) -> Any:
    """WarmupLinearDecay's warmup (steps, or the ratio); 0 under another schedule (the schedule's own line
    says that one differs)."""
    if not str(_get(cfg, f"{_SCHED}.class_path")).endswith("WarmupLinearDecay"):
        return 0
    args = _get(cfg, f"{_SCHED}.init_args") or {}
    return args.get("warmup_steps") or args.get("warmup_ratio") or 0


def _fused(cfg: dict) -> Any:
    """Whether the optimizer step is fused: the modules' own default optimizer is (``default_adamw``); a named
    optimizer is when its ``fused`` says so."""
    opt = _get(cfg, _OPT)
    if not isinstance(opt, dict):
        return True
    return bool((opt.get("init_args") or {}).get("fused"))


# (where in the run's config, or a reader of it; TRL's argument and default; that default in lit_rl's terms)
TRL_DEFAULTS: list[tuple[str, str | Callable[[dict], Any], str, Any]] = [
    ("seed_everything", "seed_everything", "seed=42", 42),
    ("learning rate", f"{_OPT}.init_args.lr", "learning_rate=1e-6", 1e-6),
    ("optimizer", f"{_OPT}.class_path", 'optim="adamw_torch_fused"', "torch.optim.AdamW"),
    ("fused optimizer step", _fused, 'optim="adamw_torch_fused"', True),
    ("weight decay", f"{_OPT}.init_args.weight_decay", "weight_decay=0.0", 0.0),
    ("Adam betas", f"{_OPT}.init_args.betas", "adam_beta1=0.9, adam_beta2=0.999", [0.9, 0.999]),
    ("Adam eps", f"{_OPT}.init_args.eps", "adam_epsilon=1e-8", 1e-8),
    (
        "lr schedule",
        f"{_SCHED}.class_path",
        'lr_scheduler_type="linear"',
        "lit_rl.learners.WarmupLinearDecay",
    ),
    ("warmup", _warmup, "warmup_steps=0, warmup_ratio=0.0", 0),
    ("gradient clipping", _M + "max_grad_norm", "max_grad_norm=1.0", 1.0),
    ("gradient checkpointing", _M + "gradient_checkpointing", "gradient_checkpointing=True", True),
    ("dropout off", _M + "disable_dropout", "disable_dropout=False", False),
    ("precision", "trainer.precision", "bf16=None (bf16 mixed precision unless fp16)", "bf16-mixed"),
    ("advantage", _M + "advantage", 'scale_rewards="group" (GRPO advantages)', "grpo"),
    ("std scaling", _M + "std_normalize", 'scale_rewards="group"', True),
    ("std scope", _M + "std_scope", 'scale_rewards="group"', "group"),
    ("policy loss", _M + "policy_loss", 'loss_type="dapo"', "ppo_clip"),
    ("loss aggregation", _M + "loss_agg", 'loss_type="dapo"', "token_mean"),
    ("clip low", _M + "clip_low", "epsilon=0.2", 0.2),
    ("clip high", _M + "clip_high", "epsilon_high=None (= epsilon)", 0.2),
    ("dual clip", _M + "dual_clip", "delta=None", None),
    ("passes per batch", _M + "ppo_epochs", "num_iterations=1", 1),
    ("KL to the reference", _callback_arg("ReferenceKL", "beta", 0.0), "beta=0.0 (no reference model)", 0.0),
    ("entropy bonus", _callback_arg("EntropyRegularization", "coef", 0.0), "entropy_coef=0.0", 0.0),
    (
        "prompts per rank and step",
        "data.init_args.batch_size",
        "per_device_train_batch_size=8 (completions) / num_generations=8",
        1,
    ),
    ("group size", "rollout.group_size", "num_generations=8", 8),
    ("completion budget", "rollout.sampling.max_new_tokens", "max_completion_length=512", 512),
    ("temperature", "rollout.sampling.temperature", "temperature=1.0", 1.0),
    ("top_p", "rollout.sampling.top_p", "top_p=1.0", 1.0),
    ("top_k", "rollout.sampling.top_k", "top_k=0", 0),
    ("min_p", "rollout.sampling.min_p", "min_p=None", 0.0),
    ("repetition penalty", "rollout.sampling.repetition_penalty", "repetition_penalty=1.0", 1.0),
    ("truncated rows", "rollout.overlong_filter", "mask_truncated_completions=False", False),
    ("logging", "trainer.log_every_n_steps", "logging_steps=10", 10),
    ("checkpoints", "checkpoint.every_n_iterations", "save_steps=500", 500),
]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def differences(cfg: dict) -> list[str]:
    """One line per entry of ``TRL_DEFAULTS`` whose value in the resolved ``cfg`` differs from TRL's."""
    lines = []
    for what, where, trl_arg, trl_value in TRL_DEFAULTS:
        ours = where(cfg) if callable(where) else _get(cfg, where)
        if not _same(ours, trl_value):
            key = where if isinstance(where, str) else what
            lines.append(f"{key}: {ours!r} here, {trl_value!r} under TRL {TRL_VERSION}'s {trl_arg}")
    return lines


def resolved_config(argv: list[str]) -> dict:
    """The config ``lit-rl fit ARGV`` would run, as ``--print_config`` prints it (nothing is instantiated)."""
    from lit_rl.cli.app import main as fit_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        fit_main(["fit", *argv, "--print_config"])
    cfg = yaml.safe_load(out.getvalue())
    if not isinstance(cfg, dict):
        raise SystemExit(f"lit-rl explain-trl: could not resolve the configuration of {' '.join(argv)}")
    return cfg


def main(argv: list[str]) -> int:
    """``lit-rl explain-trl``: print the differences; exit code 0 (they are information, not errors)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: lit-rl explain-trl -c CONFIG [-c MORE] [--key value ...]: the settings of that "
            f"`lit-rl fit` run that differ from TRL {TRL_VERSION} GRPOTrainer's defaults, with both values"
        )
        return 0 if argv else 2
    from lit_rl.errors import ConfigError

    try:
        lines = differences(resolved_config(argv))
    except ConfigError as e:  # the one-line configuration errors of `lit-rl fit`
        print(f"lit-rl: error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(
        f"{len(lines)} setting(s) differ from TRL {TRL_VERSION}'s defaults; every GRPOConfig argument: "
        'README "Every GRPOConfig argument"',
        file=sys.stdout,
    )
    return 0
