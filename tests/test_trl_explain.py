"""``lit-rl explain-trl`` as a TRL user meets it: the README's own config (its rewards in the working directory),
``--help`` after a config, a vLLM run (TRL corrects the engine/trainer mismatch there), a config that leaves
settings to their defaults (printed as the values they are, not None). Every expected line is written out."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from _docs import section

from lit_rl.cli import trl_diff, trl_names

ROOT = Path(__file__).resolve().parents[1]
QS = str(ROOT / "configs/quickstart.yaml")
M = "model.init_args."
SECTION = section("docs/guides/coming-from-trl.md", "# Coming from TRL")
CORRECTION = (
    "model.init_args.rollout_correction: 'none' here, 'mis' under TRL 1.16's "
    'vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask" (with vLLM, TRL '
    "leaves out of the loss each sequence whose trainer/engine probability ratio is above "
    "vllm_importance_sampling_clip_max=3.0; lit_rl: --model.init_args.rollout_correction mis "
    "--model.init_args.correction_level sequence --model.init_args.correction_cap 3.0)"
)


def test_the_readme_config_is_explained_from_its_directory(tmp_path, monkeypatch, capsys):
    """`lit-rl explain-trl -c trl_grpo.yaml` beside trl_rewards.py, as the README has it: the reward import
    paths resolve from the working directory, as `lit-rl fit` resolves them."""
    from lit_rl.cli import console_main

    (tmp_path / "trl_rewards.py").write_text(re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1))
    config = re.search(r"```yaml\n(# trl_grpo.yaml\n.*?)```", SECTION, re.DOTALL).group(1)
    (tmp_path / "trl_grpo.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "trl_rewards", raising=False)
    monkeypatch.setattr(sys, "argv", ["lit-rl", "explain-trl", "-c", "trl_grpo.yaml"])
    with pytest.raises(SystemExit) as e:
        console_main()
    out = capsys.readouterr()
    assert e.value.code == 0, out.err
    assert out.err == ""
    lines = out.out.splitlines()
    assert (
        "model.init_args.optimizer.init_args.lr: 1e-05 here, 1e-06 under TRL 1.16's learning_rate=1e-6"
        in lines
    )
    assert "rollout.sampling.top_p: 0.95 here, 1.0 under TRL 1.16's top_p=1.0" in lines
    assert lines[-1].startswith(f"{len(lines) - 1} setting(s) differ")
    sys.modules.pop("trl_rewards", None)


@pytest.mark.parametrize("argv", [["-c", QS, "--help"], ["-h"], ["-c", QS, "-h", "--trainer.max_steps", "3"]])
def test_help_anywhere_prints_the_usage(argv, capsys):
    assert trl_diff.main(argv) == 0
    out = capsys.readouterr()
    assert (
        out.out.startswith("usage: lit-rl explain-trl -c CONFIG [-c MORE] [--key value ...]\n")
        and not out.err
    )


def test_a_refused_config_is_its_one_error_line(tmp_path, capsys):
    assert trl_diff.main(["-c", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lit-rl: error: ") and "missing.yaml" in err[0]


def test_a_vllm_run_is_told_the_correction_trl_turns_on(capsys):
    """configs/grpo_vllm.yaml generates with vLLM and leaves rollout_correction at none; TRL's use_vllm=True
    would correct with sequence-level masking at 3.0."""
    lines = trl_diff.differences(trl_diff.resolved_config(["-c", str(ROOT / "configs/grpo_vllm.yaml")]))
    assert CORRECTION in lines
    assert (
        "rollout.engine.class_path: 'lit_rl.rollout.vllm.VLLMEngine' here, 'lit_rl.rollout.engine.HFEngine' "
        "under TRL 1.16's use_vllm=False"
    ) in lines


def _cfg(engine: str | None, **init) -> dict:
    return {"model": {"init_args": init}, "rollout": {"engine": {"class_path": engine} if engine else None}}


@pytest.mark.parametrize(
    "engine, init, expected",
    [
        ("lit_rl.rollout.server.VLLMServerEngine", {"rollout_correction": "none"}, [CORRECTION]),
        (
            "lit_rl.rollout.vllm.VLLMEngine",
            {"rollout_correction": "mis", "correction_level": "sequence", "correction_cap": 3.0},
            [
                "model.init_args.correction_low: 0.3333333333333333 (1/correction_cap) here, 0 (no lower bound) "
                "under TRL 1.16's vllm_importance_sampling_clip_min=None"
            ],
        ),
        (
            "lit_rl.rollout.vllm.VLLMEngine",
            {
                "rollout_correction": "mis",
                "correction_level": "token",
                "correction_cap": 2.0,
                "correction_low": 0.25,
            },
            [
                "model.init_args.correction_level: 'token' here, 'sequence' under TRL 1.16's "
                'vllm_importance_sampling_mode="sequence_mask"',
                "model.init_args.correction_cap: 2.0 here, 3.0 under TRL 1.16's vllm_importance_sampling_clip_max=3.0",
                "model.init_args.correction_low: 0.25 here, 0 (no lower bound) under TRL 1.16's "
                "vllm_importance_sampling_clip_min=None",
            ],
        ),
        (
            None,
            {"rollout_correction": "tis"},
            [
                "model.init_args.rollout_correction: 'tis' here, 'none' under TRL 1.16's use_vllm=False (TRL "
                "corrects vLLM rollouts only)"
            ],
        ),
        (  # correction_low 0 is TRL's no lower bound (refused before this setting allowed it)
            "lit_rl.rollout.vllm.VLLMEngine",
            {
                "rollout_correction": "mis",
                "correction_level": "sequence",
                "correction_cap": 3.0,
                "correction_low": 0.0,
            },
            [],
        ),
        (None, {"rollout_correction": "none"}, []),
        ("lit_rl.rollout.vllm.VLLMEngine", {}, []),  # a module without the setting: nothing to compare
    ],
)
def test_the_correction_follows_the_engine(engine, init, expected):
    lines = trl_diff.differences(_cfg(engine, **init))
    assert [ln for ln in lines if ln.startswith((f"{M}correction", f"{M}rollout_correction"))] == expected


BARE = """\
model:
  class_path: lit_rl.learners.PolicyModule
  init_args: {model: not_built}
