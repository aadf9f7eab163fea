"""A run whose input holds odd Unicode (issue 53): a prompt with U+2028, an answer with U+0085, NUL and a lone
surrogate escape, a reward's ``log_extra`` with RTL, combining marks and emoji, and a run directory named with
all of them (and a byte that is not UTF-8) -- ``lit-rl fit`` finishes with its report, ``lit-rl inspect``
rebuilds it, and ``lit-rl export`` writes the model under a directory named the same way.

Before the fix the run's report failed with a ``JSONDecodeError`` traceback (the report split the rollout file
on U+2028) and the fit exited 1 after ``final_model/`` was written; ``lit-rl inspect`` failed the same way."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR, U+0085 NEL, U+202E RIGHT-TO-LEFT OVERRIDE, U+0301 combining
# acute, NUL, the splitlines-only separators \x1c \x1d \x1e \x0b \x0c, an emoji with a ZWJ sequence
ODD = "a\u2028b\u2029c\x85d\u202eرتب\u0301e\x00f\x1c\x1d\x1e\x0b\x0cg\U0001f469\u200d\U0001f4bb"
# what a lone surrogate becomes at the boundary where text enters (data files, log_extra, file names)
FFFD = "\ufffd"

_ESC = ODD.encode("unicode_escape").decode()  # the same text as Python source escapes
REWARD = f"""
def weird(prompts, completions, log_extra, **kwargs):
    log_extra("note{_ESC}", ["{_ESC}\\udc80"] * len(completions))  # text decoded with surrogateescape
    return [1.0 if "\\u2028" in str(p) else 0.0 for p in prompts]
