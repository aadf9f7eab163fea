"""Datasets as TRL users have them: ``datasets`` objects from Python, a dataset configuration name from the CLI
(``load_dataset(name, "main")``; no hub here, so a local directory with a README ``configs:`` block), and a
held-out split that does not exist is an error naming the splits that do (never the training data again)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets  # a core dependency (pyproject): never skipped
import pytest

from lit_rl.cli import ConfigError, main
from lit_rl.data import PromptDataModule

ROOT = Path(__file__).resolve().parents[1]
README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train.jsonl
---
"""


def _rows(n, start=0):
    return [
        {"question": [{"role": "user", "content": f"{a}+1="}], "solution": str(a + 1)}
        for a in range(start, start + n)
    ]


def _write(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def gsm_like(tmp_path) -> Path:
    """A dataset directory with two configurations, like openai/gsm8k's "main" and "socratic"."""
    root = tmp_path / "gsm_like"
    _write(root / "main/train.jsonl", _rows(6))
    _write(root / "main/test.jsonl", _rows(2, start=50))
    _write(root / "socratic/train.jsonl", _rows(3, start=100))
    (root / "README.md").write_text(README)
    return root


def test_dataset_objects_from_python():
    train = datasets.Dataset.from_list(_rows(4))
    dm = PromptDataModule(dataset=train, prompt_key="question", answer_key="solution", batch_size=2)
    assert [p.answer for p in dm.train_prompts] == ["1", "2", "3", "4"]
    dd = datasets.DatasetDict({"train": train, "test": datasets.Dataset.from_list(_rows(2, start=50))})
    dm = PromptDataModule(
        dataset=dd, heldout_split="test", prompt_key="question", answer_key="solution", batch_size=2
    )
    assert [p.answer for p in dm.heldout_prompts] == ["51", "52"]
    with pytest.raises(
        ValueError,
        match=r"heldout_split='validation': dataset='DatasetDict' has no such split; "
        r"its splits: 'train', 'test'",
    ):
        PromptDataModule(dataset=dd, heldout_split="validation", prompt_key="question", batch_size=2)


def test_one_file_has_no_test_split(tmp_path):
    """The silent wrong result of issue 26: one file plus heldout_split: test evaluated on the training rows."""
    f = _write(tmp_path / "train.jsonl", _rows(4))
    with pytest.raises(
        ValueError,
        match=r"heldout_split='test': dataset='.*train.jsonl' has no such split; its "
        r"splits: 'train'$",
    ):
        PromptDataModule(dataset=str(f), heldout_split="test", prompt_key="question", batch_size=2)
    with pytest.raises(ValueError, match="heldout_split='train' is the training split"):
        PromptDataModule(dataset=str(f), heldout_split="train", prompt_key="question", batch_size=2)


def test_dataset_config_selects_the_configuration(gsm_like):
    dm = PromptDataModule(
        dataset=str(gsm_like),
        dataset_config="main",
        heldout_split="test",
        prompt_key="question",
        answer_key="solution",
        batch_size=2,
    )
    assert (len(dm.train_prompts), [p.answer for p in dm.heldout_prompts]) == (6, ["51", "52"])
    dm = PromptDataModule(
        dataset=str(gsm_like), dataset_config="socratic", prompt_key="question", batch_size=1
    )
    assert [p.messages[0]["content"] for p in dm.train_prompts] == ["100+1=", "101+1=", "102+1="]
    with pytest.raises(
        ValueError,
        match=r"dataset_config='nope': .* has no such configuration; its configurations: "
        r"'main', 'socratic'",
    ):
        PromptDataModule(dataset=str(gsm_like), dataset_config="nope", prompt_key="question", batch_size=1)


def _fit(run_dir, *extra):
    return main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo.yaml"),
            "--trainer.max_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(run_dir),
            "--data.init_args.prompt_key",
            "question",
            "--data.init_args.answer_key",
            "solution",
            "--data.init_args.batch_size",
            "2",
            "--rollout.group_size",
            "2",
            *extra,
        ]
    )


def test_cli_dataset_config_and_missing_split(gsm_like, tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    cli = _fit(
        tmp_path / "run",
        "--model.init_args.model",
        str(tiny_model_dir),
        "--data.init_args.dataset",
        str(gsm_like),
        "--data.init_args.dataset_config",
        "main",
        "--data.init_args.heldout_split",
        "test",
    )
    assert cli.model.iteration == 1 and len(cli.datamodule.heldout_prompts) == 2
    one = _write(tmp_path / "one.jsonl", _rows(4))
    # the model does not exist either: the split error comes first, as one line
    with pytest.raises(
        ConfigError,
        match=r"heldout_split='test': dataset='.*one.jsonl' has no such split; its "
        r"splits: 'train'",
    ):
        _fit(
            tmp_path / "run2",
            "--model.init_args.model",
            "runs/nope/model",
            "--data.init_args.dataset",
            str(one),
            "--data.init_args.heldout_split",
            "test",
        )
