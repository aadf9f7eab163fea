"""Errors that point at the cause (issue 24): exit code 2, one line on stderr that names the field (and the file and
line, or what was meant), and nothing written into the run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fail(cwd: Path, *args: str, env: dict | None = None) -> str:
    """Run `lit-rl fit ...` expecting a configuration error: returns its one stderr line."""
    run_dir = cwd / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lit_rl.cli import console_main; console_main()",
            "fit",
            *args,
            "--trainer.default_root_dir",
            str(run_dir),
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [
        ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("Seed set to ")
    ]  # Lightning's info
    assert len(lines) == 1 and lines[0].startswith("lit-rl: error: "), proc.stderr[-3000:]
    assert not run_dir.exists(), sorted(
        str(p) for p in run_dir.rglob("*")
    )  # validated before writing anything
    return lines[0].removeprefix("lit-rl: error: ")


def test_config_file_typo_names_file_line_and_the_key_meant(tmp_path):
    text = (ROOT / "configs/quickstart.yaml").read_text()
    assert "  group_size: 16\n" in text
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(text.replace("  group_size: 16\n", "  group_sise: 16\n"))
    line = text.splitlines().index("  group_size: 16") + 1
    assert _fail(tmp_path, "-c", str(cfg)) == (
        f"{cfg}:{line}: rollout.group_sise is not an option; did you mean rollout.group_size? "
        "(lit-rl fit --help lists the rollout options)"
    )


def test_reward_path_typo_says_what_the_module_has(tmp_path):
    (tmp_path / "my_reward.py").write_text("def max_digit(prompt, completion):\n    return 0.0\n")
    msg = _fail(
        tmp_path,
        "-c",
        str(ROOT / "configs/quickstart.yaml"),
        "--rollout.rewards.rewards",
        "{mine: my_reward.maxdigit}",
    )
    assert msg == "rollout.rewards.rewards: my_reward has no attribute 'maxdigit'; it has: max_digit"


@pytest.mark.parametrize(
    "size, expected",
    [
        ("0", "rollout.group_size must be an integer >= 1, got 0"),
        ("1", "rollout.group_size=1 with model.advantage='grpo': a group-relative advantage"),
    ],
)
def test_group_size_refused_before_the_model_is_written(tmp_path, size, expected):
    # the quickstart builds its tiny model into <run dir>/model when the model is instantiated: not reached
    assert _fail(
        tmp_path, "-c", str(ROOT / "configs/quickstart.yaml"), "--rollout.group_size", size
    ).startswith(expected)


def test_unreachable_hub_fails_in_one_probe_naming_the_field(tmp_path):
    # a real probe against an endpoint that refuses connections (no network here means the same answer, later)
    msg = _fail(
        tmp_path,
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        "nobody/no-such-model",
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"},
    )
    assert msg.startswith(
        "model='nobody/no-such-model' is not a local directory, so it is a Hugging Face hub id, "
        "but the hub (http://127.0.0.1:9) is unreachable"
    )


def test_group_size_rules():
    from lit_rl.core.advantages import GROUP_RELATIVE, check_group_size

    assert {"grpo", "dr_grpo", "rloo"} <= GROUP_RELATIVE
    for adv in GROUP_RELATIVE:
        with pytest.raises(ValueError, match="group_size=1"):
            check_group_size(adv, 1)
        check_group_size(adv, 2)
    check_group_size("reinforce", 1)  # its baseline is not the group's
    check_group_size("gae", 1)
    check_group_size("grpo", 1, rl_coef=0.0)  # distillation only: the advantage is never used
    with pytest.raises(ValueError, match="got -2"):
        check_group_size("reinforce", -2)


def test_flow_mapping_without_space_points_at_the_missing_space(tmp_path):
    """`{acc:1.0}` is valid YAML for the key "acc:1.0" with no value; it failed later, far from the cause."""
    text = (ROOT / "configs/quickstart.yaml").read_text()
    cfg = tmp_path / "mine.yaml"
    assert "    init_args:\n      rewards:\n        exact:" in text
    cfg.write_text(
        text.replace(
            "    init_args:\n      rewards:\n",
            "    init_args:\n      weights: {exact:1.0}\n      rewards:\n",
            1,
        )
    )
    line = cfg.read_text().splitlines().index("      weights: {exact:1.0}") + 1
    assert _fail(tmp_path, "-c", str(cfg)) == (
        f"{cfg}:{line}: {{exact:1.0}} needs a space after the colon: write {{exact: 1.0}} (YAML reads {{exact:1.0}} "
        "as the key 'exact:1.0' with no value)"
    )
    msg = _fail(
        tmp_path, "-c", str(ROOT / "configs/quickstart.yaml"), "--rollout.rewards.weights", "{exact:0.5}"
    )
    assert msg.startswith(
        "--rollout.rewards.weights {exact:0.5}: {exact:0.5} needs a space after the colon: write {exact: 0.5}"
    )


@pytest.mark.parametrize(
    "option, expected",
    [
        (
            "allow_truncated_logprobs: true",
            "rollout.engine: HFEngine: allow_truncated_logprobs was removed: top-p/top-k/min-p/repetition "
            "penalty always work (log-probs of the processed distribution); delete the setting",
        ),
        ("batch_sise: 4", "rollout.engine: HFEngine has no setting 'batch_sise'; did you mean 'batch_size'?"),
    ],
)
def test_an_engine_option_removed_or_misspelt_is_one_line_naming_the_fix(tmp_path, option, expected):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(
        "rollout:\n  engine:\n    class_path: lit_rl.rollout.engine.HFEngine\n"
        f"    init_args:\n      {option}\n"
    )
    assert _fail(tmp_path, "-c", str(ROOT / "configs/quickstart.yaml"), "-c", str(cfg)) == expected


def test_the_renamed_learners_package_is_one_line_naming_the_new_spelling(tmp_path):
    cfg = tmp_path / "old.yaml"
    cfg.write_text("model:\n  class_path: lit_rl.modules.PolicyModule\n")
    assert _fail(tmp_path, "-c", str(ROOT / "configs/quickstart.yaml"), "-c", str(cfg)) == (
        "model: lit_rl.modules was renamed lit_rl.learners: write class_path: lit_rl.learners.<Class>"
    )


@pytest.mark.parametrize(
    "flag, expected",
    [
        (
            "--model.init_args.model",
            "model: no class is set, so model.init_args.model has nowhere to go: name the class first "
            "(--model lit_rl.learners.PolicyModule, or -c a recipe such as configs/quickstart.yaml)",
        ),
        (
            "--data.init_args.batch_size",
            "data: no class is set, so data.init_args.batch_size has nowhere to go: name the class first "
            "(--data lit_rl.data.PromptDataModule, or -c a recipe such as configs/quickstart.yaml)",
        ),
    ],
)
def test_a_setting_of_a_section_without_a_class_says_to_name_the_class(tmp_path, capsys, flag, expected):
    """Without -c (no class_path), LightningCLI checks the setting against LightningModule itself, which takes
    none: the error said "(its settings: )"."""
    from lit_rl.cli import main

    with pytest.raises(SystemExit) as e:
        main(["fit", flag, "2", "--trainer.default_root_dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"lit-rl: error: {expected}"
    assert not (tmp_path / "run").exists()
