"""Exact resume and atomic checkpoints, with real `lit-rl fit` processes killed by SIGKILL.

The recipe exercises every stateful piece: a Curriculum (edits the prompts), RolloutCallback (HFEngine
sampling with torch's global RNG), adaptive ReferenceKL and EntropyRegularization controllers, minibatch
shuffles seeded by the module's iteration counter, and a 12-prompt task so Lightning epochs (new dataloader
iterators) end both before and after the kill. The reference run goes uninterrupted in this process; the
killed and the resumed runs are fresh processes, as after a real preemption.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
ITERATIONS = 5  # 3 prompt batches per Lightning epoch: an epoch ends after iteration 3
ROWS = 16  # batch_size 4 x group_size 4 reward calls per iteration
STEPS_PER_ITER = 2  # minibatch_size 8 of 16 rows


def _config(root: Path, model_dir: Path) -> Path:
    cfg = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: {ITERATIONS * STEPS_PER_ITER}
  max_epochs: -1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  callbacks:
    - class_path: lit_rl.callbacks.Curriculum
      init_args: {{min_visits: 1, window: 2, retired_weight: 0.5}}
    - class_path: lit_rl.callbacks.RolloutCallback
      init_args:
        group_size: 4
        sampling: {{temperature: 1.0, max_new_tokens: 2}}
        rewards:
          class_path: lit_rl.rewards.RewardPool
          init_args:
            rewards:
              exact: {{class_path: resume_support.KillingReward}}
    - class_path: lit_rl.callbacks.ReferenceKL
      init_args: {{path: {model_dir}, target_kl: 0.01, beta: 0.05}}
    - class_path: lit_rl.callbacks.EntropyRegularization
      init_args: {{coef: 0.001, band: [4.0, 4.5]}}
    - class_path: resume_support.SeriesRecorder
      init_args: {{path: {root}/series.jsonl}}
    - class_path: resume_support.CheckpointKiller
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root}/ckpt, every_n_train_steps: 1, save_last: true}}
model:
  class_path: lit_rl.learners.PolicyModule
  init_args:
    model: {model_dir}
    minibatch_size: 8
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
    path = root / "recipe.yaml"  # not config.yaml: LightningCLI dumps its parsed config there
    path.write_text(cfg)
    return path


def _fit(config: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 240):
    """`lit-rl fit` in a fresh process (PYTHONPATH carries the test instruments)."""
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "lit_rl.cli", "fit", "--config", str(config), *extra],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "series.jsonl").read_text().splitlines()]


def _state(ckpt: Path) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=False)


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir):
    """The uninterrupted run, in this process: its per-iteration rows and its final checkpoint."""
    from lit_rl.cli import main

    root = tmp_path_factory.mktemp("reference")
    main(["fit", "--config", str(_config(root, tiny_model_dir))])
    rows = _rows(root)
    assert [r["iteration"] for r in rows] == list(range(1, ITERATIONS + 1))
    return rows, root / "ckpt" / "last.ckpt"


def _check_resumed(reference, root: Path, resumed_from: int) -> None:
    """Rows after the resume point equal the reference's; the prompts seen over both processes are the
    reference's multiset; the final parameters and optimizer state are bitwise the reference's."""
    ref_rows, ref_ckpt = reference
    rows = _rows(root)
    # Rows of the killed process up to its last complete checkpoint, then the resumed process's rows. (A killed
    # process may have logged an iteration whose checkpoint never completed: that one is trained again.)
    after = [r for r in rows if r["pid"] == rows[-1]["pid"]]
    before = [r for r in rows if r["pid"] != rows[-1]["pid"] and r["iteration"] <= resumed_from]
    assert [r["iteration"] for r in before] == list(range(1, resumed_from + 1))
    assert [r["iteration"] for r in after] == list(range(resumed_from + 1, ITERATIONS + 1))
    for got, want in zip(after, ref_rows[resumed_from:]):
        it = got["iteration"]
        assert got["prompts"] == want["prompts"], f"iteration {it}: prompts differ"
        assert got["texts"] == want["texts"], f"iteration {it}: sampled completions differ"
        assert got["rewards"] == want["rewards"], f"iteration {it}: rewards differ"
        assert got["series"].keys() == want["series"].keys()
        for k, v in want["series"].items():
            assert got["series"][k] == pytest.approx(v, rel=0, abs=1e-6), f"iteration {it}: {k}"
        assert got["param_sum"] == want["param_sum"], f"iteration {it}: parameters differ"
    seen = Counter(u for r in before + after for u in r["prompts"])
    assert seen == Counter(u for r in ref_rows for u in r["prompts"])
    got, want = _state(root / "ckpt" / "last.ckpt"), _state(ref_ckpt)
    _assert_same_tensors(got["state_dict"], want["state_dict"], "state_dict")
    _assert_same_tensors(got["optimizer_states"], want["optimizer_states"], "optimizer_states")
    ours = {
        k: v for k, v in want["callbacks"].items() if not k.startswith("ModelCheckpoint")
    }  # it holds paths
    _assert_same_tensors({k: got["callbacks"][k] for k in ours}, ours, "callbacks")
    assert got["lit_rl_policy"] == want["lit_rl_policy"]


def test_checkpoint_carries_resume_state(reference):
    ckpt = _state(reference[1])
    assert ckpt["lit_rl_policy"] == {"iteration": ITERATIONS, "skipped_steps": 0, "nonfinite_in_a_row": 0}
    (rng,) = ckpt["lit_rl_rng"]["per_rank"]
    assert {"torch", "numpy", "python"} <= rng.keys()
    assert ckpt["PromptDataModule"]["sampler_pos"] == ITERATIONS * 4
    # the training loader's own state, where Lightning looks before calling a mid-epoch resume exact
    assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"sampler_pos": ITERATIONS * 4}]
    names = " ".join(ckpt["callbacks"])
    for cb in ("Curriculum", "RolloutCallback", "ReferenceKL", "EntropyRegularization"):
        assert cb in names
    assert (
        ckpt["callbacks"]["RolloutCallback"]["policy_version"] == ITERATIONS
    )  # one weight push per iteration
    assert torch.load(reference[1], map_location="cpu", weights_only=True)  # no pickled objects needed


def test_sigkill_mid_rollout_then_resume_is_exact(reference, tmp_path, tiny_model_dir):
    kill_at = random.Random().randint(2, ITERATIONS)  # the iteration whose rollout is killed
    call = (kill_at - 1) * ROWS + random.Random().randint(1, ROWS)  # a reward call inside that rollout
    print(f"killing iteration {kill_at} at reward call {call}")  # shown when the test fails
    cfg = _config(tmp_path, tiny_model_dir)
    killed = _fit(cfg, env={"LIT_RL_TEST_KILL_AT_CALL": str(call)})
    assert killed.returncode == -signal.SIGKILL, f"kill_at={kill_at}: {killed.stderr[-3000:]}"
    assert [r["iteration"] for r in _rows(tmp_path)] == list(range(1, kill_at))
    resumed = _fit(cfg, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stderr + resumed.stdout  # Lightning's "unreliable results" warning
    _check_resumed(reference, tmp_path, resumed_from=kill_at - 1)


def test_sigkill_during_checkpoint_write_keeps_previous_checkpoint(reference, tmp_path, tiny_model_dir):
    """Each iteration writes two files (the step checkpoint, then last.ckpt); the 7th write is iteration 4's
    step checkpoint, killed with half its bytes written. last.ckpt must still be iteration 3's, intact."""
    from lit_rl.cli import main

    cfg = _config(tmp_path, tiny_model_dir)
    killed = _fit(cfg, env={"LIT_RL_TEST_KILL_IN_SAVE": "7"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = _state(tmp_path / "ckpt" / "last.ckpt")
    assert last["lit_rl_policy"]["iteration"] == 3 and last["global_step"] == 3 * STEPS_PER_ITER
    names = sorted(p.name for p in (tmp_path / "ckpt").glob("*.ckpt"))
    # ModelCheckpoint's {step} is the logged step, the RL iteration (3; global_step is 6): one numbering everywhere
    assert names == ["epoch=0-step=3.ckpt", "last.ckpt"], (
        f"a torn checkpoint is visible under its name: {names}"
    )
    (torn,) = (tmp_path / "ckpt").glob(".*.tmp")  # the half-written bytes reached the disk, under a temp name
    with pytest.raises(Exception):  # noqa: B017 - the error type depends on where the write was cut
        torch.load(torn, map_location="cpu", weights_only=True)
    # The resumed run (in this process) continues from iteration 3 exactly; rewriting that file clears the debris.
    main(["fit", "--config", str(cfg), "--ckpt_path", "last"])
    _check_resumed(reference, tmp_path, resumed_from=3)
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))
