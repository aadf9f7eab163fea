"""Peak memory of one PPO/GRPO update step: GRPO vs PPO with a shared-backbone critic vs PPO with a separate critic.

Each configuration runs in a fresh subprocess (so peaks do not mix): build the policy (and critic) from the same
local model, feed one synthetic Experience of ``--rows`` x ``--completion-len`` tokens through the real
PolicyModule hooks (old log-probs, critic values, advantages) and one Lightning training step, and report

* CUDA: ``torch.cuda.max_memory_allocated`` over the step (reset just before it);
* CPU:  the peak resident set size during the step above the RSS just before it (Linux: the VmHWM high-water
  mark is reset through /proc/self/clear_refs; without it, the process's whole peak ``ru_maxrss``). The first
  step allocates the AdamW state (2 x trainable parameters), which is counted, as is the critic's forward.

    python scripts/bench_memory.py [--layers 4 --hidden 256 --rows 32 --completion-len 64 --device cpu]

Prints a table and the ratios to GRPO (the design target: shared critic <= 1.2x GRPO).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CONFIGS = {
    "grpo": {"advantage": "grpo"},
    "ppo_shared": {"advantage": "gae", "critic": {"share_backbone": True}},
    "ppo_separate": {"advantage": "gae", "critic": {"share_backbone": False}},
}


def _one(name: str, args) -> dict:
    import resource

    import lightning as L
    import torch

    from lit_rl.data import PromptDataModule
    from lit_rl.data.experience import Experience
    from lit_rl.modules import PolicyModule
    from lit_rl.modules.critic import CriticModule
    from lit_rl.modules.protocols import experience_hooks

    state = {"rss0": 0}
    cfg = dict(CONFIGS[name])
    critic = CriticModule(**cfg.pop("critic")) if "critic" in cfg else None
    torch.manual_seed(0)
    mod = PolicyModule(model=args.model, critic=critic, micro_batch_size=args.micro_batch_size, **cfg)
    B, P, C = args.rows, 8, args.completion_len

    class SyntheticRollout(L.Callback):
        """Stands in for RolloutCallback: a fixed random Experience, same hook order, no generation."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(5, 60, (B, P + C), generator=g)
            exp = Experience(input_ids=ids, attention_mask=torch.ones(B, P + C, dtype=torch.long),
                             loss_mask=torch.ones(B, C, dtype=torch.bool), prompt_len=P,
                             group_ids=torch.arange(B) // 4, rewards=torch.rand(B, generator=g),
                             valid=torch.ones(B, dtype=torch.bool), policy_version=torch.zeros(B, dtype=torch.long))
            exp.rollout_logprobs = torch.zeros(B, C)
            exp = exp.to(pl_module.device)
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            else:
                _reset_peak_rss()
                state["rss0"] = _rss("VmRSS")
            pl_module.on_experience(trainer, pl_module, exp)
            for hook in experience_hooks(trainer):
                hook.on_experience(trainer, pl_module, exp)
            batch.metrics = pl_module.compute_advantages(exp)
            batch.experience = exp

    trainer = L.Trainer(max_steps=1, max_epochs=-1, accelerator=args.device, devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[SyntheticRollout()])
    trainer.fit(mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2))
    n_params = sum(p.numel() for p in mod.parameters())
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    elif state["rss0"] and _rss("VmHWM") >= state["rss0"]:
        peak = _rss("VmHWM") - state["rss0"]  # peak RSS since the reset, above the RSS before the step
    else:  # no resettable high-water mark: the whole process's peak
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"name": name, "peak_mib": peak / 2**20, "params": n_params}


def _rss(field: str) -> int:
    """Bytes of /proc/self/status ``field`` (VmRSS = now, VmHWM = high-water mark); 0 when unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); silently a no-op elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: build a tiny one)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config, print JSON
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_one(args.one, args)))
        return
    tmp = None
    if args.model is None:
        from lit_rl.models.tiny import build_tiny_model

        tmp = tempfile.mkdtemp(prefix="bench_memory_")
        args.model = str(build_tiny_model(tmp, arch="qwen2", layers=args.layers, hidden=args.hidden,
                                          heads=max(2, args.hidden // 64), tokenizer="char", seed=0))
    rows = []
    for name in CONFIGS:
        cmd = [sys.executable, __file__, "--one", name, "--model", args.model, "--rows", str(args.rows),
               "--completion-len", str(args.completion_len), "--device", args.device]
        if args.micro_batch_size:
            cmd += ["--micro-batch-size", str(args.micro_batch_size)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(line[-1][len("RESULT "):]))
    base = rows[0]["peak_mib"]
    what = "max_memory_allocated" if args.device == "cuda" else "peak RSS above the pre-step RSS"
    print(f"\npeak memory of one update step ({what}); model {args.model}, {args.rows} rows x "
          f"{args.completion_len} completion tokens, device {args.device}")
    print(f"{'config':<14}{'params':>12}{'peak MiB':>12}{'x GRPO':>9}")
    for r in rows:
        print(f"{r['name']:<14}{r['params']:>12,}{r['peak_mib']:>12.1f}{r['peak_mib'] / base:>9.2f}")
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
