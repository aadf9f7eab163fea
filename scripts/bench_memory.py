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

With ``--vocab V`` it instead compares the chunked LM-head path (default: log-probs, entropy and divergences
from hidden states through ``lm_head`` chunk by chunk, ``core.fused_logprobs``) with the materialised (b, C, V)
logits path (``PolicyModule.materialize_logits``), for GRPO, GRPO + a reference-KL loss term (k3, beta 0.04)
and ``reverse_kl_full`` distillation (teacher = a copy of the model), on a model whose vocabulary is resized to V:

    python scripts/bench_memory.py --vocab 151936 --hidden 256 --completion 1024 --rows 8

One micro-batch of all ``--rows`` rows = one micro-step (forward + backward + a stateless SGD step, lr 0).
Each (variant, path) runs in a fresh subprocess; "hooks" = the experience hooks before the step (reference /
teacher log-probs, no grad), "step" = the training step; each with wall time and CPU time (getrusage user+sys of
the child, all threads: on a shared machine wall time mostly measures the scheduler). Peak = VmHWM above the RSS
just before each phase (reset through /proc/self/clear_refs). The child's address space is capped
(``--max-gb``, default: available memory - 2 GiB) so an over-large baseline fails with an allocation error
instead of waking the OOM killer.
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


def _synthetic_experience(B: int, P: int, C: int, **extra):
    """A fixed random Experience of B rows (P prompt + C completion tokens, groups of 4), as a rollout would
    hand it over, without generating."""
    import torch

    from lit_rl.data.experience import Experience

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (B, P + C), generator=g)
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones(B, P + C, dtype=torch.long),
        loss_mask=torch.ones(B, C, dtype=torch.bool),
        prompt_len=P,
        group_ids=torch.arange(B) // 4,
        rewards=torch.rand(B, generator=g),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
        **extra,
    )


