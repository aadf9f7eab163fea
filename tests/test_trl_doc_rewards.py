"""TRL 1.16's GRPO documentation, "Using a custom reward function": each example reward written exactly as the
docs show it (Examples 1, 1.1, 2, 3, 4, 5, 6), trained for two steps on the tiny model through ``lit-rl fit``,
with what each example promises checked in the run's files (rollouts/*.jsonl, rollouts/metrics.jsonl,
logs/metrics.csv). Plus TRL's ``reward_weights`` list, a curriculum reward reading ``trainer_state.max_steps``,
and a step that logs no value for a metric it did not measure."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from lit_rl.cli import main

# Seven short fits (~5 s each): slow, so the default suite stays under its 20 minutes (it measured 19:52).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

# --- the docs' code blocks, unchanged (one module per example: several are called reward_func) --------------
EXAMPLES = {
    "ex1": '''
def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]
''',
    "ex1_1": '''
def reward_func(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]
''',
    "ex2": '''
import re

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
''',
    "ex3": r"""
import re

def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
""",
    # the docs leave check_math_solution / test_code_solution to the reader
    "ex4": """
def check_math_solution(prompt, completion):
    return completion.strip() == "4"

def test_code_solution(prompt, completion):
    return "def" in completion

# Math-specific reward function
def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards

# Coding-specific reward function
def coding_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "coding":
            # Calculate coding-specific reward
            works = test_code_solution(prompt, completion)
            reward = 1.0 if works else -1.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards
""",
    "ex5": """
import asyncio

async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]
""",
    "ex6": r"""
import re

def reward_func(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    extracted = [m.group(1) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]

    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])

    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))

    return rewards
""",
    # not in the docs: the curriculum TRL users write from trainer_state (issue 36), and a step-1-only None
    "curriculum": """
import json, os

def curriculum(completions, trainer_state, **kwargs):
    with open(os.path.join(os.path.dirname(__file__), "states.jsonl"), "a") as f:
        f.write(json.dumps({k: getattr(trainer_state, k) for k in
                            ("global_step", "max_steps", "epoch", "num_train_epochs")} |
                           {"history": len(trainer_state.log_history)}) + "\\n")
    if trainer_state.global_step == 0:
        return [None] * len(completions)
    return [trainer_state.global_step / trainer_state.max_steps for _ in completions]
""",
}


@pytest.fixture
def trl_dir(tmp_path, monkeypatch):
    for name, code in EXAMPLES.items():
        (tmp_path / f"{name}.py").write_text(code)
        sys.modules.pop(name, None)
    # 8 prompts: two batches of 4 per epoch (Lightning keeps step values for an epoch: the stale-metric check
    # needs two steps in one)
    text = [
        {"prompt": f"What is {a}+{b}? Solution:", "ground_truth": str(a + b)}
        for a in range(4)
        for b in range(2)
    ]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text))
    chat = [
        {"prompt": [{"role": "user", "content": f"What is {a}*2?"}], "ground_truth": str(2 * a)}
        for a in range(4)
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    tasks = [
        {"prompt": "What is 2+2?", "task": "math"},  # Example 4's dataset, as the docs build it
        {"prompt": "Write a function that returns the sum of two numbers.", "task": "code"},
        {"prompt": "What is 3*4?", "task": "math"},
        {"prompt": "Write a function that returns the product of two numbers.", "task": "code"},
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def fit(model, data: str, rewards: str, *extra: str):
    """Two steps, 4 prompts x 2 completions of up to 8 tokens, every row in the rollout files."""
    return main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo.yaml"),
            "--model.init_args.model",
            str(model),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            "run",
            "--trainer.max_steps",
            "2",
            "--data.init_args.train_files",
            f"[{data}]",
            "--data.init_args.answer_key",
            "ground_truth",
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "2",
            "--rollout.sampling.max_new_tokens",
            "8",
            "--rollout.rewards.rewards",
            rewards,
            *extra,
        ]
    )


def rows(step: int) -> list[dict]:
    return [json.loads(x) for x in Path(f"run/rollouts/step_{step:06d}.jsonl").read_text().splitlines()]


def jsonl_metrics() -> dict[int, dict]:
    lines = [json.loads(x) for x in Path("run/rollouts/metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines if "reward/mean" in m or "reward/invalid_frac" in m}


def csv_metrics() -> dict[int, dict]:
    (path,) = Path("run").glob("logs/**/metrics.csv")
    out: dict[int, dict] = {}
    for r in csv.DictReader(path.open()):
        if r.get("step"):
            out.setdefault(int(float(r["step"])), {}).update({k: v for k, v in r.items() if v != ""})
    return out


def test_examples_1_1_1_3_with_trl_weight_list(trl_dir, tiny_model_dir):
    """Example 1 (completion_ids only), 1.1 and 3 (a dataset column); reward_weights as TRL's list, in order."""
    fit(
        tiny_model_dir,
        "text.jsonl",
        "{tokens: ex1.reward_func, chars: ex1_1.reward_func, acc: ex3.reward_func}",
        "--rollout.rewards.weights",
        "[1.0, 0.01, 0.5]",
    )
    for step in (1, 2):
        for r in rows(step):
            c = r["components"]
            assert c["tokens"] == r["length"]  # Example 1: one score per completion token
            assert c["chars"] == len(r["completion"])  # Example 1.1 on the decoded text
            assert c["acc"] == (1.0 if f"\\boxed{{{r['answer']}}}" in r["completion"] else 0.0)
            assert r["reward"] == pytest.approx(
                1.0 * c["tokens"] + 0.01 * c["chars"] + 0.5 * c["acc"], abs=1e-5
            )
    m = jsonl_metrics()
    assert sorted(m) == [1, 2] and all(m[s]["reward/invalid_frac"] == 0.0 for s in m)


