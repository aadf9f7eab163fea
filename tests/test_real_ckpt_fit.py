"""`lit-rl fit`, `validate`, resume and the Hugging Face export on the real checkpoint (SmolLM2-135M-Instruct)
with the engines `tests/test_smollm2_recipe.py` does not fit with: ``HFEngine`` and ``VLLMServerEngine``
(launched), each with a full fine-tune and a LoRA; and resume (``--ckpt_path last``) compared bitwise with an
uninterrupted run, with ``HFEngine`` and the in-process ``VLLMEngine``.

Small on purpose (2 chat prompts x 2 samples, 8 new tokens, 2 iterations): these test the plumbing on a real
BPE / ChatML / pad != eos / tied-embedding checkpoint, not learning (the recipe test does that). Slow (model
loads, exports of 540 MB, a vLLM server start per server fit): marked ``slow`` and ``real_ckpt``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_rl.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.real_ckpt]

ENGINES = {
    "hf": "    class_path: lit_rl.rollout.HFEngine\n",
    "vllm": (
        "    class_path: lit_rl.rollout.vllm.VLLMEngine\n"
        "    init_args: {max_model_len: 128, kv_cache_memory_bytes: 67108864, seed: 0}\n"
    ),
    "server": (
        "    class_path: lit_rl.rollout.server.VLLMServerEngine\n"
        "    init_args:\n"
        "      launch: {num_servers: 1, max_model_len: 128, max_num_seqs: 8, kv_cache_gb: 1, timeout_s: 600}\n"
        "      request_timeout_s: 120\n      sync_timeout_s: 300\n"
    ),
}
LORA = "    lora: {r: 8, lora_alpha: 16, target_modules: all-linear}\n"


def _recipe(tmp: Path, model_dir: str, engine: str, lora: bool, steps: int) -> Path:
    cfg = f"""seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: {steps}
  max_epochs: -1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  val_check_interval: {steps}
  check_val_every_n_epoch: null
  default_root_dir: {tmp / "run"}
  callbacks:
    - class_path: lit_rl.callbacks.HeldoutEval
      init_args:
        max_prompts: 4
        scorer: {{class_path: lit_rl.rewards.LastIntReward}}
    - class_path: lit_rl.callbacks.SaveHFModel
      init_args: {{dirpath: final_model}}
rollout:
  engine:
{ENGINES[engine]}  group_size: 2
  sampling: {{temperature: 1.0, max_new_tokens: 8}}
  rewards:
    class_path: lit_rl.rewards.RewardPool
    init_args:
      rewards:
        last_int: {{class_path: lit_rl.rewards.LastIntReward}}
checkpoint:
  every_n_iterations: 1
model:
  class_path: lit_rl.learners.PolicyModule
  init_args:
    model: {model_dir}
{LORA if lora else ""}    optimizer:
      class_path: torch.optim.AdamW
      init_args: {{lr: {1e-3 if lora else 2e-5}, weight_decay: 0.0}}
data:
  class_path: lit_rl.data.PromptDataModule
  init_args:
    task: chat_addition
    task_args: {{heldout: 8}}
    batch_size: 2
"""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "recipe.yaml"  # not config.yaml: LightningCLI dumps its parsed config there
    path.write_text(cfg)
    return path


def _close(cli) -> None:
    """Stop the run's engine now (a vLLM copy of the weights / a server): several fits share this process."""
    for cb in cli.trainer.callbacks:
        if type(cb).__name__ == "RolloutCallback":
            cb.engine.close()  # every engine has close() (EngineBase: nothing to free for HFEngine)


def _heldout(cli):
    return next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "HeldoutEval")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("engine", ["hf", pytest.param("server", marks=pytest.mark.vllm)])
def test_fit_validate_and_export(smollm2_dir, tmp_path, engine, lora):
    """fit 2 iterations; `validate --ckpt_path last` reproduces the fit's last held-out evaluation (greedy, same
    weights, a fresh engine); final_model/ reloads with transformers as the policy (merged for LoRA)."""
    from transformers import AutoModelForCausalLM

    from lit_rl.models.loading import merged_state_items

    recipe = _recipe(tmp_path, smollm2_dir, engine, lora, steps=2)
    cli = main(["fit", "-c", str(recipe)])
    try:
        assert cli.model.iteration == 2
        final = _heldout(cli).history[-1]
        assert final["step"] == 2.0
        trainable = sum(p.numel() for p in cli.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in cli.model.parameters())
        assert (trainable < 0.05 * total) if lora else (trainable == total)
        policy = {n: t.detach().clone() for n, t in merged_state_items(cli.model.model)}
    finally:
        _close(cli)
    base = dict(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).named_parameters())
    out = dict(
        AutoModelForCausalLM.from_pretrained(
            tmp_path / "run" / "final_model", dtype=torch.float32
        ).named_parameters()
    )
    assert out.keys() == base.keys()
    for n, p in out.items():  # the export is the policy (merged W + BA * scale for LoRA), name for name
        torch.testing.assert_close(p, policy[n], rtol=0, atol=1e-6 if lora else 0, msg=n)
    # (2 prompts x 2 samples of 8 tokens usually all score 0: zero GRPO advantages, so the weights may not move)
    cli = main(["validate", "-c", str(recipe), "--ckpt_path", "last"])
    try:
        m = cli.trainer.callback_metrics
        assert float(m["eval/accuracy"]) == pytest.approx(final["eval/accuracy"], abs=1e-7)
        assert float(m["eval/reward_mean"]) == pytest.approx(final["eval/reward_mean"], abs=1e-7)
    finally:
        _close(cli)


def _ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _diff(a, b, where: str) -> list[str]:
    """Where two checkpoint trees differ (tensors compared bitwise)."""
    if isinstance(a, torch.Tensor):
        return (
            []
            if torch.equal(a, b)
            else [f"{where} (max |d| {float((a.double() - b.double()).abs().max()):.3g})"]
        )
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys differ"]
        return [d for k in a for d in _diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: lengths differ"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_resume_is_bitwise(smollm2_dir, tmp_path, engine):
    """4 iterations in one go vs 2, then `--ckpt_path last` to 4 in a second fit: the final parameters, Adam
    state and the engine's checkpointed state are bitwise equal (sampling seeds, data order and the rollout
    engine's seed cursor are all restored)."""

    # Each fit in a fresh process (as after a real preemption; three full fine-tunes of 135M parameters in one
    # process reached 6.4 GB of retained heap and the OOM killer on a shared machine).
    def fit(cfg, *extra):
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        p = subprocess.run(
            [sys.executable, "-m", "lit_rl.cli", "fit", "-c", str(cfg), "--trainer.callbacks", "[]", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert p.returncode == 0, p.stderr[-3000:]

    fit(_recipe(tmp_path / "straight", smollm2_dir, engine, lora=False, steps=4))
    half = _recipe(tmp_path / "resumed", smollm2_dir, engine, lora=False, steps=2)
    fit(half)
    fit(half, "--trainer.max_steps", "4", "--ckpt_path", "last")
    got = _ckpt(tmp_path / "resumed" / "run" / "checkpoints" / "last.ckpt")
    want = _ckpt(tmp_path / "straight" / "run" / "checkpoints" / "last.ckpt")
    assert got["global_step"] == want["global_step"]
    diffs = _diff(got["state_dict"], want["state_dict"], "state_dict") + _diff(
        got["optimizer_states"], want["optimizer_states"], "optimizer_states"
    )
    assert not diffs, diffs[:10]