data:
  class_path: lit_rl.data.PromptDataModule
  init_args: {task: addition, batch_size: 8}
rollout:
  group_size: 8
  rewards: lit_rl.rewards.ExactAnswerReward
"""


def test_values_left_to_defaults_are_printed_as_those_values(tmp_path):
    """No optimizer, schedule, precision, seed or logging interval in the config: PolicyModule's own optimizer
    (fused AdamW, lr 1e-5, no weight decay), Lightning's 32-bit precision, a random seed, lit-rl's logging every
    step; only what differs from TRL is listed, and no value reads None."""
    cfg = tmp_path / "bare.yaml"
    cfg.write_text(BARE)
    lines = trl_diff.differences(trl_diff.resolved_config(["-c", str(cfg)]))
    assert lines == [
        "seed_everything: True (a new random seed each run) here, 42 under TRL 1.16's seed=42",
        "model.init_args.optimizer.init_args.lr: 1e-05 here, 1e-06 under TRL 1.16's learning_rate=1e-6",
        "model.init_args.lr_scheduler.class_path: None (no schedule: a constant learning rate) here, "
        "'lit_rl.learners.WarmupLinearDecay' under TRL 1.16's lr_scheduler_type=\"linear\"",
        "model.init_args.gradient_checkpointing: False here, True under TRL 1.16's gradient_checkpointing=True",
        "model.init_args.disable_dropout: True here, False under TRL 1.16's disable_dropout=False",
        "trainer.precision: '32-true' here, 'bf16-mixed' under TRL 1.16's bf16=None (bf16 mixed precision "
        "unless fp16)",
        "data.init_args.batch_size: 8 here, 1 under TRL 1.16's per_device_train_batch_size=8, num_generations=8 "
        "(8 completions: 1 prompt x 8)",
        "rollout.sampling.max_new_tokens: 32 here, 512 under TRL 1.16's max_completion_length=512",
        "trainer.log_every_n_steps: 1 here, 10 under TRL 1.16's logging_steps=10",
        "checkpoint.every_n_iterations: 50 here, 500 under TRL 1.16's save_steps=500",
    ]


def test_lightnings_values_for_null_are_lightnings():
    import lightning as L

    t = L.Trainer(
        precision=None,
        log_every_n_steps=None,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    assert {"trainer.precision": t.precision, "trainer.log_every_n_steps": t.log_every_n_steps} == (
        trl_diff.LIGHTNING_NULL
    )


def test_each_compared_setting_is_the_tables_setting_for_its_trl_names():
    """explain-trl's rows and the unknown-key answers read one table: a row's config key is a setting (or under
    one) of the TRL arguments it quotes."""
    for what, where, names, _, _ in trl_diff.TRL_DEFAULTS:
        assert all(n in trl_names.TRL_ARGS for n in names), what
        if isinstance(where, str):
            settings = [s for n in names for s in trl_names.TRL_ARGS[n].settings]
            assert any(where == s or where.startswith(s + ".") for s in settings), (where, settings)
