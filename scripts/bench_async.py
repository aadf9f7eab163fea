"""Sync vs async rollouts: rows trained per second, side by side in one process.

Real generation (``HFEngine`` on the tiny model) plus long-tailed per-rollout latency: each rollout also
"waits" a log-normal time, like an agent's tool calls or a remote environment, and the rollouts of one
iteration run concurrently, so an iteration's generation takes as long as its slowest rollout (the straggler
effect). Waiting is ``time.sleep``, which releases the GIL, so the overlap with training is real.

Measured on the synchronous run: G = generation (+ rewards) seconds per iteration, T = everything else per
iteration (update, hooks, loop). A perfectly overlapped asynchronous run is at best (G + T) / max(G, T) times
faster; the target is async/sync >= 0.9 x that bound. The first ``--warmup`` iterations are not timed.

    python scripts/bench_async.py                      # ~2 minutes on 2 CPU cores
    python scripts/bench_async.py --latency-median 0.15 --max-staleness 1   # G closer to T: a higher bound

Both threads live in one Python process: with the tiny model, generation and updates are Python-bound and
share the GIL (and, on a small machine, the cores), so the compute parts of G and T overlap only partly; the
simulated latency overlaps fully. The measured fraction of the ideal bound is printed either way (on a
shared 2-core machine: ~97% with the default split latency, ~85% with --latency-order after, ~77% with
--latency-median 0.1, where G is only ~2 T and the compute parts matter more).
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

import lightning as L
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.modules import PolicyModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.engine import HFEngine, SamplingConfig


class LatencyEngine(HFEngine):
    """``HFEngine`` whose every rollout also takes a log-normal extra latency; rollouts run concurrently."""

    def __init__(self, median_s: float, sigma: float, order: str = "split", seed: int = 0):
        super().__init__(share_weights=False)  # async needs its own weight copy; sync uses the same for fairness
        self.median_s, self.sigma, self.order = median_s, sigma, order
        self.rng = random.Random(seed)  # its own RNG: leaves torch's (sampling) untouched

    def generate(self, prompt_ids, n, sampling):
        lat = [self.median_s * self.rng.lognormvariate(0.0, self.sigma) for _ in range(len(prompt_ids) * n)]
        wait = max(lat)  # the iteration waits for its slowest rollout
        before = {"before": wait, "after": 0.0, "split": wait / 2}[self.order]
        time.sleep(before)  # e.g. an environment / tool call before the model's turn
        out = super().generate(prompt_ids, n, sampling)
        time.sleep(wait - before)  # e.g. a tool call after it
        return out


class Clock(L.Callback):
    """Wall-clock marks per iteration. Put one instance before and one after the RolloutCallback."""

    def __init__(self):
        self.start: list[float] = []
        self.end: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.start.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.end.append(time.perf_counter())


class Collect(L.Callback):
    def __init__(self):
        self.metrics: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def run(model_dir, mode: str, args) -> dict[str, float]:
    L.seed_everything(0, verbose=False)
    module = PolicyModule(model=str(model_dir), rollout_correction="tis", correction_cap=2.0,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    rc = RolloutCallback(engine=LatencyEngine(args.latency_median, args.latency_sigma, args.latency_order),
                         rewards=ExactAnswerReward(),
                         group_size=args.group_size, sampling=SamplingConfig(max_new_tokens=args.max_new_tokens),
                         mode=mode, max_staleness=args.max_staleness)
    before, after, col = Clock(), Clock(), Collect()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[before, rc, after, col])
    dm = PromptDataModule(task="addition", task_args={"answer_width": 1, "max_sum": 9, "unary": True},
                          batch_size=args.batch_size)
    trainer.fit(module, datamodule=dm)
    w = args.warmup
    wall = before.end[-1] - before.start[w]
    iters = args.steps - w
    rollout_s = [a - b for a, b in zip(after.start[w:], before.start[w:])]  # time inside the rollout hook
    rows = iters * args.batch_size * args.group_size
    m = col.metrics[w:]
    return {"wall": wall, "iters": iters, "rows": rows, "rows_per_s": rows / wall,
            "rollout_s": sum(rollout_s) / iters, "iter_s": wall / iters,
            "stale_mean": sum(x.get("async/staleness_mean", 0.0) for x in m) / len(m),
            "stale_max": max(x.get("async/staleness_max", 0.0) for x in m),
            "dropped": m[-1].get("async/dropped", 0.0),
            "reward": sum(x["reward/mean"] for x in m) / len(m),
            "gen_s": sum(x["perf/generate_s"] for x in m) / len(m),
            "update_s": sum(x["perf/update_s"] for x in m) / len(m)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per iteration")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=1)
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--latency-median", type=float, default=0.3, help="seconds, per rollout")
    p.add_argument("--latency-sigma", type=float, default=0.5, help="log-normal sigma (tail heaviness)")
    p.add_argument("--latency-order", choices=("before", "after", "split"), default="split",
                   help="latency before the real generation, after it, or half each (a multi-turn agent)")
    p.add_argument("--hidden", type=int, default=64, help="tiny model width (bigger: kernels dominate Python)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval (s; Python's default 0.005): shorter GIL hand-offs between the producer "
                        "and trainer threads (tiny models are Python-bound, each torch op re-acquires the GIL)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1: 2-core machines)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny_model(d + "/tiny", arch="qwen2", layers=args.layers, hidden=args.hidden,
                                     heads=max(2, args.hidden // 32), tokenizer="char", seed=0)
        sync = run(model_dir, "sync", args)
        asyn = run(model_dir, "async", args)
    G = sync["rollout_s"]  # generation + rewards per iteration (sync: nothing else overlaps it)
    T = sync["iter_s"] - G  # training and everything else per iteration
    bound = (G + T) / max(G, T)
    speedup = asyn["rows_per_s"] / sync["rows_per_s"]
    print(f"\nmodel: qwen2 {args.layers} layers x hidden {args.hidden}; {args.batch_size} prompts x {args.group_size} samples x {args.max_new_tokens} new tokens per iteration; "
          f"per-rollout latency log-normal(median {args.latency_median}s, sigma {args.latency_sigma}, "
          f"{args.latency_order} the real generation), concurrent "
          f"rollouts; {args.steps} iterations ({args.warmup} warm-up untimed); torch threads {torch.get_num_threads()}; "
          f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms\n")
    print(f"G = {G:.3f} s generation/iteration, T = {T:.3f} s training/iteration, "
          f"ideal overlap bound (G+T)/max(G,T) = {bound:.2f}\n")
    print("| mode | iterations | rows | wall s | rows/s | s/iteration | generate s | update s | speedup vs sync "
          "| staleness mean / max | dropped rows | reward mean |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in (("sync", sync), (f"async (max_staleness={args.max_staleness})", asyn)):
        print(f"| {name} | {r['iters']} | {r['rows']} | {r['wall']:.2f} | {r['rows_per_s']:.0f} | {r['iter_s']:.3f} | {r['gen_s']:.3f} | {r['update_s']:.3f} | "
              f"{r['rows_per_s'] / sync['rows_per_s']:.2f} | {r['stale_mean']:.2f} / {r['stale_max']:.0f} | "
              f"{r['dropped']:.0f} | {r['reward']:.3f} |")
    ok = speedup >= 0.9 * bound
    print(f"\nasync / sync = {speedup:.2f}; target >= 0.9 x {bound:.2f} = {0.9 * bound:.2f}: "
          f"{'PASS' if ok else 'FAIL'} ({speedup / bound:.0%} of the ideal overlap)")


if __name__ == "__main__":
    main()
