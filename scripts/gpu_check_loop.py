"""GPU check of the training loop without vLLM (one CUDA GPU, about a minute): the quickstart's GRPO setup
(tiny Qwen2 built on first use, HFEngine with its final logits processor, exact-answer reward) as a plain
``lightning.Trainer`` on the GPU. Sampling is untruncated, so the engine's log-probs must equal the trainer's
(with top_p < 1 they are the truncated distribution's by design).

Prints PASS/FAIL per check (exit 1 if any fails):

  1. the policy and the engine ran on CUDA and every logged loss is finite;
  2. the engine's sampled-token log-probs agree with the trainer's recomputation
     (``rollout/logprob_mismatch_kl`` < 1e-3 every iteration; fp32 on both sides);
  3. learning: the mean training reward of the last 20 iterations beats the first 20.

    python scripts/gpu_check_loop.py [--steps 150] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--accelerator", default="gpu", help="cpu: a dry run of this script on a machine without CUDA"
    )
    args = ap.parse_args()
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.models.tiny import ensure_tiny_model
    from lit_rl.rewards import ExactAnswerReward, RewardPool
    from lit_rl.rollout import SamplingConfig

    root = Path(args.out or tempfile.mkdtemp())
    model_dir = root / "model"
    ensure_tiny_model(str(model_dir), layers=2, hidden=64, heads=2, tokenizer="char", seed=0)
    L.seed_everything(0)
    rows: list[dict] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *a):
            m = {k: float(v) for k, v in trainer.callback_metrics.items()}
            m["device"] = str(next(pl_module.model.parameters()).device)
            rows.append(m)

    module = PolicyModule(
        str(model_dir), advantage="grpo", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0)
    )
    rollout = RolloutCallback(
        group_size=16,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=1),
        rewards=RewardPool({"exact": ExactAnswerReward()}),
    )
    data = PromptDataModule(
        task="addition",
        task_args={"answer_width": 1, "max_sum": 9, "unary": True, "num_operands": 3},
        batch_size=16,
    )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_steps=args.steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[rollout, Record()],
    )
    trainer.fit(module, datamodule=data)
    checks = []
    losses = [v for r in rows for k, v in r.items() if k.startswith("loss/")]
    checks.append(
        (
            f"{args.accelerator} + finite losses",
            all(r["device"].startswith("cuda" if args.accelerator == "gpu" else "cpu") for r in rows)
            and losses
            and all(math.isfinite(v) for v in losses),
            f"{len(rows)} iterations, {len(losses)} losses",
        )
    )
    kl = [r["rollout/logprob_mismatch_kl"] for r in rows if "rollout/logprob_mismatch_kl" in r]
    checks.append(
        ("engine vs trainer log-probs", bool(kl) and max(kl) < 1e-3, f"max mismatch KL {max(kl or [0]):.2e}")
    )
    rew = [r["reward/mean"] for r in rows]
    first, last = sum(rew[:20]) / 20, sum(rew[-20:]) / 20
    checks.append(("training reward rose", last > first, f"first 20: {first:.3f}, last 20: {last:.3f}"))
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.out:
        (root / "gpu_check_loop.json").write_text(
            json.dumps({"checks": [(n, bool(o), d) for n, o, d in checks], "reward": rew, "kl": kl})
        )
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
