"""docs/guides/coming-from-trl.md "Every GRPOConfig argument": every argument of TRL 1.16's ``GRPOConfig`` has
a row (mapped, mapped with a different meaning, or not supported), every row says which, and the lit_rl names
the rows map to exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from _docs import section

ROOT = Path(__file__).resolve().parents[1]
SECTION = section("docs/guides/coming-from-trl.md", "## Every GRPOConfig argument")

# The fields of trl.GRPOConfig and of the _BaseConfig it derives from, in source order, read from the trl
# 1.16.0 wheel on PyPI (trl-1.16.0-py3-none-any.whl, sha256
# c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396; trl/trainer/base_config.py and
# trl/trainer/grpo_config.py). The github:huggingface/trl mirror read alongside has no v1.16 tag (its newest
# commit, f2cd57710ae3, is 1.10.0.dev0), so the released wheel is the source here.
GRPO_CONFIG_FIELDS = [
    # _BaseConfig (overrides of TrainingArguments for every TRL trainer)
    "logging_steps",
    "gradient_checkpointing",
    "bf16",
    "lr_scheduler_kwargs",
    "use_liger_kernel",
    "torch_empty_cache_steps",
    # GRPOConfig
    "learning_rate",
    "model_init_kwargs",
    "trust_remote_code",
    "router_aux_loss_coef",
    "disable_dropout",
    "cast_lm_head_to_fp32",
    "remove_unused_columns",
    "num_generations",
    "num_generations_eval",
    "max_completion_length",
    "ds3_gather_for_generation",
    "shuffle_dataset",
    "pad_to_multiple_of",
    "generation_batch_size",
    "steps_per_generation",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "generation_kwargs",
    "chat_template_kwargs",
    "repetition_penalty",
    "cache_implementation",
    "use_vllm",
    "vllm_mode",
    "vllm_model_impl",
    "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_tensor_parallel_size",
    "beta",
    "num_iterations",
    "epsilon",
    "delta",
    "epsilon_high",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "importance_sampling_level",
    "reward_weights",
    "multi_objective_aggregation",
    "scale_rewards",
    "loss_type",
    "mask_truncated_completions",
    "sync_ref_model",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "top_entropy_quantile",
    "entropy_coef",
    "use_adaptive_entropy",
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "max_tool_calling_iterations",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
    "off_policy_mask_threshold",
    "use_bias_correction_kl",
    "log_completions",
    "log_multimodal",
    "num_completions_to_print",
    "log_unique_prompts",
    "log_completions_hub_repo",
    "use_transformers_continuous_batching",
    "transformers_continuous_batching_config",
    "use_transformers_paged",
    "vllm_importance_sampling_cap",
]
# TrainingArguments fields GRPOConfig inherits unchanged that change training or where it is saved / logged.
INHERITED_FIELDS = [
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "optim",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing_kwargs",
    "fp16",
    "seed",
    "data_seed",
    "save_steps",
    "save_strategy",
    "save_total_limit",
    "output_dir",
    "resume_from_checkpoint",
    "eval_strategy",
    "eval_steps",
    "report_to",
    "push_to_hub",
    "torch_compile",
]
# The values of the string-valued choices (grpo_config.py's lists; grpo_trainer.py's branches).
CHOICES = {
    "loss_type": ["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"],
    "scale_rewards": ["group", "batch", "none"],
    "importance_sampling_level": ["token", "sequence"],
    "vllm_importance_sampling_mode": ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"],
}
STATUS = ("**same**", "**differs**", "**not supported**")


def rows() -> list[list[str]]:
    r"""The table's body rows as cells (a ``\|`` inside a cell is not a separator)."""
    out = []
    for line in SECTION.splitlines():
        if line.startswith("| `"):
            out.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return out


def named(first_cell: str) -> set[str]:
    """The argument names a row's first cell covers: each backticked `name` or `name=default`."""
    return {m.group(1) for m in re.finditer(r"`([a-z_0-9]+)(?:=[^`]*)?`", first_cell)}


def test_every_grpo_config_field_has_a_row():
    covered = set().union(*(named(r[0]) for r in rows()))
    missing = [f for f in GRPO_CONFIG_FIELDS + INHERITED_FIELDS if f not in covered]
    assert not missing, f"GRPOConfig arguments without a row in the guide's table: {missing}"
    unknown = covered - set(GRPO_CONFIG_FIELDS) - set(INHERITED_FIELDS)
    assert not unknown, f"rows for names that are not GRPOConfig arguments: {sorted(unknown)}"


