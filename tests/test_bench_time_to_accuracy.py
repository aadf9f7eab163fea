"""scripts/bench_time_to_accuracy.py: the recipe it runs, the prompt order TRL gets, the clock that keeps
evaluation out of the training time, the summary; and (slow) its --smoke run of both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_time_to_accuracy import Clock, GreedyScorer, lit_config, recipe_knobs, report, train_order

from lit_rl.data import PromptDataModule
from lit_rl.data.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]

RECIPE = {
    "seed_everything": 0,
    "trainer": {
        "max_steps": 16,
        "callbacks": [
            {"class_path": "lit_rl.callbacks.HeldoutEval", "init_args": {"max_prompts": 64}},
            {"class_path": "lit_rl.callbacks.SaveHFModel", "init_args": {"dirpath": "final_model"}},
            {"class_path": "lit_rl.callbacks.RichIterationProgressBar"},
        ],
    },
    "rollout": {
        "engine": {"class_path": "lit_rl.rollout.vllm.VLLMEngine"},
        "group_size": 4,
        "sampling": {"temperature": 0.9, "max_new_tokens": 12},
    },
    "model": {
        "init_args": {
            "model": "runs/smollm2",
            "optimizer": {
                "class_path": "torch.optim.AdamW",
                "init_args": {"lr": 3.0e-5, "weight_decay": 0.0},
            },
        }
    },
    "data": {"init_args": {"task": "chat_addition", "task_args": {"heldout": 100}, "batch_size": 6}},
}


def test_recipe_knobs_are_what_trl_is_told():
    k = recipe_knobs(RECIPE)
    assert (k["prompts"], k["group"], k["new_tokens"], k["lr"], k["weight_decay"]) == (6, 4, 12, 3e-5, 0.0)
    assert k["sampling"] == {
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    assert (k["task"], k["task_args"], k["max_steps"]) == ("chat_addition", {"heldout": 100}, 16)
    assert k["steps_per_iteration"] == 1  # no minibatch_size: one optimizer step per generated batch


def test_minibatches_become_trls_steps_per_generation_and_epochs_are_refused():
    two = json.loads(json.dumps(RECIPE))
    two["model"]["init_args"]["minibatch_size"] = 12  # of 6 prompts x 4 samples = 24 rows
    assert recipe_knobs(two)["steps_per_iteration"] == 2
    two["model"]["init_args"]["ppo_epochs"] = 2
    with pytest.raises(SystemExit, match="ppo_epochs=2, minibatch_size=12 over 24 rows"):
        recipe_knobs(two)


def test_recipe_knobs_refuse_a_missing_field_and_a_reference_model():
    bad = json.loads(json.dumps(RECIPE))
    del bad["rollout"]["group_size"]
    with pytest.raises(SystemExit, match="no `rollout.group_size`"):
        recipe_knobs(bad)
    ref = json.loads(json.dumps(RECIPE))
    ref["trainer"]["callbacks"].append({"class_path": "lit_rl.callbacks.ReferenceKL"})
    with pytest.raises(SystemExit, match="ReferenceKL"):
        recipe_knobs(ref)


def test_lit_config_changes_only_evaluation_seed_run_dir_and_asked_limits():
    before = json.dumps(RECIPE)
    cfg = lit_config(
        RECIPE, model="/m", root="/r", seed=5, max_steps=40, lr=1e-5, clock_spec="/c.json", hf_engine=False
    )
    assert json.dumps(RECIPE) == before  # the recipe itself is untouched
    paths = [c["class_path"] for c in cfg["trainer"]["callbacks"]]
    assert paths == [
        "bench_time_to_accuracy.LitClock",
        "lit_rl.callbacks.SaveHFModel",
        "lit_rl.callbacks.RichIterationProgressBar",
    ]
    assert cfg["trainer"]["callbacks"][0]["init_args"] == {"spec": "/c.json"}
    assert (cfg["seed_everything"], cfg["trainer"]["max_steps"], cfg["trainer"]["default_root_dir"]) == (
        5,
        40,
        "/r",
    )
    assert cfg["model"]["init_args"]["model"] == "/m"
    assert cfg["model"]["init_args"]["optimizer"]["init_args"] == {"lr": 1e-5, "weight_decay": 0.0}
    assert cfg["rollout"] == RECIPE["rollout"]
    kept = lit_config(
        RECIPE, model="/m", root="/r", seed=0, max_steps=16, lr=None, clock_spec="/c", hf_engine=True
    )
    assert kept["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 3e-5
    assert kept["rollout"]["engine"] == {"class_path": "lit_rl.rollout.HFEngine"}


def test_trl_gets_the_prompts_in_lit_rls_order():
    train = get_task("chat_addition", heldout=100)[0]
    dm = PromptDataModule(task="chat_addition", task_args={"heldout": 100}, batch_size=6, seed=3)
    loader = iter(dm.train_dataloader())
    seen = [p.uid for _ in range(3) for p in next(loader).prompts]
    order = train_order(len(train), seed=3, prompts=6, iterations=3)
    assert [train[i].uid for i in order] == seen
    assert order != train_order(len(train), seed=4, prompts=6, iterations=3)  # the seed matters


def test_scorer_scores_the_completions_of_the_first_heldout_prompts(tmp_path):
    import torch

    from lit_rl.models.tiny import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny")
    scorer = GreedyScorer(str(model), "chat_addition", {"heldout": 100}, heldout=4, new_tokens=3, threads=2)
    held = get_task("chat_addition", heldout=100)[1][:4]
    assert [p.uid for p in scorer.prompts] == [p.uid for p in held]
    seen = []

    def reward(prompt, text):  # correct for the first two prompts only
        seen.append(text)
        return float(prompt.uid in (held[0].uid, held[1].uid))

    scorer.reward = reward
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert scorer(scorer.model.state_dict()) == 0.5
        assert torch.get_num_threads() == 1  # the training's thread count is back after the evaluation
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 4 and all(len(t) <= 3 and "What is" not in t for t in seen)  # completions only


class FakeScorer:
    """Hands out fixed accuracies, taking ``cost`` seconds each (an evaluation the clock must leave out)."""

    def __init__(self, accuracies, cost):
        self.accuracies, self.cost, self.calls = list(accuracies), cost, 0

    def __call__(self, state_dict):
        assert state_dict == {"w": 1}
        time.sleep(self.cost)
        self.calls += 1
        return self.accuracies.pop(0)


def _spec(**kw):
    return {"eval_every": 1, "max_s": 1e9, "max_iterations": 100, "target": 0.7, "hold": 2, **kw}


def _run(clock, iterations, step_s):
    def stop(code):
        raise SystemExit(code)

    clock.exit = stop
    clock.start(lambda: {"w": 1})
    with pytest.raises(SystemExit):
        for k in range(1, iterations + 1):
            time.sleep(step_s)  # one "iteration" of training
            clock.after(k, lambda: {"w": 1})


def _lines(out, tag):
    return [json.loads(line[len(tag) + 1 :]) for line in out.splitlines() if line.startswith(tag + " ")]


def test_clock_leaves_evaluation_out_and_stops_once_the_target_is_held(capsys):
    scorer = FakeScorer([0.1, 0.8, 0.6, 0.75, 0.9, 1.0], cost=0.25)
    _run(Clock(_spec(), scorer), iterations=10, step_s=0.05)
    out = capsys.readouterr().out
    rows = _lines(out, "EVAL")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]  # 0.75 then 0.9: held twice at iteration 4
    assert [r["accuracy"] for r in rows] == [0.1, 0.8, 0.6, 0.75, 0.9]
    assert _lines(out, "DONE") == [{"iterations": 4, "reason": "target held"}]
    # 4 iterations of 0.05 s; the five 0.25 s evaluations (1.25 s) would make it >= 1.45 s
    assert [r["train_s"] for r in rows][:1] == [0.0]
    assert 0.2 <= rows[-1]["train_s"] < 1.0
    assert all(r["eval_s"] >= 0.25 for r in rows)


def test_clock_evaluates_every_k_and_at_the_last_iteration(capsys):
    scorer = FakeScorer([0.0, 0.1, 0.2], cost=0.0)
    _run(Clock(_spec(eval_every=2, max_iterations=3), scorer), iterations=3, step_s=0.0)
    out = capsys.readouterr().out
    assert [r["iteration"] for r in _lines(out, "EVAL")] == [0, 2, 3]
    assert _lines(out, "DONE") == [{"iterations": 3, "reason": "max iterations"}]


def test_clock_stops_at_max_minutes(capsys):
    scorer = FakeScorer([0.0, 0.0, 0.0], cost=0.0)
    _run(Clock(_spec(eval_every=10, max_s=0.15), scorer), iterations=10, step_s=0.1)
    out = capsys.readouterr().out
    assert [r["iteration"] for r in _lines(out, "EVAL")] == [0, 2]  # 0.2 s of training after 2 iterations
    assert _lines(out, "DONE") == [{"iterations": 2, "reason": "max minutes"}]


def test_report_prints_times_to_target_and_the_ratio(capsys):
    def side(times_accs):
        rows = [
            {"train_s": t, "iteration": i, "accuracy": a, "eval_s": 1.0}
            for i, (t, a) in enumerate(times_accs)
        ]
        return {"rows": rows, "startup_s": 5.0, "iterations": len(rows) - 1, "reason": "target held"}

    results = {
        "lit": side([(0, 0.2), (50, 0.6), (100, 0.72), (150, 0.8)]),
        "trl": side([(0, 0.2), (200, 0.5), (400, 0.71), (600, 0.75)]),
    }
    report(results, target=0.7)
    out = capsys.readouterr().out
    assert "lit_rl  100.0 s" in out and "TRL     400.0 s" in out
    assert "ratio lit_rl / TRL: 0.25" in out
    assert "step-0 accuracy: lit_rl 0.200, TRL 0.200 (equal" in out


@pytest.mark.slow
def test_smoke_runs_both_sides_and_prints_the_table(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    script = str(ROOT / "scripts" / "bench_time_to_accuracy.py")
    cmd = [sys.executable, script, "--smoke", "--workdir", str(tmp_path), "--json", str(tmp_path / "r.json")]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=840)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    if "TRL side skipped" in out:
        pytest.skip(out.split("TRL side skipped", 1)[1].splitlines()[0])
    for name in ("lit_rl", "TRL"):
        table = out.split(f"\n{name} (2 iterations, stopped: max iterations", 1)[1].split("\n\n", 1)[0]
        rows = [line.split() for line in table.splitlines()[2:]]
        assert [int(r[1]) for r in rows] == [0, 1, 2], table
        assert float(rows[0][0]) == 0.0 < float(rows[1][0]) < float(rows[2][0]), table
    assert "step-0 accuracy:" in out and "(equal: the same weights" in out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["iteration"] for r in saved["TRL"]["rows"]] == [0, 1, 2] and saved["lit_rl"]["iterations"] == 2
    assert "ratio lit_rl / TRL: n/a (a side did not reach the target)" in out  # an untrained tiny model


def test_the_real_recipe_is_one_the_bench_can_match():
    """configs/smollm2_addition.yaml as it is now: TRL can be told its work; only evaluation is dropped."""
    import yaml

    recipe = yaml.safe_load((ROOT / "configs" / "smollm2_addition.yaml").read_text())
    k = recipe_knobs(recipe)
    assert k["task"] == "chat_addition" and k["prompts"] >= 1 and k["group"] >= 2 and k["lr"] > 0
    cfg = lit_config(
        recipe,
        model="/m",
        root="/r",
        seed=0,
        max_steps=k["max_steps"],
        lr=None,
        clock_spec="/c",
        hf_engine=False,
    )
    names = [c["class_path"] for c in cfg["trainer"]["callbacks"]]
    assert names[0] == "bench_time_to_accuracy.LitClock" and not any(n.endswith("HeldoutEval") for n in names)
    assert len(names) == len(recipe["trainer"]["callbacks"]) + 1 - sum(
        c["class_path"].endswith("HeldoutEval") for c in recipe["trainer"]["callbacks"]
    )
