"""``callbacks/trl_defaults.yaml`` (TRL 1.16's defaults as a fragment) trains on the quickstart and resumes on
its linear schedule; ``lit-rl explain-trl`` names the settings that differ from TRL's defaults, with both
values."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.cli import main, trl_diff

ROOT = Path(__file__).resolve().parents[1]
QS, PRESET = str(ROOT / "configs/quickstart.yaml"), str(ROOT / "callbacks/trl_defaults.yaml")
TINY = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--rollout.sampling.max_new_tokens",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


def test_preset_trains_the_quickstart_and_resumes_on_one_linear_decay(tmp_path, monkeypatch):
    """Two iterations with TRL's settings (lr 1e-6 decaying linearly to 0 at max_steps, gradient
    checkpointing, dapo's loss), then a resume extended to 4: lr_t = 1e-6 (T − t) / T with T = 2, then T = 4
    from t = 2 on."""
    from lit_rl.learners import WarmupLinearDecay
    from lit_rl.runs import log_rows

    monkeypatch.chdir(tmp_path)
    common = [
        "-c",
        QS,
        "-c",
        PRESET,
        *TINY,
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--checkpoint.every_n_iterations",
        "2",
    ]
    cli = main(["fit", *common, "--trainer.max_steps", "2"])
    h = cli.model.hparams
    assert cli.model.iteration == 2
    assert (h.gradient_checkpointing, h.policy_loss, h.loss_agg, h.std_scope) == (
        True,
        "ppo_clip",
        "token_mean",
        "group",
    )
    assert isinstance(cli.trainer.lr_scheduler_configs[0].scheduler, WarmupLinearDecay)
    main(["fit", *common, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    got = {
        int(r["step"]): r["lr-AdamW"] for r in log_rows(tmp_path / "run/logs/metrics.csv") if "lr-AdamW" in r
    }
    assert got == pytest.approx({1: 1e-6, 2: 0.5e-6, 3: 0.5e-6, 4: 0.25e-6}, abs=1e-18), got


def test_explain_names_each_difference_with_both_values(capsys):
    assert trl_diff.main(["-c", QS, "--model.init_args.loss_agg", "seq_mean_token_mean"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        "model.init_args.optimizer.init_args.lr: 0.002 here, 1e-06 under TRL 1.16's learning_rate=1e-6" in out
    )
    assert (
        "model.init_args.loss_agg: 'seq_mean_token_mean' here, 'token_mean' under TRL 1.16's "
        'loss_type="dapo"'
    ) in out
    assert "model.init_args.temperature" not in "\n".join(out)  # equal settings are not listed
    assert out[-1].startswith(f"{len(out) - 1} setting(s) differ")


def test_explain_after_the_preset_lists_only_what_it_keeps_from_lit_rl(capsys):
    assert trl_diff.main(["-c", QS, "-c", PRESET]) == 0
    keys = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert keys == [
        "model.init_args.disable_dropout",
        "trainer.precision",
        "data.init_args.batch_size",
        "trainer.log_every_n_steps",
        "checkpoint.every_n_iterations",
    ]


def test_differences_read_callbacks_and_schedules():
    """Without the whole CLI: a ReferenceKL's beta and a warmup are differences, equal values are not."""
    cfg = {
        "seed_everything": 42,
        "trainer": {
            "callbacks": [
                {"class_path": "lit_rl.callbacks.reference_kl.ReferenceKL", "init_args": {"beta": 0.04}}
            ]
        },
        "model": {
            "init_args": {
                "lr_scheduler": {
                    "class_path": "lit_rl.learners.WarmupLinearDecay",
                    "init_args": {"warmup_ratio": 0.1, "warmup_steps": 0},
                }
            }
        },
    }
    lines = trl_diff.differences(cfg)
    assert "KL to the reference: 0.04 here, 0.0 under TRL 1.16's beta=0.0 (no reference model)" in lines
    assert "warmup: 0.1 here, 0 under TRL 1.16's warmup_steps=0, warmup_ratio=0.0" in lines
    assert not [
        line for line in lines if line.startswith(("seed_everything", "model.init_args.lr_scheduler"))
    ]


@pytest.mark.parametrize(
    "loss,extra",
    [
        ("sapo", ["--model.init_args.sapo_tau_neg", "1.2"]),
        ("vespo", ["--model.init_args.vespo_lambda_pos", "2.5"]),
    ],
)
def test_trl_loss_types_train_through_the_cli(loss, extra, tmp_path, monkeypatch):
    """TRL's loss_type="sapo" / "vespo" as lit_rl settings: one iteration through PolicyModule with a
    configured parameter of the loss (the module hands it to the loss; another loss would refuse it)."""
    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "-c",
            QS,
            *TINY,
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--trainer.max_steps",
            "1",
            "--model.init_args.policy_loss",
            loss,
            "--model.init_args.skip_zero_advantage_rows",  # the loss runs on every row, whatever the rewards
            "false",
            *extra,
        ]
    )
    assert cli.model.iteration == 1 and cli.model.hparams.policy_loss == loss
    assert "actor/ratio_mean" in cli.trainer.callback_metrics