def test_every_row_says_mapped_differs_or_not_supported():
    for r in rows():
        assert len(r) == 3, r
        assert any(s in r[2] for s in STATUS), f"row without a status: {r}"
        if "**not supported**" not in r[2]:
            assert r[1], f"a mapped row names no lit_rl setting: {r}"


def test_every_value_of_the_string_choices_has_a_row():
    text = "\n".join(r[0] + " " + r[2] for r in rows())
    for field, values in CHOICES.items():
        for v in values:
            assert re.search(rf'`{field}="{v}"`|`{v}`', text), f'{field}="{v}" is not in the table'


def test_the_lit_rl_names_the_rows_map_to_exist():
    """A row may not name a policy loss, aggregation, std_scope or class that lit_rl lacks."""
    import importlib

    from lit_rl.core.advantages import ADVANTAGES, STD_SCOPES
    from lit_rl.core.aggregation import AGG_MODES
    from lit_rl.core.policy_losses import POLICY_LOSSES

    known = {
        "policy_loss": set(POLICY_LOSSES.names()),
        "loss_agg": set(AGG_MODES),
        "std_scope": set(STD_SCOPES),
        "advantage": set(ADVANTAGES.names()),
    }
    for r in rows():
        for key, value in re.findall(r"\b(policy_loss|loss_agg|std_scope|advantage): ([a-z_]+)", r[1]):
            assert value in known[key], f"{key}: {value} in {r}"
        for path in re.findall(r"\blit_rl\.[a-z_.]+\.[A-Z][A-Za-z]+", r[1]):
            module, name = path.rsplit(".", 1)
            assert hasattr(importlib.import_module(module), name), path


def test_inherited_fields_are_training_arguments():
    """The inherited rows name real TrainingArguments fields (transformers 5 folded warmup_ratio into
    warmup_steps, a float below 1 being a ratio; TRL 1.16 still runs on transformers 4.x, which has both)."""
    from transformers import TrainingArguments

    have = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(INHERITED_FIELDS) - {"warmup_ratio"} <= have


# A lit_rl config key written in full in a row's lit_rl cell (`model.init_args.clip_low`, `rollout.group_size: 8`)
_FULL_KEY = re.compile(
    r"`((?:model|data|rollout|trainer|checkpoint)\.[\w.]+|seed_everything|ckpt_path)(?:`|:)"
)


def _default_row(name: str, default: str | None) -> list[str]:
    """The row quoting ``name=default`` (TRL's default), else the first row naming ``name``."""
    want = f"`{name}={default}`"
    found = [r for r in rows() if default is not None and want in r[0]]
    found += [r for r in rows() if name in named(r[0])]
    assert found, f"no row of the guide's table names {name}"
    return found[0]


def _names_setting(cell: str, setting: str) -> bool:
    from lit_rl.cli.trl_names import callback_setting

    cb = callback_setting(setting)
    if cb:  # trainer.callbacks[ReferenceKL].init_args.beta: the class and its argument are named
        return f"`{cb[0]}" in cell and f"`{cb[1]}`" in cell
    return setting in _FULL_KEY.findall(cell)


def test_the_rows_name_the_settings_and_defaults_of_the_one_table():
    """The guide's table and lit_rl/cli/trl_names.py (what `--learning_rate` is answered with, what explain-trl
    quotes) say the same: the row of each TRL name quotes its default and names each of its lit_rl settings
    in full; a row that names a lit_rl key in full maps TRL names that are in the table."""
    from lit_rl.cli.trl_names import TRL_ARGS

    for name, arg in TRL_ARGS.items():
        row = _default_row(name, arg.default)
        if arg.default is not None:
            assert f"`{name}={arg.default}`" in row[0], (name, arg.default, row[0])
        missing = [s for s in arg.settings if not _names_setting(row[1], s)]
        assert not missing, f"the guide's row for {name} does not name {missing}: {row[1]}"
    for r in rows():
        if "**not supported**" in r[2] and "**same**" not in r[2] and "**differs**" not in r[2]:
            continue
        if _FULL_KEY.search(r[1]):
            assert named(r[0]) <= set(TRL_ARGS), (
                f"{sorted(named(r[0]) - set(TRL_ARGS))} not in the table: {r}"
            )


def test_the_table_check_can_fail():
    assert not _names_setting("`rollout.group_size: 8`", "rollout.group")
    assert _names_setting("`rollout.group_size: 8`", "rollout.group_size")
    assert not _names_setting("no `ReferenceKL` callback", "trainer.callbacks[ReferenceKL].init_args.beta")
