"""Prompt data the way users have it: JSONL text or TRL conversations, column maps, Hugging Face datasets;
every bad record reported with file:line before the model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rl.cli import ConfigError, main
from lit_rl.data import PromptDataModule
from lit_rl.data.prompts import DataError, load_jsonl

ROOT = Path(__file__).resolve().parents[1]
CONV = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+3="}]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_text_and_conversational_prompts_and_extra_fields(tmp_path):
    f = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+1=", "answer": "2", "domain": "math", "uid": 7, "source": "hand"},
            {"prompt": CONV, "answer": "5"},
            {"messages": CONV[1:], "answer": "5", "metadata": {"level": 1}},
        ],
    )
    a, b, c = load_jsonl(f)
    assert (a.prompt, a.messages, a.answer, a.domain, a.uid, a.metadata) == (
        "1+1=",
        None,
        "2",
        "math",
        "7",
        {"source": "hand"},
    )
    assert (b.prompt, b.messages, b.answer, b.domain, b.uid) == (None, CONV, "5", "default", "1")
    assert c.messages == CONV[1:] and c.metadata == {"level": 1}


def test_column_map(tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"question": CONV, "solution": "5", "answer": "not this one"}])
    (p,) = load_jsonl(f, prompt_key="question", answer_key="solution")
    assert p.messages == CONV and p.answer == "5"
    # every column keeps its original name for TRL-style rewards: `solution` too (issue 26)
    assert p.metadata == {"answer": "not this one", "solution": "5"}


def test_every_bad_record_is_reported_with_its_1_based_line(tmp_path):
    f = _jsonl(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "ok", "answer": "1"},  # line 1
            "{not json",  # line 2
            "",  # line 3: blank, skipped but counted
            {"question": "no prompt key"},  # line 4
            {"prompt": [{"role": "user"}]},  # line 5: message without content
            {"prompt": 3},  # line 6
            {"prompt": "fine"},  # line 7
        ],
    )
    with pytest.raises(DataError) as e:
        load_jsonl(f)
    lines = [err.split(": ", 1)[0] for err in e.value.errors]
    assert lines == [f"{f}:2", f"{f}:4", f"{f}:5", f"{f}:6"]
    assert "missing field 'prompt'" in e.value.errors[1] and "'question'" in e.value.errors[1]
    assert "message 0" in e.value.errors[2]
    assert "must be a string or a list" in e.value.errors[3]


def test_heldout_record_without_answer_fails_when_the_datamodule_is_built(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "answer": "1"}])
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "b", "answer": "2"}, {"prompt": "c"}])
    with pytest.raises(DataError, match=rf"{held}:2: missing field 'answer'"):
        PromptDataModule(train_files=[str(train)], heldout_files=[str(held)], batch_size=1)
    # a training record may go without: a reward can read anything else from the record
    assert PromptDataModule(train_files=[str(held)], batch_size=1).train_prompts[1].answer is None


# ------------------------------------------------------------------------------ Hugging Face datasets
ROWS = [{"question": "1+1=", "solution": "2"}, {"question": CONV, "solution": "5"}]


def _expected(dm):
    return [(p.prompt, p.messages, p.answer) for p in dm.train_prompts]


@pytest.mark.parametrize("fmt", ["parquet", "json", "jsonl", "save_to_disk"])
def test_hf_dataset_local_sources_with_column_map(fmt, tmp_path):
    """The same column map reads local parquet / JSON / JSONL files and a save_to_disk (arrow) directory."""
    import datasets

    want = [("1+1=", None, "2"), (None, CONV, "5")]
    if fmt in ("json", "jsonl"):
        path = _jsonl(tmp_path / f"d.{fmt}", ROWS)
    else:  # columnar formats need one type per column: a text prompt column here
        rows = [{"question": "1+1=", "solution": "2"}, {"question": "3+4=", "solution": "7"}]
        want = [("1+1=", None, "2"), ("3+4=", None, "7")]
        ds = datasets.Dataset.from_list(rows)
        path = tmp_path / ("d.parquet" if fmt == "parquet" else "saved")
        ds.to_parquet(str(path)) if fmt == "parquet" else ds.save_to_disk(str(path))
    dm = PromptDataModule(dataset=str(path), prompt_key="question", answer_key="solution", batch_size=1)
    assert _expected(dm) == want


def test_hf_dataset_heldout_split_and_row_errors(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"q": "a", "a": "1"}, {"q": "b", "a": "2"}]),
            "test": datasets.Dataset.from_list([{"q": "c", "a": "3"}, {"q": "d", "a": None}]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    src = str(tmp_path / "dd")
    dm = PromptDataModule(dataset=src, prompt_key="q", answer_key="a", batch_size=1)
    assert [p.prompt for p in dm.train_prompts] == ["a", "b"]
    with pytest.raises(DataError, match=rf"{src}\[test\]:row 2: missing field 'a'"):
        PromptDataModule(dataset=src, heldout_split="test", prompt_key="q", answer_key="a", batch_size=1)


def test_hf_hub_dataset_name_without_network_says_so(tmp_path):
    import datasets  # noqa: F401 - a core dependency: fails, never skips, when missing

    code = (
        "from lit_rl.data import PromptDataModule\n"
        "PromptDataModule(dataset='some-org/some-dataset', batch_size=1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "dataset='some-org/some-dataset' is not a local file or directory" in last and "network" in last


# ------------------------------------------------------------------------------ through the CLI
def test_bad_data_fails_before_the_model_loads(tmp_path, monkeypatch):
    """The model path does not exist either; the data error must come first (the datamodule is checked
    before the model is built)."""
    monkeypatch.chdir(tmp_path)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"text": "x"}])
    with pytest.raises(ConfigError, match=rf"{bad}:2: missing field 'prompt'"):
        main(
            [
                "fit",
                "-c",
                str(ROOT / "configs/grpo.yaml"),
                "--model.init_args.model",
                "runs/nope/model",
                "--data.init_args.train_files",
                f"[{bad}]",
                "--trainer.default_root_dir",
                str(tmp_path / "run"),
            ]
        )


def test_own_conversational_data_trains_through_the_cli(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    rows = [
        {"question": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
        for a in range(3)
        for b in range(3)
    ]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    held = _jsonl(tmp_path / "held.jsonl", rows[:2])
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo.yaml"),
            "-c",
            str(ROOT / "callbacks/eval.yaml"),
            "--model.init_args.model",
            str(tiny_model_dir),
            "--trainer.max_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--data.init_args.train_files",
            f"[{train}]",
            "--data.init_args.heldout_files",
            f"[{held}]",
            "--data.init_args.prompt_key",
            "question",
            "--data.init_args.answer_key",
            "solution",
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "2",
            "--trainer.val_check_interval",
            "1",
        ]
    )
    assert cli.model.iteration == 1
    assert cli.datamodule.train_prompts[0].messages == rows[0]["question"]
    assert "eval/accuracy" in cli.trainer.callback_metrics