@pytest.mark.parametrize(
    "optimizer,listed",
    [
        (None, False),  # the modules' own default optimizer: fused AdamW
        ({"class_path": "torch.optim.AdamW", "init_args": {"fused": True}}, False),
        ({"class_path": "torch.optim.AdamW", "init_args": {"fused": None}}, True),  # torch's loop on a CPU
        ({"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}}, True),
    ],
)
def test_an_unfused_optimizer_step_is_a_difference(optimizer, listed):
    """TRL steps with adamw_torch_fused; a run whose optimizer step is not fused is told so."""
    cfg = {"model": {"init_args": {"optimizer": optimizer}}}
    lines = [line for line in trl_diff.differences(cfg) if line.startswith("fused optimizer step")]
    want = ['fused optimizer step: False here, True under TRL 1.16\'s optim="adamw_torch_fused"']
    assert lines == (want if listed else [])


def test_the_modules_default_optimizer_is_fused_adamw():
    """PolicyModule, RewardModelModule and CriticPretrainModule step with fused AdamW when no optimizer is
    named (TRL's adamw_torch_fused), at their documented learning rates and without weight decay."""
    import torch

    from lit_rl.learners import critic_pretrain, policy, reward_model

    params = [torch.nn.Parameter(torch.zeros(3))]
    for module, lr in ((policy, 1e-5), (reward_model, 1e-5), (critic_pretrain, 1e-4)):
        opt = module._default_optimizer(params)
        assert type(opt) is torch.optim.AdamW
        assert (opt.defaults["fused"], opt.defaults["lr"], opt.defaults["weight_decay"]) == (True, lr, 0.0)


FRAGMENT = "callbacks/trl_defaults.yaml"


def test_the_fragment_resolves_outside_a_clone(tmp_path, monkeypatch):
    """From a directory with no callbacks/ (an installed lit_rl), `-c callbacks/trl_defaults.yaml` reads the copy
    shipped inside the package: the README's command works from anywhere."""
    monkeypatch.chdir(tmp_path)
    cfg = trl_diff.resolved_config(["-c", QS, "-c", FRAGMENT])
    init = cfg["model"]["init_args"]
    assert (init["optimizer"]["init_args"]["lr"], init["gradient_checkpointing"], cfg["seed_everything"]) == (
        1e-6,
        True,
        42,
    )
    (tmp_path / "callbacks").mkdir()  # a file of that name in the working directory wins
    (tmp_path / FRAGMENT).write_text("seed_everything: 7\n")
    assert trl_diff.resolved_config(["-c", QS, "-c", FRAGMENT])["seed_everything"] == 7


def _wheel(tmp_path: Path) -> Path:
    """lit_rl built as a wheel from the package's own files (pyproject.toml, README.md, lit_rl/)."""
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lit_rl", src / "lit_rl", ignore=shutil.ignore_patterns("__pycache__"))
    code = "from setuptools import build_meta as b; print(b.build_wheel(r'%s'))" % (tmp_path / "dist")
    p = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp_path / "dist" / p.stdout.strip().splitlines()[-1]


def test_the_wheel_ships_the_fragment(tmp_path):
    import zipfile

    names = zipfile.ZipFile(_wheel(tmp_path)).namelist()
    shipped = sorted(n for n in names if n.startswith("lit_rl/cli/fragments/"))
    assert shipped == ["lit_rl/cli/fragments/trl_defaults.yaml"]
    assert (ROOT / FRAGMENT).resolve() == (ROOT / "lit_rl/cli/fragments/trl_defaults.yaml")  # one file


@pytest.mark.slow  # a fresh interpreter imports Lightning: ~20 s on 2 shared cores
def test_an_installed_lit_rl_explains_a_config_with_the_fragment(tmp_path):
    """lit_rl from its wheel (not this checkout), run in a directory outside the clone: explain-trl of a copy of
    the quickstart with `-c callbacks/trl_defaults.yaml` lists only what the fragment keeps from lit_rl."""
    import os
    import subprocess
    import sys
    import zipfile

    site = tmp_path / "site"
    zipfile.ZipFile(_wheel(tmp_path)).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.yaml").write_text(Path(QS).read_text())
    code = "import lit_rl, sys; print(lit_rl.__file__); from lit_rl.cli import console_main; console_main()"
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run(
        [sys.executable, "-c", code, "explain-trl", "-c", "mine.yaml", "-c", FRAGMENT],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == str(site / "lit_rl/__init__.py")
    assert [ln.split(":")[0] for ln in lines[1:-1]] == [
        "model.init_args.disable_dropout",
        "trainer.precision",
        "data.init_args.batch_size",
        "trainer.log_every_n_steps",
        "checkpoint.every_n_iterations",
    ]