"""


def _bpe_model(tmp_path_factory):
    from lit_rl.models.tiny import build_tiny_model

    # byte-level BPE: every character above survives tokenize / decode (the char tokenizer maps it to <|unk|>)
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny_bpe"),
        arch="qwen2",
        layers=2,
        hidden=64,
        heads=2,
        tokenizer="bpe",
        seed=0,
    )


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    return _bpe_model(tmp_path_factory)


def _data(d: Path) -> Path:
    lines = [
        json.dumps({"prompt": f"{i}+1={ODD}", "answer": f"{i + 1}\x85\u2028\udc80"}, ensure_ascii=False)
        for i in range(2)
    ]
    # ensure_ascii=False writes U+2028 / U+0085 raw; the lone surrogate only as an escape (it has no UTF-8 form)
    path = d / f"train{ODD[:3]}.jsonl"
    path.write_text("\n".join(lines).replace("\udc80", "\\udc80") + "\n", encoding="utf-8")
    return path


def _fit_args(model: Path, data: Path, run: str) -> list[str]:
    return [
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        str(model),
        "--data.init_args.train_files",
        json.dumps([str(data)]),
        "--data.init_args.batch_size",
        "2",
        "--rollout.group_size",
        "2",
        "--rollout.rewards.rewards",
        "{weird: weird_reward.weird}",
        "--trainer.max_steps",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        run,
    ]


def _report_data(html: str) -> dict:
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.DOTALL)
    assert blob is not None
    return json.loads(blob.group(1))


def _check_run(run: Path) -> None:
    data = _report_data((run / "report.html").read_text(encoding="utf-8"))
    texts = [p[0] for p in data["prompts"]]
    assert texts and all(ODD in t for t in texts)  # the prompt as the model received it, separators kept
    assert {p[1] for p in data["prompts"]} == {f"{i + 1}\x85\u2028{FFFD}" for i in range(2)}
    extra_at = data["fields"].index("extra")
    for row in data["rows"]["1"]:
        assert row[extra_at] == {f"note{ODD}": f"{ODD}{FFFD}"}
    # every rollout line is one line for any reader, str.splitlines included (the separators are escaped)
    step = run / "rollouts/step_000001.jsonl"
    assert [json.loads(x)["completion"] for x in step.read_text(encoding="utf-8").splitlines()] == [
        json.loads(x)["completion"] for x in step.read_bytes().decode().split("\n") if x
    ]


def test_odd_unicode_run_finishes_with_its_report_inspect_and_export(
    bpe_model, tmp_path, monkeypatch, capsys
):
    from transformers import AutoModelForCausalLM

    from lit_rl.cli import main
    from lit_rl.export import main as export_main
    from lit_rl.report import main as inspect_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "weird_reward.py").write_text(REWARD, encoding="utf-8")
    # NUL cannot be in a file name; b"\xff" is not UTF-8: Python holds it as a lone surrogate (surrogateescape),
    # so TensorBoard is left out (a warning) and final_model / export are written through a temporary folder
    run_name = "run" + ODD.replace(chr(0), "") + os.fsdecode(b"\xff")
    with pytest.warns(UserWarning, match=r"line\(s\) 1, 2 held text that is not valid Unicode"):
        main(_fit_args(bpe_model, _data(tmp_path), run_name))  # the lone surrogate escapes: read as U+FFFD
    run = tmp_path / run_name
    assert (run / "final_model/config.json").is_file() and (run / "checkpoints/last.ckpt").exists()
    _check_run(run)
    (run / "report.html").unlink()
    capsys.readouterr()
    assert inspect_main([str(run)]) == 0
    assert "wrote " in capsys.readouterr().out
    _check_run(run)
    out = tmp_path / f"export{run_name}"
    assert export_main([str(run), "-o", str(out)]) == 0
    # the Rust writers take only UTF-8 paths: the files were written elsewhere and moved in; from_pretrained
    # (Rust as well) is given the same folder under a name it can take
    (tmp_path / "exported").symlink_to(out)
    AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (run / "final_model").iterdir())


@pytest.mark.slow
def test_odd_unicode_run_through_the_console_scripts(bpe_model, tmp_path):
    """The same run as a user runs it: `lit-rl fit`, `lit-rl inspect`, `lit-rl export` exit 0 (before: 1, 1)."""
    import subprocess

    (tmp_path / "weird_reward.py").write_text(REWARD, encoding="utf-8")
    run_name = f"run{ODD.replace(chr(0), '')}"
    exe = str(Path(sys.executable).with_name("lit-rl"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    fit = subprocess.run(
        [exe, *_fit_args(bpe_model, _data(tmp_path), run_name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    run = tmp_path / run_name
    _check_run(run)
    insp = subprocess.run([exe, "inspect", run_name], cwd=tmp_path, capture_output=True, text=True)
    assert insp.returncode == 0 and "Traceback" not in insp.stderr, insp.stderr[-3000:]
    out = f"export{ODD.replace(chr(0), '')}"
    exp = subprocess.run([exe, "export", run_name, "-o", out], cwd=tmp_path, capture_output=True, text=True)
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert (tmp_path / out / "config.json").is_file()


@pytest.mark.slow
def test_a_run_named_with_bytes_that_are_not_utf8_resumes(bpe_model, tmp_path, monkeypatch):
    """``--ckpt_path last`` in a run folder whose name holds U+0085, U+2028 and a byte that is not UTF-8: the run
    goes on to step 2 (before: UnicodeEncodeError from torch.load, which hands the path to C++ as UTF-8, while
    reading the checkpoint's loop state in runs.checkpoint_log_step)."""
    import torch

    from lit_rl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "weird_reward.py").write_text(REWARD, encoding="utf-8")
    run_name = "run" + ODD.replace(chr(0), "") + os.fsdecode(b"\xff")
    data = _data(tmp_path)
    with pytest.warns(UserWarning, match="not valid Unicode"):
        main(_fit_args(bpe_model, data, run_name))
    args = _fit_args(bpe_model, data, run_name)
    args[args.index("--trainer.max_steps") + 1] = "2"
    with pytest.warns(UserWarning, match="not valid Unicode"):
        main([*args, "--ckpt_path", "last"])
    with open(tmp_path / run_name / "checkpoints/last.ckpt", "rb") as f:
        assert torch.load(f, map_location="cpu", weights_only=True)["global_step"] == 2
