"""Closed name sets are Literal types: listed in --help, checked while parsing (one-line error naming the
field); registry names stay extensible through --imports."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import get_args

import pytest

from lit_rl.cli import ConfigError, main
from lit_rl.core import names

ROOT = Path(__file__).resolve().parents[1]


def test_literals_mirror_the_registries_and_tuples():
    from lit_rl.core.advantages import ADVANTAGES, STD_SCOPES
    from lit_rl.core.aggregation import AGG_MODES
    from lit_rl.core.importance import CORRECTION_LEVELS, CORRECTION_MODES
    from lit_rl.core.policy_losses import POLICY_LOSSES
    from lit_rl.data.tasks import TASKS
    from lit_rl.rollout.render import OVERLONG

    assert sorted(get_args(names.AdvantageName)) == ADVANTAGES.names()
    assert sorted(get_args(names.PolicyLossName)) == POLICY_LOSSES.names()
    assert get_args(names.LossAgg) == tuple(AGG_MODES)
    assert get_args(names.CorrectionMode) == tuple(CORRECTION_MODES)
    assert get_args(names.StdScope) == tuple(STD_SCOPES)
    assert get_args(names.CorrectionLevel) == tuple(CORRECTION_LEVELS)
    assert get_args(names.OverlongPrompts) == tuple(OVERLONG)
    assert sorted(get_args(names.TaskName)) == sorted(TASKS)


def _help(capsys, *args) -> str:
    with pytest.raises(SystemExit):
        main(list(args))
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_the_choices(capsys):
    model = _help(capsys, "fit", "--model.help", "lit_rl.learners.PolicyModule")
    assert (
        "--model.loss_agg {token_mean,seq_mean_token_mean,seq_mean_token_sum,seq_mean_token_sum_norm}"
        in model
    )
    assert "--model.rollout_correction {none,tis,mis}" in model
    assert "--model.correction_level {token,sequence,geometric}" in model
    assert "Literal['grpo', 'dr_grpo', 'rloo', 'reinforce', 'gae', 'opd']" in model
    top = _help(capsys, "fit", "--help")
    assert "--rollout.mode {sync,async}" in top and "--rollout.overlong_prompts {truncate,drop,error}" in top
    assert "--rollout.group_size GROUP_SIZE" in top and "--checkpoint.every_n_iterations" in top


@pytest.mark.parametrize(
    "precheck, expected",
    [
        (
            "1",
            "lit-rl: error: model.init_args.loss_agg: 'tokenmean' is not one of: token_mean, seq_mean_token_mean, "
            "seq_mean_token_sum, seq_mean_token_sum_norm; did you mean 'token_mean'?",
        ),  # before Lightning (precheck.py)
        (
            "0",
            "lit-rl: error: model.loss_agg: Expected a typing.Literal['token_mean', 'seq_mean_token_mean', "
            "'seq_mean_token_sum', 'seq_mean_token_sum_norm']. Got value: tokenmean",
        ),  # the full parser's, condensed
    ],
)
def test_parse_error_is_one_line_naming_the_field(tmp_path, precheck, expected):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lit_rl.cli import console_main; console_main()",
            "fit",
            "-c",
            str(ROOT / "configs/grpo.yaml"),
            "--model.init_args.loss_agg",
            "tokenmean",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "LIT_RL_PRECHECK": precheck},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [expected]


def test_a_registered_advantage_is_accepted_through_imports(tmp_path, monkeypatch, tiny_model_dir):
    name = f"mine_{uuid.uuid4().hex[:8]}"
    module = f"my_rl_ext_{name}"
    (tmp_path / f"{module}.py").write_text(
        "from lit_rl.core.advantages import ADVANTAGES\n"
        f"ADVANTAGES.register({name!r})(ADVANTAGES.get('grpo'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = [
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        str(tiny_model_dir),
        "--model.init_args.advantage",
        name,
        "--trainer.max_steps",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--data.init_args.batch_size",
        "4",
        "--rollout.group_size",
        "2",
    ]
    with pytest.raises(
        ConfigError, match=rf"advantage='{name}' is not a known advantage; valid names: dr_grpo"
    ):
        main([*args, "--trainer.default_root_dir", str(tmp_path / "a")])
    cli = main([*args, "--imports", f"[{module}]", "--trainer.default_root_dir", str(tmp_path / "b")])
    assert cli.model.hparams.advantage == name and cli.model.iteration == 1


def test_inspect_does_not_import_lightning(tmp_path):
    # `lit-rl inspect` only reads JSONL files: the console script must dispatch it before importing Lightning
    # (~13 s of imports on a 2-core machine), while `lit_rl.cli.main` stays importable from the package.
    code = (
        "import sys; sys.argv = ['lit-rl', 'inspect', '--help']\n"
        "from lit_rl.cli import console_main\n"
        "try:\n    console_main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'torch', 'transformers'))\n"
        "print('HEAVY', heavy)\n"
        "from lit_rl.cli import main, ConfigError\n"
        "import lit_rl.cli.app as app\n"
        "assert app.ConfigError is ConfigError and app.main is main\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: lit-rl inspect" in proc.stdout
    assert "HEAVY []" in proc.stdout


def _console(*args: str, cwd) -> subprocess.CompletedProcess:
    """The console script in a fresh process; prints which heavy packages it imported."""
    code = (
        "import sys\nfrom lit_rl.cli import console_main\n"
        "try:\n    console_main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'transformers', 'vllm', "
        "'jsonargparse'})\n"
        "print('HEAVY', heavy, file=sys.stderr)\nsys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )


def test_top_level_help_lists_every_command_without_heavy_imports(tmp_path):
    from lit_rl.cli import LIGHT_COMMANDS, LIGHTNING_COMMANDS

    proc = _console("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr
    usage = proc.stdout.splitlines()[0]
    for cmd in [*LIGHTNING_COMMANDS, *LIGHT_COMMANDS]:
        assert cmd in usage and f"\n  {cmd} " in proc.stdout
    assert "inspect" in LIGHT_COMMANDS and "models" in LIGHT_COMMANDS
    bare = _console(cwd=tmp_path)  # no command: the same help, on stderr, exit 2
    assert bare.returncode == 2 and usage in bare.stderr


def test_unknown_command_suggests_the_close_one_without_heavy_imports(tmp_path):
    proc = _console("fti", "-c", "x.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    err = proc.stderr.splitlines()
    assert err[0].startswith(
        "lit-rl: error: unknown command 'fti'; did you mean 'fit'? Commands: fit, validate"
    )
    assert err[1] == "HEAVY []"


def test_ckpt_path_help_says_what_last_means_here(capsys):
    fit = _help(capsys, "fit", "--help")
    assert "'last' = <run dir>/checkpoints/last.ckpt" in fit and "'last_or_new' =" in fit
    ckpt = fit[fit.index("--ckpt_path CKPT_PATH Resume") :][:600]
    assert "hpc" not in ckpt and "registry" not in ckpt  # Lightning's stock text
    assert "The checkpoint to evaluate: 'last'" in _help(capsys, "validate", "--help")