def test_wrong_weight_list_length_is_one_error_before_the_model_loads(trl_dir, tiny_model_dir):
    with pytest.raises(
        ValueError,
        match=r"RewardPool: weights has 2 entries but there are 3 rewards "
        r"\(tokens, chars, acc\); give one weight per reward in that order",
    ):
        fit(
            tiny_model_dir,
            "text.jsonl",
            "{tokens: ex1.reward_func, chars: ex1_1.reward_func, acc: ex3.reward_func}",
            "--rollout.rewards.weights",
            "[1.0, 0.01]",
        )
    assert not Path("run/rollouts").exists()


def test_example_2_conversational_and_example_5_async(trl_dir, tiny_model_dir):
    fit(tiny_model_dir, "chat.jsonl", "{fmt: ex2.format_reward_func, nonempty: ex5.async_reward_func}")
    for step in (1, 2):
        for r in rows(step):
            assert r["components"]["fmt"] == 0.0  # a random tiny model never writes <think>...</answer>
            assert r["components"]["nonempty"] == (
                1.0 if r["completion"] else 0.0
            )  # awaited, not a coroutine
            assert r["error"] is None
    assert all(m["reward/nonempty/errors"] == 0.0 for m in jsonl_metrics().values())


def test_example_4_multi_task_none_and_unscored_rows(trl_dir, tiny_model_dir):
    """The docs' functions test ``t == "coding"`` on a dataset whose tag is "code": the code rows get None from
    both rewards. They are unscored (no reward, advantage 0, counted), and the run goes on."""
    cli = fit(tiny_model_dir, "tasks.jsonl", "{math: ex4.math_reward_func, coding: ex4.coding_reward_func}")
    assert cli.model.iteration == 2
    m = jsonl_metrics()
    for step in (1, 2):
        code = [
            r for r in rows(step) if r["prompt"].rstrip().endswith("numbers.") or "function" in r["prompt"]
        ]
        assert len(code) == 4  # 2 code prompts x 2 completions
        for r in code:
            assert r["reward"] is None and r["advantage"] == 0.0
            assert r["components"] == {"math": None, "coding": None}
        for r in rows(step):
            if r not in code:
                assert r["reward"] == r["components"]["math"] in (1.0, -1.0)
        assert m[step]["reward/none_rows"] == 4.0 and m[step]["reward/coding/none_frac"] == 1.0
        assert m[step]["reward/math/none_frac"] == 0.5 and m[step]["reward/invalid_frac"] == 0.5


def test_example_6_log_extra_and_log_metric_reach_the_logs(trl_dir, tiny_model_dir):
    fit(tiny_model_dir, "text.jsonl", "{acc: ex6.reward_func}")
    m, logged = jsonl_metrics(), csv_metrics()
    for step in (1, 2):
        rs = rows(step)
        for r in rs:
            assert r["extra"]["golden_answer"] == r["answer"]
            assert r["extra"]["extracted_answer"] == "[none]"  # no \boxed{} from a random model
        acc = sum(r["components"]["acc"] for r in rs) / len(rs)
        assert m[step]["reward/acc/accuracy"] == acc
        assert float(logged[step]["reward/acc/accuracy"]) == pytest.approx(acc)
    assert '"golden_answer"' in Path("run/report.html").read_text()  # the report's rows carry the columns too


def test_curriculum_trainer_state_and_no_stale_metric(trl_dir, tiny_model_dir):
    """trainer_state carries TRL's fields; the curriculum's none_frac exists at step 1 only, and metrics.csv
    must not repeat it at step 2 (Lightning used to re-send step 1's value)."""
    fit(tiny_model_dir, "text.jsonl", "{tokens: ex1.reward_func, cur: curriculum.curriculum}")
    states = [json.loads(x) for x in Path("states.jsonl").read_text().splitlines()]
    assert states == [
        {"global_step": 0, "max_steps": 2, "epoch": 0.0, "num_train_epochs": 1, "history": 0},
        {"global_step": 1, "max_steps": 2, "epoch": 0.5, "num_train_epochs": 1, "history": 1},
    ]
    assert all(r["components"]["cur"] == 0.5 for r in rows(2))  # global_step 1 / max_steps 2
    m, logged = jsonl_metrics(), csv_metrics()
    assert m[1]["reward/cur/none_frac"] == 1.0 and "reward/cur/none_frac" not in m[2]
    assert float(logged[1]["reward/cur/none_frac"]) == 1.0
    assert "reward/cur/none_frac" not in logged[2]  # not measured at step 2: not logged at step 2
    assert (
        float(logged[2]["reward/cur"]) == 0.5 and "reward/cur" not in logged[1]
    )  # NaN at step 1: not logged


def test_a_reward_returning_none_for_every_row_does_not_stop_the_run(trl_dir, tiny_model_dir):
    (trl_dir / "never.py").write_text(
        "def never(completions, **kwargs):\n    return [None] * len(completions)\n"
    )
    cli = fit(tiny_model_dir, "text.jsonl", "{never: never.never}")
    assert cli.model.iteration == 2
    m = jsonl_metrics()
    assert [m[s]["reward/none_rows"] for s in (1, 2)] == [8.0, 8.0]
    assert all(r["reward"] is None and r["advantage"] == 0.0 for s in (1, 2) for r in rows(s))
