"""A TRL ``GRPOConfig`` name where lit_rl expects its own (``--learning_rate 1e-5``, ``learning_rate:`` in a
config) is answered with the lit_rl setting it becomes, in one line, never with a "did you mean" by spelling
(``learning_rate`` -> ``padding_free``). The names come from one table (``lit_rl/cli/trl_names.py``), whose
settings are checked here against a real resolved config."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.cli import precheck

ROOT = Path(__file__).resolve().parents[1]
QS = str(ROOT / "configs/quickstart.yaml")

# TRL name -> the lit_rl flags the one-line answer must name (written by hand from README "Every GRPOConfig
# argument", not read from the table under test).
EXPECTED = {
    "learning_rate": "lit_rl's setting is --model.init_args.optimizer.init_args.lr",
    "num_generations": "lit_rl's setting is --rollout.group_size",
    "loss_type": "lit_rl's settings are --model.init_args.policy_loss and --model.init_args.loss_agg",
    "scale_rewards": "lit_rl's settings are --model.init_args.std_normalize, --model.init_args.std_scope and "
    "--model.init_args.advantage",
    "beta": "lit_rl's setting is the beta of a lit_rl.callbacks.ReferenceKL in trainer.callbacks",
    "num_iterations": "lit_rl's setting is --model.init_args.ppo_epochs",
    "epsilon": "lit_rl's settings are --model.init_args.clip_low and --model.init_args.clip_high",
    "max_completion_length": "lit_rl's setting is --rollout.sampling.max_new_tokens",
    "use_vllm": "lit_rl's setting is --rollout.engine",
    "logging_steps": "lit_rl's setting is --trainer.log_every_n_steps",
    "save_steps": "lit_rl's setting is --checkpoint.every_n_iterations",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_trl_flag_is_answered_with_the_lit_rl_setting(name):
    msg = precheck.check(["fit", "-c", QS, f"--{name}", "1"])
    assert msg is not None and msg.startswith(f"--{name} is TRL's name; {EXPECTED[name]}"), msg
    assert "did you mean" not in msg and "\n" not in msg


def test_a_trl_key_in_a_config_file_names_the_file_line_and_the_setting(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("model:\n  init_args:\n    learning_rate: 1.0e-5\n")
    assert precheck.check(["fit", "-c", QS, "-c", str(cfg)]) == (
        f"{cfg}:3: model.init_args.learning_rate is TRL's name; lit_rl's setting is "
        "model.init_args.optimizer.init_args.lr"
    )
    top = tmp_path / "top.yaml"
    top.write_text("seed_everything: 1\nnum_generations: 4\n")
    assert precheck.check(["fit", "-c", QS, "-c", str(top)]) == (
        f"{top}:2: num_generations is TRL's name; lit_rl's setting is rollout.group_size"
    )


def test_the_full_parser_gives_the_same_answer(monkeypatch, capsys):
    """With the early check off, LightningCLI's own unknown-key error goes through the same table."""
    from lit_rl.cli import main

    monkeypatch.setenv("LIT_RL_PRECHECK", "0")
    with pytest.raises(SystemExit) as e:
        main(["fit", "-c", QS, "--learning_rate", "1e-5"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "lit-rl: error: --learning_rate is TRL's name; lit_rl's setting is "
        "--model.init_args.optimizer.init_args.lr"
    )


def test_every_setting_of_the_table_is_a_key_of_a_real_config():
    """The settings the answers name exist: each is a key of the config `lit-rl fit` resolves from the
    quickstart with TRL's defaults, a reference model, an entropy bonus and the vLLM engine (or, for a callback's
    argument, an argument of that callback there)."""
    from lit_rl.cli import trl_diff, trl_names

    cfg = trl_diff.resolved_config(
        [
            "-c",
            QS,
            "-c",
            str(ROOT / "callbacks/trl_defaults.yaml"),
            "-c",
            str(ROOT / "callbacks/reference_kl.yaml"),
            "-c",
            str(ROOT / "callbacks/entropy.yaml"),
            "--rollout.engine",
            "lit_rl.rollout.vllm.VLLMEngine",
        ]
    )

    def has(setting: str) -> bool:
        cb = trl_names.callback_setting(setting)
        if cb:
            return any(
                str(c.get("class_path", "")).endswith("." + cb[0]) and cb[1] in (c.get("init_args") or {})
                for c in cfg["trainer"]["callbacks"]
            )
        node = cfg
        for part in setting.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    settings = {s for arg in trl_names.TRL_ARGS.values() for s in arg.settings}
    assert len(settings) > 40
    assert sorted(s for s in settings if not has(s)) == []
    assert not has("model.init_args.learning_rate")  # the check can fail
