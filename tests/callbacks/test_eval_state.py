"""Held-out evaluation leaves training state alone: a run that evaluates (greedy accuracy and the critic's
explained variance on *sampled* rollouts), is checkpointed after the evaluation and resumed, ends bitwise
where a run that never evaluated ends.

What an evaluation could leak into training, and what this compares: the run-wide group counter
(``RolloutCallback`` state ``next_group``, checkpointed), the engine's generate-call count (it keys seeded
sampling; checkpointed as the engine's state), and the global torch RNG the critic path's sampling draws from
(unseeded sampling here, so a consumed draw changes every later rollout). Runs are in this process
(``lit_rl.cli.main``), each seeded by ``seed_everything``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ITERATIONS = 4  # one optimizer step per iteration (no minibatches, one PPO epoch)


def _config(root: Path, model_dir: Path, evaluate: bool, steps: int) -> Path:
    ev = (
        """
    - class_path: lit_rl.callbacks.HeldoutEval
      init_args: {every_n_steps: 2, baseline: false, max_prompts: 4}"""
        if evaluate
        else ""
    )
    cfg = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: {steps}
  max_epochs: -1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  callbacks:{ev}
    - class_path: resume_support.SeriesRecorder
      init_args: {{path: {root}/series.jsonl}}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root}/ckpt, every_n_train_steps: 1, save_last: true}}
rollout:
  group_size: 4
  sampling: {{temperature: 1.0, max_new_tokens: 2}}
  rewards:
    class_path: lit_rl.rewards.RewardPool
    init_args:
      rewards: {{exact: {{class_path: lit_rl.rewards.ExactAnswerReward}}}}
model:
  class_path: lit_rl.learners.PolicyModule
  init_args:
    model: {model_dir}
    advantage: gae
    policy_loss: ppo_clip
    critic:
      class_path: lit_rl.learners.critic.CriticModule
      init_args: {{head: regression, share_backbone: true}}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {{lr: 0.001, weight_decay: 0.0}}
data:
  class_path: lit_rl.data.PromptDataModule
  init_args:
    task: addition
    task_args: {{answer_width: 1, max_sum: 4, unary: true}}
    batch_size: 4
"""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"recipe_{steps}.yaml"
    path.write_text(cfg)
    return path


def _assert_same_tensors(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            _assert_same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "series.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three short fits, ~2 min on the shared 2-core machine
def test_resume_after_evaluation_equals_a_run_without_evaluation(tmp_path, tiny_model_dir, monkeypatch):
    from lit_rl.cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # resume_support (the series recorder)
    plain = tmp_path / "plain"
    main(["fit", "--config", str(_config(plain, tiny_model_dir, evaluate=False, steps=ITERATIONS))])
    # Evaluates after iteration 2 (critic path included), checkpoints iteration 3 with the state after the
    # evaluation, stops; the resumed run trains iteration 4 and evaluates again after it.
    ev = tmp_path / "evaluated"
    main(["fit", "--config", str(_config(ev, tiny_model_dir, evaluate=True, steps=3))])
    assert (
        "eval/critic_explained_variance"
        in torch.load(ev / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)["callbacks"][
            "HeldoutEval"
        ]["history"][0]
    )
    main(
        [
            "fit",
            "--config",
            str(_config(ev, tiny_model_dir, evaluate=True, steps=ITERATIONS)),
            "--ckpt_path",
            "last",
        ]
    )

    want, got = _rows(plain), _rows(ev)
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want] == list(range(1, ITERATIONS + 1))
    for g, w in zip(got, want):
        it = g["iteration"]
        assert (g["prompts"], g["texts"], g["rewards"]) == (w["prompts"], w["texts"], w["rewards"]), (
            f"iteration {it}"
        )
        assert g["param_sum"] == w["param_sum"], f"iteration {it}: parameters differ"
    a = torch.load(ev / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    b = torch.load(plain / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    _assert_same_tensors(a["state_dict"], b["state_dict"], "state_dict")
    _assert_same_tensors(a["optimizer_states"], b["optimizer_states"], "optimizer_states")
    _assert_same_tensors(
        a["callbacks"]["RolloutCallback"], b["callbacks"]["RolloutCallback"], "RolloutCallback"
    )
    _assert_same_tensors(a["lit_rl_rng"], b["lit_rl_rng"], "lit_rl_rng")