def _one(name: str, args) -> dict:
    import resource

    import lightning as L
    import torch

    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.learners.critic import CriticModule
    from lit_rl.learners.protocols import experience_hooks

    state = {"rss0": 0}
    cfg = dict(CONFIGS[name])
    critic = CriticModule(**cfg.pop("critic")) if "critic" in cfg else None
    torch.manual_seed(0)
    mod = PolicyModule(model=args.model, critic=critic, micro_batch_size=args.micro_batch_size, **cfg)
    B, P, C = args.rows, 8, args.completion_len

    class SyntheticRollout(L.Callback):
        """Stands in for RolloutCallback: a fixed random Experience, same hook order, no generation."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            exp = _synthetic_experience(B, P, C)
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

    trainer = L.Trainer(
        max_steps=1,
        max_epochs=-1,
        accelerator=args.device,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SyntheticRollout()],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2))
    n_params = sum(p.numel() for p in mod.parameters())
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    elif state["rss0"] and _rss("VmHWM") >= state["rss0"]:
        peak = _rss("VmHWM") - state["rss0"]  # peak RSS since the reset, above the RSS before the step
    else:  # no resettable high-water mark: the whole process's peak
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"name": name, "peak_mib": peak / 2**20, "params": n_params}


HEAD_VARIANTS = ("grpo", "grpo+ref_kl", "reverse_kl_full")


def _one_head(spec: str, args) -> dict:
    """One (variant, path) of the --vocab comparison: peaks, wall and CPU times of the hooks and of the step."""
    import time

    import lightning as L
    import torch

    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.learners.protocols import experience_hooks

    variant, path = spec.split("@")

    def sgd(params):
        return torch.optim.SGD(params, lr=0.0)

    callbacks = []
    if variant == "reverse_kl_full":
        from lit_rl.callbacks.teachers import Teacher, TeacherRouter
        from lit_rl.learners.distill import DistillModule
        from lit_rl.models.loading import load_causal_lm

        mod = DistillModule(model=args.model, losses={"reverse_kl_full": 1.0}, optimizer=sgd)
        callbacks.append(
            TeacherRouter({"default": Teacher(model=load_causal_lm(args.model, "float32").eval())})
        )
    else:
        mod = PolicyModule(model=args.model, optimizer=sgd)
        if variant == "grpo+ref_kl":
            from lit_rl.callbacks.reference_kl import ReferenceKL

            callbacks.append(ReferenceKL(kind="k3", where="loss", beta=0.04))
    mod.materialize_logits = path == "materialised"
    B, P, C = args.rows, 8, args.completion_len
    st: dict[str, float] = {}

    class SyntheticRollout(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            exp = _synthetic_experience(B, P, C, horizon=C, prompts=[None] * B, domains=["default"] * B)
            _reset_peak_rss()
            st["rss0"], t0, c0 = _rss("VmRSS"), time.perf_counter(), _cpu_s()
            pl_module.on_experience(trainer, pl_module, exp)
            for hook in experience_hooks(trainer):
                hook.on_experience(trainer, pl_module, exp)
            batch.metrics = pl_module.compute_advantages(exp)
            batch.experience = exp
            st["hooks_s"], st["hooks_peak"] = time.perf_counter() - t0, _rss("VmHWM") - st["rss0"]
            st["hooks_cpu"] = _cpu_s() - c0
            _reset_peak_rss()
            st["rss1"], st["t1"], st["c1"] = _rss("VmRSS"), time.perf_counter(), _cpu_s()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            st["step_s"], st["step_peak"] = time.perf_counter() - st["t1"], _rss("VmHWM") - st["rss1"]
            st["step_cpu"] = _cpu_s() - st["c1"]

    trainer = L.Trainer(
        max_steps=1,
        max_epochs=-1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SyntheticRollout(), *callbacks],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2))
    return {
        "variant": variant,
        "path": path,
        "step_mib": st["step_peak"] / 2**20,
        "step_s": st["step_s"],
        "step_cpu": st["step_cpu"],
        "hooks_mib": st["hooks_peak"] / 2**20,
        "hooks_s": st["hooks_s"],
        "hooks_cpu": st["hooks_cpu"],
    }


def _cpu_s() -> float:
    """User + system CPU seconds of this process (all its threads): robust to other load on a shared machine,
    where wall time mostly measures the scheduler."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _limit_memory(gib: float) -> None:
    import resource

    lim = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 16.0


