"""Rewards written as TRL users write them, run through the CLI: one call per batch with ``prompts``,
``completions``, ``completion_ids``, every column under its original name and ``trainer_state``; ``None`` is
"not applicable"; an unknown required parameter is a one-line error at setup; a reward failing on every row stops
the run at the first step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rl.cli import ConfigError, main
from lit_rl.rewards import RewardFailureError

ROOT = Path(__file__).resolve().parents[1]
REWARDS = """
import json, os

LOG = os.path.join(os.path.dirname(__file__), "calls.jsonl")

def accuracy(prompts, completions, completion_ids, solution, trainer_state, **kwargs):
    with open(LOG, "a") as f:
        f.write(json.dumps({"rows": len(completions), "step": trainer_state.global_step,
                            "ids": [len(i) for i in completion_ids], "solution": solution,
                            "answer": kwargs["answer"], "level": kwargs["level"],
                            "prompt_role": prompts[0][0]["role"], "kwargs": sorted(kwargs)}) + "\\n")
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

def only_level_two(completions, level, **kwargs):
    return [1.0 if lv == 2 else None for lv in level]

def needs_gold(completions, gold_answer, **kwargs):
    return [0.0 for _ in completions]

def broken(completions, **kwargs):
    raise KeyError("solution_text")
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    rows = [
        {"question": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b), "level": 1 + a % 2}
        for a in range(3)
        for b in range(3)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "trl_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("trl_rewards", None)
    return tmp_path


def _args(run, model, rewards, *extra):
    return [
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        str(model),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        run,
        "--data.init_args.train_files",
        "[train.jsonl]",
        "--data.init_args.prompt_key",
        "question",
        "--data.init_args.answer_key",
        "solution",
        "--data.init_args.batch_size",
        "4",
        "--rollout.group_size",
        "2",
        "--rollout.rewards.rewards",
        rewards,
        *extra,
    ]


def test_trl_rewards_get_columns_by_original_name_once_per_batch(user_dir, tiny_model_dir):
    cli = main(
        _args(
            "runs/trl",
            tiny_model_dir,
            "{acc: trl_rewards.accuracy, lvl: trl_rewards.only_level_two}",
            "--rollout.rewards.weights",
            "{acc: 1.0, lvl: 0.5}",
            "--trainer.max_steps",
            "2",
        )
    )
    assert cli.model.iteration == 2
    calls = [json.loads(line) for line in (user_dir / "calls.jsonl").read_text().splitlines()]
    assert [c["rows"] for c in calls] == [
        8,
        8,
    ]  # one call per step with 4 prompts x 2 completions, not 8 calls
    assert [c["step"] for c in calls] == [0, 1]
    first = calls[0]
    assert first["solution"] == first["answer"] and all(isinstance(s, str) for s in first["solution"])
    assert set(first["level"]) <= {1, 2} and first["prompt_role"] == "user"
    assert all(n >= 1 for n in first["ids"])
    assert {"answer", "domain", "uid", "level"} <= set(first["kwargs"])
    # level-1 rows: lvl does not apply (None), so those rows are valid and scored by acc alone
    m = cli.trainer.callback_metrics
    assert 0.0 < float(m["reward/lvl/none_frac"]) < 1.0 and float(m["reward/invalid_frac"]) == 0.0


def test_unknown_required_parameter_is_one_line_at_setup(user_dir, tiny_model_dir):
    with pytest.raises(
        ConfigError,
        match=r"rollout.rewards: reward 'gold': required parameter 'gold_answer' is "
        r"neither passed by the trainer nor a column of the data; available: "
        r"answer, completion_ids, completions, domain, level, log_extra, "
        r"log_metric, prompts, solution, trainer_state, uid$",
    ):
        main(_args("runs/gold", tiny_model_dir, "{gold: trl_rewards.needs_gold}", "--trainer.max_steps", "1"))
    assert not (user_dir / "runs/gold/checkpoints").exists()


def test_reward_failing_on_every_row_stops_at_the_first_step(user_dir, tiny_model_dir):
    with pytest.raises(
        RewardFailureError,
        match=r"none of the 8 rows of this scoring call has a reward. Most "
        r"frequent error \(8x\): bad: KeyError: 'solution_text'",
    ):
        main(_args("runs/broken", tiny_model_dir, "{bad: trl_rewards.broken}", "--trainer.max_steps", "2"))


def test_console_script_exit_code_for_a_broken_reward(user_dir, tiny_model_dir):
    """The issue's run: rc 0 after 2 steps with reward/invalid_frac 1.0. Now: non-zero, the error on stderr."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable,
        "-c",
        "from lit_rl.cli import console_main; console_main()",
        *_args("runs/rc", tiny_model_dir, "{bad: trl_rewards.broken}", "--trainer.max_steps", "2"),
    ]
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=600, env=env, cwd=user_dir
    )
    assert proc.returncode != 0
    assert "RewardFailureError: RewardPool: none of the 8 rows" in proc.stderr
