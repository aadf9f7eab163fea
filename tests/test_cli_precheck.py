"""The early configuration check (lit_rl/cli/precheck.py): errors that need no model, found before torch or
Lightning is imported; never a false alarm on a valid recipe; its key lists equal the real parser's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rl.cli import precheck

ROOT = Path(__file__).resolve().parents[1]
QS = str(ROOT / "configs/quickstart.yaml")


def _console(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script, reporting which heavy modules it imported (an atexit hook prints them)."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('IMPORTED', sorted(m for m in ('torch', 'lightning', 'transformers', "
        "'jsonargparse') if m in sys.modules), file=sys.stderr))\n"
        "from lit_rl.cli import console_main; console_main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args, "--trainer.default_root_dir", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--model.init_args.loss_agg", "token_meen"],
            "model.init_args.loss_agg: 'token_meen' is not one of: token_mean, seq_mean_token_mean, "
            "seq_mean_token_sum, seq_mean_token_sum_norm; did you mean 'token_mean'?",
        ),
        (
            ["--model.init_args.advantage", "grpoo"],
            "advantage='grpoo' is not a known advantage; valid names: dr_grpo, gae, grpo, opd, reinforce, "
            "rloo (or a name registered by a module given with --imports); did you mean 'grpo'?",
        ),
        (
            ["--rollout.overlong_prompts", "cut"],
            "rollout.overlong_prompts: 'cut' is not one of: truncate, drop, error",
        ),
        (
            ["--trainer.max_stepz", "3"],
            "--trainer.max_stepz is not an option; did you mean trainer.max_steps? "
            "(lit-rl fit --help lists the trainer options)",
        ),
        (
            ["--rollout.sampling.temprature", "0.5"],
            "--rollout.sampling.temprature is not an option; did you mean rollout.sampling.temperature? "
            "(lit-rl fit --help lists the rollout.sampling options)",
        ),
        (["--rollout.group_size", "0"], "rollout.group_size must be an integer >= 1, got 0"),
        (
            ["--rollout.group_size", "1"],
            "rollout.group_size=1 with model.advantage='grpo': a group-relative advantage",
        ),
    ],
)
def test_errors_before_torch_or_lightning(tmp_path, args, expected):
    proc = _console(tmp_path, "fit", "-c", QS, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.splitlines()
    assert err[0].removeprefix("lit-rl: error: ").startswith(expected), err
    assert err[1:] == ["IMPORTED []"], err  # nothing heavy was imported: this is what makes it fast
    assert not (tmp_path / "run").exists()


def test_config_file_typo_names_file_and_line(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(
        Path(QS)
        .read_text()
        .replace("  max_new_tokens", "  max_new_tokns")
        .replace(
            "sampling: {temperature: 1.0, max_new_tokens: 1}",
            "sampling: {temperature: 1.0, max_new_tokns: 1}",
        )
    )
    line = next(i for i, t in enumerate(cfg.read_text().splitlines(), 1) if "max_new_tokns" in t)
    assert precheck.check(["fit", "-c", str(cfg)]) == (
        f"{cfg}:{line}: rollout.sampling.max_new_tokns is not an option; did you mean rollout.sampling.max_new_tokens? "
        "(lit-rl fit --help lists the rollout.sampling options)"
    )


def test_a_registered_name_is_left_to_the_registry_when_imports_are_given():
    assert (
        precheck.check(["fit", "-c", QS, "--model.init_args.advantage", "mine", "--imports", "[my_pkg]"])
        is None
    )
    assert precheck.check(["fit", "-c", QS, "--model.init_args.advantage", "mine"]) is not None


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_no_false_alarm_on_any_recipe(recipe):
    assert precheck.check(["fit", "-c", str(ROOT / "configs" / recipe)]) is None
    for fragment in sorted((ROOT / "callbacks").glob("*.yaml")):
        assert precheck.check(["fit", "-c", str(ROOT / "configs" / recipe), "-c", str(fragment)]) is None, (
            fragment
        )


def test_unmodelled_command_lines_are_left_to_the_parser(tmp_path):
    assert precheck.check(["fit", "-c", QS, "--print_config"]) is None
    assert precheck.check(["fit", "--help"]) is None
    assert precheck.check(["fit", "-c", str(tmp_path / "missing.yaml")]) is None  # the parser names the file
    (tmp_path / "bad.yaml").write_text("rollout: [\n")
    assert (
        precheck.check(["fit", "-c", str(tmp_path / "bad.yaml")]) is None
    )  # a YAML error: the parser's message
    assert precheck.check(["fit", "-c", QS, "--trainer.callbacks+=lit_rl.callbacks.HeldoutEval"]) is None
    assert precheck.check(["inspect", "runs/x"]) is None


def test_key_lists_equal_the_parsers():
    """The sections' keys read from the source are exactly the options LightningCLI's parser has."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    from lit_rl.cli.app import LitRLCLI
    from lit_rl.cli.errors import parser_keys

    parser = LightningArgumentParser()
    LitRLCLI.add_arguments_to_parser(None, parser)
    parser.add_lightning_class_args(Trainer, "trainer")
    keys = parser_keys(parser)
    for section in ("rollout", "checkpoint", "trainer"):
        real = sorted({k.split(".")[1] for k in keys if k.startswith(section + ".")})
        assert precheck.section_keys(section) == real, section
    # rollout.sampling is one typed value to the parser (a SamplingConfig built from the dict): its fields
    from dataclasses import fields

    from lit_rl.rollout.engine import SamplingConfig

    assert precheck.section_keys("rollout.sampling") == sorted(f.name for f in fields(SamplingConfig))
