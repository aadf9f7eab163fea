"""TRL 1.16's ``GRPOConfig`` argument names -> the lit_rl settings they become, in one table.

Read by:

- the unknown-key errors (``precheck.py`` and the full parser's, through ``errors.unknown_key_text``):
  ``--learning_rate 1e-5`` answers "lit_rl's setting is --model.init_args.optimizer.init_args.lr" instead of a
  "did you mean" by spelling;
- ``lit-rl explain-trl`` (``trl_diff.py``): TRL's side of each line (``learning_rate=1e-6``);
- the tests: every setting here is a key of a real resolved config (``tests/test_trl_names.py``), and
  docs/guides/coming-from-trl.md "Every GRPOConfig argument" names the same settings and defaults
  (``tests/test_trl_grpo_config_table.py``).

A setting is a dotted config key (``--model.init_args.clip_low`` on the command line), or
``trainer.callbacks[Class].init_args.arg``: the argument of a ``lit_rl.callbacks.<Class>`` callback (TRL's
``beta`` is a ``ReferenceKL``'s). Light on purpose: the early check imports it before Lightning.
"""

from __future__ import annotations

import re
from typing import NamedTuple

TRL_VERSION = "1.16"
README_TABLE = 'docs/guides/coming-from-trl.md "Every GRPOConfig argument"'
_M, _OPT, _SCHED = "model.init_args.", "model.init_args.optimizer.init_args.", "model.init_args.lr_scheduler."


class TRLArg(NamedTuple):
    default: str | None  # TRL's default as GRPOConfig writes it (None: an argument with no default to quote)
    settings: tuple[str, ...]  # the lit_rl settings it becomes
    note: str = ""  # how the values map, where that is not one value for one value