def _head_main(args) -> None:
    import shutil

    from lit_rl.models.tiny import build_tiny_model

    tmp = tempfile.mkdtemp(prefix="bench_memory_vocab_")
    d = build_tiny_model(
        tmp,
        arch="qwen2",
        layers=args.layers,
        hidden=args.hidden,
        heads=max(2, args.hidden // 64),
        tokenizer="char",
        seed=0,
    )
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(d)
    m.resize_token_embeddings(
        args.vocab, mean_resizing=False
    )  # tied head: the (V, H) weight is the embedding
    m.save_pretrained(d)
    del m
    max_gb = args.max_gb or max(2.0, _available_gib() - 2.0)
    rows = []
    for variant in HEAD_VARIANTS:
        for path in ("chunked", "materialised"):
            cmd = [
                sys.executable,
                __file__,
                "--one-head",
                f"{variant}@{path}",
                "--model",
                str(d),
                "--rows",
                str(args.rows),
                "--completion-len",
                str(args.completion_len),
                "--max-gb",
                str(max_gb),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not line:
                err = out.stderr.strip().splitlines()[-1:] or ["?"]
                print(f"{variant}@{path} failed (rc {out.returncode}): {err[0][:300]}", flush=True)
                rows.append({"variant": variant, "path": path, "failed": True})
                continue
            rows.append(json.loads(line[-1][len("RESULT ") :]))
            r = rows[-1]
            print(
                f"  {variant:<16}{path:<13} step {r['step_mib']:9.1f} MiB {r['step_s']:7.2f} s wall "
                f"{r['step_cpu']:7.2f} s CPU   hooks {r['hooks_mib']:9.1f} MiB {r['hooks_s']:6.2f} s wall "
                f"{r['hooks_cpu']:6.2f} s CPU",
                flush=True,
            )
    shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\none training micro-step ({args.rows} rows x {args.completion_len} completion tokens, vocab "
        f"{args.vocab}, hidden {args.hidden}, {args.layers} layers, float32, CPU): peak RSS above the RSS "
        f"before the phase (VmHWM reset via /proc/self/clear_refs); wall time and CPU time (getrusage, user+sys of "
        f"the child's threads); child address space <= {max_gb:.1f} GiB"
    )
    print(
        f"{'variant':<17}{'chunked MiB':>12}{'mat. MiB':>10}{'ratio':>7}{'chunked s':>11}{'mat. s':>8}{'ratio':>7}"
        f"{'chunked CPU s':>15}{'mat. CPU s':>12}{'ratio':>7}{'hooks MiB c/m':>16}"
    )
    for variant in HEAD_VARIANTS:
        new = next(r for r in rows if r["variant"] == variant and r["path"] == "chunked")
        old = next(r for r in rows if r["variant"] == variant and r["path"] == "materialised")
        if new.get("failed") or old.get("failed"):
            print(
                f"{variant:<17}{'failed' if new.get('failed') else format(new['step_mib'], '.1f'):>12}"
                f"{'failed' if old.get('failed') else format(old['step_mib'], '.1f'):>10}"
            )
            continue
        print(
            f"{variant:<17}{new['step_mib']:>12.1f}{old['step_mib']:>10.1f}{new['step_mib'] / old['step_mib']:>7.2f}"
            f"{new['step_s']:>11.2f}{old['step_s']:>8.2f}{new['step_s'] / old['step_s']:>7.2f}"
            f"{new['step_cpu']:>15.2f}{old['step_cpu']:>12.2f}{new['step_cpu'] / old['step_cpu']:>7.2f}"
            f"{new['hooks_mib']:>8.0f}/{old['hooks_mib']:<7.0f}"
        )


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
    ap.add_argument("--completion-len", "--completion", type=int, default=64)
    ap.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="compare the chunked LM-head path with materialised logits at this vocabulary size",
    )
    ap.add_argument(
        "--max-gb", type=float, default=None, help="address-space cap of each --vocab child (GiB)"
    )
    ap.add_argument("--one-head", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--micro-batch-size", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config, print JSON
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_one(args.one, args)))
        return
    if args.one_head:
        _limit_memory(args.max_gb)
        print("RESULT " + json.dumps(_one_head(args.one_head, args)))
        return
    if args.vocab:
        _head_main(args)
        return
    tmp = None
    if args.model is None:
        from lit_rl.models.tiny import build_tiny_model

        tmp = tempfile.mkdtemp(prefix="bench_memory_")
        args.model = str(
            build_tiny_model(
                tmp,
                arch="qwen2",
                layers=args.layers,
                hidden=args.hidden,
                heads=max(2, args.hidden // 64),
                tokenizer="char",
                seed=0,
            )
        )
    rows = []
    for name in CONFIGS:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--model",
            args.model,
            "--rows",
            str(args.rows),
            "--completion-len",
            str(args.completion_len),
            "--device",
            args.device,
        ]
        if args.micro_batch_size:
            cmd += ["--micro-batch-size", str(args.micro_batch_size)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(line[-1][len("RESULT ") :]))
    base = rows[0]["peak_mib"]
    what = "max_memory_allocated" if args.device == "cuda" else "peak RSS above the pre-step RSS"
    print(
        f"\npeak memory of one update step ({what}); model {args.model}, {args.rows} rows x "
        f"{args.completion_len} completion tokens, device {args.device}"
    )
    print(f"{'config':<14}{'params':>12}{'peak MiB':>12}{'x GRPO':>9}")
    for r in rows:
        print(f"{r['name']:<14}{r['params']:>12,}{r['peak_mib']:>12.1f}{r['peak_mib'] / base:>9.2f}")
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