TRL_ARGS: dict[str, TRLArg] = {
    # training
    "learning_rate": TRLArg("1e-6", (_OPT + "lr",)),
    "optim": TRLArg(
        '"adamw_torch_fused"', (_M + "optimizer",), "class_path torch.optim.AdamW with init_args fused: true"
    ),
    "weight_decay": TRLArg("0.0", (_OPT + "weight_decay",)),
    "adam_beta1": TRLArg("0.9", (_OPT + "betas",), "its first value"),
    "adam_beta2": TRLArg("0.999", (_OPT + "betas",), "its second value"),
    "adam_epsilon": TRLArg("1e-8", (_OPT + "eps",)),
    "lr_scheduler_type": TRLArg(
        '"linear"',
        (_M + "lr_scheduler",),
        '"linear": lit_rl.learners.WarmupLinearDecay, "cosine": lit_rl.learners.CosineDecay, "constant": null',
    ),
    "lr_scheduler_kwargs": TRLArg("None", (_SCHED + "init_args",)),
    "warmup_steps": TRLArg("0", (_SCHED + "init_args.warmup_steps",), "of lit_rl.learners.WarmupLinearDecay"),
    "warmup_ratio": TRLArg(
        "0.0", (_SCHED + "init_args.warmup_ratio",), "of lit_rl.learners.WarmupLinearDecay"
    ),
    "max_grad_norm": TRLArg("1.0", (_M + "max_grad_norm",)),
    "gradient_checkpointing": TRLArg("True", (_M + "gradient_checkpointing",)),
    "disable_dropout": TRLArg("False", (_M + "disable_dropout",)),
    "bf16": TRLArg("None", ("trainer.precision",), "bf16 mixed precision: bf16-mixed"),
    "model_init_kwargs": TRLArg("None", (_M + "dtype",), "only the dtype"),
    "seed": TRLArg("42", ("seed_everything",)),
    "data_seed": TRLArg("None", ("data.init_args.seed",)),
    "shuffle_dataset": TRLArg(
        "True", ("data.init_args.seed",), "prompts are always shuffled, with this seed"
    ),
    "max_steps": TRLArg("-1", ("trainer.max_steps",)),
    "num_train_epochs": TRLArg("3.0", ("trainer.max_steps",), "prompts are reshuffled endlessly: no epochs"),
    "per_device_train_batch_size": TRLArg(
        "8",
        ("data.init_args.batch_size", "rollout.group_size"),
        "batch_size counts prompts: per_device_train_batch_size / num_generations",
    ),
    "generation_batch_size": TRLArg(
        "None", ("data.init_args.batch_size", "rollout.group_size"), "prompts x samples per prompt"
    ),
    "steps_per_generation": TRLArg("None", (_M + "minibatch_size",), "rows per optimizer step"),
    "gradient_accumulation_steps": TRLArg(
        "1", (_M + "micro_batch_size",), "rows per forward/backward, accumulated within one optimizer step"
    ),
    # the loss
    "loss_type": TRLArg(
        '"dapo"',
        (_M + "policy_loss", _M + "loss_agg"),
        f'loss_type="dapo" is ppo_clip and token_mean; the other loss types: {README_TABLE}',
    ),
    "importance_sampling_level": TRLArg(
        '"token"', (_M + "policy_loss",), '"token": ppo_clip, "sequence": gspo'
    ),
    "scale_rewards": TRLArg(
        '"group"',
        (_M + "std_normalize", _M + "std_scope", _M + "advantage"),
        '"group": std_normalize true, std_scope group, advantage grpo; "batch": std_scope batch; '
        '"none": std_normalize false',
    ),
    "epsilon": TRLArg(
        "0.2", (_M + "clip_low", _M + "clip_high"), "set both: clip_high does not follow clip_low"
    ),
    "epsilon_high": TRLArg("None", (_M + "clip_high",)),
    "delta": TRLArg("None", (_M + "dual_clip",)),
    "sapo_temperature_pos": TRLArg("1.0", (_M + "sapo_tau_pos",)),
    "sapo_temperature_neg": TRLArg("1.05", (_M + "sapo_tau_neg",)),
    "vespo_k_pos": TRLArg("2.0", (_M + "vespo_k_pos",)),
    "vespo_lambda_pos": TRLArg("3.0", (_M + "vespo_lambda_pos",)),
    "vespo_k_neg": TRLArg("3.0", (_M + "vespo_k_neg",)),
    "vespo_lambda_neg": TRLArg("2.0", (_M + "vespo_lambda_neg",)),
    "num_iterations": TRLArg("1", (_M + "ppo_epochs",)),
    "beta": TRLArg(
        "0.0",
        ("trainer.callbacks[ReferenceKL].init_args.beta",),
        "-c callbacks/reference_kl.yaml; beta=0.0 is no ReferenceKL",
    ),
    "entropy_coef": TRLArg(
        "0.0",
        ("trainer.callbacks[EntropyRegularization].init_args.coef",),
        "-c callbacks/entropy.yaml; entropy_coef=0.0 is no EntropyRegularization",
    ),
    "mask_truncated_completions": TRLArg("False", ("rollout.overlong_filter",)),
    # rewards
    "reward_weights": TRLArg("None", ("rollout.rewards.init_args.weights",), "by reward name, or a list"),
    "multi_objective_aggregation": TRLArg(
        '"sum_then_normalize"', ("rollout.rewards",), "a RewardPool's weighted sum, then the advantage"
    ),
    # generation
    "num_generations": TRLArg("8", ("rollout.group_size",)),
    "max_completion_length": TRLArg("512", ("rollout.sampling.max_new_tokens",)),
    "temperature": TRLArg("1.0", ("rollout.sampling.temperature",)),
    "top_p": TRLArg("1.0", ("rollout.sampling.top_p",)),
    "top_k": TRLArg("0", ("rollout.sampling.top_k",)),
    "min_p": TRLArg("None", ("rollout.sampling.min_p",), "0 is off"),
    "repetition_penalty": TRLArg("1.0", ("rollout.sampling.repetition_penalty",)),
    "generation_kwargs": TRLArg("None", ("rollout.sampling.generation_kwargs",)),
    "chat_template_kwargs": TRLArg("None", ("rollout.sampling.chat_template_kwargs",)),
    "use_vllm": TRLArg(
        "False",
        ("rollout.engine",),
        "use_vllm=True: lit_rl.rollout.vllm.VLLMEngine; TRL then also corrects the engine/trainer mismatch: "
        "--model.init_args.rollout_correction mis, as lit-rl explain-trl details",
    ),
    "vllm_mode": TRLArg(
        '"colocate"',
        ("rollout.engine",),
        '"colocate": lit_rl.rollout.vllm.VLLMEngine, "server": lit_rl.rollout.server.VLLMServerEngine',
    ),
    "vllm_gpu_memory_utilization": TRLArg("0.3", ("rollout.engine.init_args.gpu_memory_utilization",)),
    "vllm_max_model_length": TRLArg("None", ("rollout.engine.init_args.max_model_len",)),
    "vllm_tensor_parallel_size": TRLArg("1", ("rollout.engine.init_args.tensor_parallel_size",)),
    # the engine/trainer mismatch correction (TRL: only with use_vllm=True)
    "vllm_importance_sampling_correction": TRLArg(
        "True", (_M + "rollout_correction",), "True: mis or tis (lit_rl's default is none, on every engine)"
    ),
    "vllm_importance_sampling_mode": TRLArg(
        '"sequence_mask"',
        (_M + "rollout_correction", _M + "correction_level"),
        '"sequence_mask": mis and sequence; "token_truncate": tis and token',
    ),
    "vllm_importance_sampling_clip_max": TRLArg("3.0", (_M + "correction_cap",)),
    "vllm_importance_sampling_cap": TRLArg(None, (_M + "correction_cap",)),
    "vllm_importance_sampling_clip_min": TRLArg(
        "None", (_M + "correction_low",), "null is 1/correction_cap; 0 is TRL's None (no bound)"
    ),
    # runs
    "logging_steps": TRLArg("10", ("trainer.log_every_n_steps",)),
    "save_steps": TRLArg("500", ("checkpoint.every_n_iterations",)),
    "save_strategy": TRLArg('"steps"', ("checkpoint.every_n_iterations",), "every N RL iterations"),
    "save_total_limit": TRLArg("None", ("checkpoint.save_top_k",)),
    "output_dir": TRLArg(None, ("trainer.default_root_dir",)),
    "resume_from_checkpoint": TRLArg(
        "None", ("ckpt_path",), "last resumes the run directory's last checkpoint"
    ),
    "eval_strategy": TRLArg('"no"', ("trainer.val_check_interval",), "with -c callbacks/eval.yaml"),
    "eval_steps": TRLArg("None", ("trainer.val_check_interval",), "with -c callbacks/eval.yaml"),
    "report_to": TRLArg('"none"', ("trainer.logger",), "CSV and TensorBoard are always written"),
    "log_completions": TRLArg(
        "False", ("trainer.callbacks[RolloutInspector].init_args.max_rows_per_step",), "every recipe has one"
    ),
}

_CALLBACK = re.compile(r"trainer\.callbacks\[(\w+)\]\.init_args\.(\w+)$")


def callback_setting(setting: str) -> tuple[str, str] | None:
    """``(class name, argument)`` of a ``trainer.callbacks[Class].init_args.arg`` setting, else None."""
    m = _CALLBACK.match(setting)
    return (m.group(1), m.group(2)) if m else None


def _render(setting: str, as_flag: bool) -> str:
    cb = callback_setting(setting)
    if cb:
        return f"the {cb[1]} of a lit_rl.callbacks.{cb[0]} in trainer.callbacks"
    return f"--{setting}" if as_flag else setting


def trl_name_text(key: str, as_flag: bool) -> str | None:
    """``KEY is TRL's name; lit_rl's setting is SETTING (how)`` when the last part of ``key`` is a TRL argument
    name, else None. ``as_flag``: the key came from the command line (settings written as flags)."""
    name = key.rsplit(".", 1)[-1]
    arg = TRL_ARGS.get(name)
    if arg is None:
        return None
    settings = [_render(s, as_flag) for s in arg.settings]
    these = (
        f"setting is {settings[0]}"
        if len(settings) == 1
        else f"settings are {', '.join(settings[:-1])} and {settings[-1]}"
    )
    shown = f"--{key}" if as_flag else key
    return f"{shown} is TRL's name; lit_rl's {these}" + (f" ({arg.note})" if arg.note else "")
