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
    python scripts/bench_async.py --engine server     # generation in a vLLM server process, G ~ T (4 x 256 model,
                                                      # 8 x 8 x 32 tokens), 3 alternating sync/async repeats

``--engine server``: no simulated latency; generation is real vLLM work in a launched server process
(``VLLMServerEngine``, ``--server-threads`` CPU threads) while the trainer process trains with ``--threads``
torch threads, so the two overlap in different processes. The same sizes are also run with the thread-based
async path (``HFEngine(share_weights=False)`` in a producer thread of the trainer process), side by side.

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
from lit_rl.learners import PolicyModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.engine import HFEngine, SamplingConfig


class LatencyEngine(HFEngine):
    """``HFEngine`` whose every rollout also takes a log-normal extra latency; rollouts run concurrently."""

    def __init__(self, median_s: float, sigma: float, order: str = "split", seed: int = 0):
        super().__init__(
            share_weights=False
        )  # async needs its own weight copy; sync uses the same for fairness
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


def make_engine(kind: str, args):
    if kind == "latency":
        return LatencyEngine(args.latency_median, args.latency_sigma, args.latency_order)
    if kind == "thread":  # the in-process async path: a producer thread with its own weight copy
        return HFEngine(share_weights=False)
    from lit_rl.rollout.server import VLLMServerEngine

    return VLLMServerEngine(urls=args.server_urls)  # one server for every run (launched in main)


SERVER_LAUNCH = {"num_servers": 1, "max_model_len": 128, "max_num_seqs": 256, "kv_cache_gb": 1}


def run(model_dir, mode: str, args, kind: str = "latency") -> dict[str, float]:
    L.seed_everything(0, verbose=False)
    module = PolicyModule(
        model=str(model_dir),
        rollout_correction="tis",
        correction_cap=2.0,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
    )
    rc = RolloutCallback(
        engine=make_engine(kind, args),
        rewards=ExactAnswerReward(),
        group_size=args.group_size,
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0),
        mode=mode,
        max_staleness=args.max_staleness,
    )
    before, after, col = Clock(), Clock(), Collect()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[before, rc, after, col],
    )
    dm = PromptDataModule(
        task="addition",
        task_args={"answer_width": 1, "max_sum": 9, "unary": True},
        batch_size=args.batch_size,
    )
    trainer.fit(module, datamodule=dm)
    w = args.warmup
    wall = before.end[-1] - before.start[w]
    iters = args.steps - w
    rollout_s = [a - b for a, b in zip(after.start[w:], before.start[w:])]  # time inside the rollout hook
    rows = iters * args.batch_size * args.group_size
    m = col.metrics[w:]
    return {
        "wall": wall,
        "iters": iters,
        "rows": rows,
        "rows_per_s": rows / wall,
        "rollout_s": sum(rollout_s) / iters,
        "iter_s": wall / iters,
        "stale_mean": sum(x.get("async/staleness_mean", 0.0) for x in m) / len(m),
        "stale_max": max(x.get("async/staleness_max", 0.0) for x in m),
        "dropped": m[-1].get("async/dropped", 0.0),
        "reward": sum(x["reward/mean"] for x in m) / len(m),
        "gen_s": sum(x["perf/generate_s"] for x in m) / len(m),
        "update_s": sum(x["perf/update_s"] for x in m) / len(m),
    }


def _median_pair(pairs):
    """The (sync, async) pair whose async/sync ratio is the median of the repeats."""
    ranked = sorted(pairs, key=lambda sa: sa[1]["rows_per_s"] / sa[0]["rows_per_s"])
    return ranked[(len(ranked) - 1) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="prompts per iteration")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--latency-median", type=float, default=0.3, help="seconds, per rollout")
    p.add_argument("--latency-sigma", type=float, default=0.5, help="log-normal sigma (tail heaviness)")
    p.add_argument(
        "--latency-order",
        choices=("before", "after", "split"),
        default="split",
        help="latency before the real generation, after it, or half each (a multi-turn agent)",
    )
    p.add_argument(
        "--hidden", type=int, default=None, help="tiny model width (bigger: kernels dominate Python)"
    )
    p.add_argument("--layers", type=int, default=None)
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval (s; Python's default 0.005): shorter GIL hand-offs between the producer "
        "and trainer threads (tiny models are Python-bound, each torch op re-acquires the GIL)",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads (default 1: 2-core machines)"
    )
    p.add_argument(
        "--engine",
        choices=("latency", "server"),
        default="latency",
        help="latency: HFEngine + simulated per-rollout latency (G >> T by default); server: a vLLM "
        "server process, compared with thread-based async at the same sizes",
    )
    p.add_argument("--server-threads", type=int, default=1, help="--engine server: CPU threads of the server")
    p.add_argument(
        "--server-executor",
        choices=("uni", "mp"),
        default="uni",
        help="--engine server on CPU: uni (the launch default: model in the EngineCore) or mp (vLLM's "
        "default: a separate Worker process the EngineCore busy-polls)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="sync/async pairs per engine, alternating (median shown)"
    )
    args = p.parse_args()
    # Unset sizes follow the engine: the latency default is G >> T; the server default is G ~ T (a 4 x 256
    # model, 32 new tokens: about 0.7 s of generation against 1 s of update here), 3 alternating repeats.
    sizes = (
        {
            "steps": 8,
            "warmup": 2,
            "batch_size": 8,
            "group_size": 8,
            "max_new_tokens": 32,
            "hidden": 256,
            "layers": 4,
            "repeats": 3,
        }
        if args.engine == "server"
        else {
            "steps": 24,
            "warmup": 3,
            "batch_size": 16,
            "group_size": 16,
            "max_new_tokens": 1,
            "hidden": 64,
            "layers": 2,
            "repeats": 1,
        }
    )
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    kinds = ["latency"] if args.engine == "latency" else ["server", "thread"]
    procs = []
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny_model(
            d + "/tiny",
            arch="qwen2",
            layers=args.layers,
            hidden=args.hidden,
            heads=max(2, args.hidden // 32),
            tokenizer="char",
            seed=0,
        )
        if (
            args.engine == "server"
        ):  # launched once and shared by the runs (each run pushes its weights first)
            from lit_rl.rollout._server_http import launch_servers

            mp = (
                {
                    "extra_args": ["--distributed-executor-backend", "mp"],
                    "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
                }
                if args.server_executor == "mp"
                else {}
            )
            args.server_urls, procs = launch_servers(
                str(model_dir), {**SERVER_LAUNCH, **mp, "threads_per_server": args.server_threads}, "float32"
            )
        try:
            # sync and async alternate, repeats times: a shared machine's load drifts, and a pair run back to back
            # sees about the same load; the table shows the pair with the median async/sync ratio.
            pairs = {
                k: [
                    (run(model_dir, "sync", args, k), run(model_dir, "async", args, k))
                    for _ in range(args.repeats)
                ]
                for k in kinds
            }
        finally:
            for proc in procs:
                proc.stop()
    results = {k: _median_pair(v) for k, v in pairs.items()}
    if args.repeats > 1:
        for k, v in pairs.items():
            print(
                f"{k}: async/sync per repeat "
                + ", ".join(f"{a['rows_per_s'] / s['rows_per_s']:.2f}" for s, a in v)
            )
    print(
        f"\nmodel: qwen2 {args.layers} layers x hidden {args.hidden}; {args.batch_size} prompts x "
        f"{args.group_size} samples x {args.max_new_tokens} new tokens per iteration; "
        + (
            f"per-rollout latency log-normal(median {args.latency_median}s, sigma {args.latency_sigma}, "
            f"{args.latency_order} the real generation), concurrent rollouts; "
            if args.engine == "latency"
            else f"server: 1 vLLM server ({args.server_executor} executor) with {args.server_threads} CPU "
            f"thread(s); trainer: {args.threads} torch thread(s); "
        )
        + f"{args.steps} iterations ({args.warmup} warm-up untimed); "
        + f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms\n"
    )
    print(
        "| engine | mode | iterations | rows | wall s | rows/s | s/iteration | generate s | update s | speedup vs sync "
        "| ideal (G+T)/max(G,T) | fraction of ideal | staleness mean / max | dropped rows | reward mean |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for kind, (sync, asyn) in results.items():
        G = sync["rollout_s"]  # generation + rewards per iteration (sync: nothing else overlaps it)
        T = sync["iter_s"] - G  # training and everything else per iteration
        bound = (G + T) / max(G, T)
        speedup = asyn["rows_per_s"] / sync["rows_per_s"]
        name = {"latency": "HFEngine + latency", "server": "VLLMServerEngine", "thread": "HFEngine (thread)"}[
            kind
        ]
        for mode, r in (("sync", sync), (f"async k={args.max_staleness}", asyn)):
            vs_sync = r["rows_per_s"] / sync["rows_per_s"]
            of_ideal = "-" if r is sync else format(vs_sync / bound, ".0%")
            print(
                f"| {name} | {mode} | {r['iters']} | {r['rows']} | {r['wall']:.2f} | {r['rows_per_s']:.0f} | "
                f"{r['iter_s']:.3f} | {r['gen_s']:.3f} | {r['update_s']:.3f} | {vs_sync:.2f} | {bound:.2f} | "
                f"{of_ideal} | {r['stale_mean']:.2f} / {r['stale_max']:.0f} | {r['dropped']:.0f} | "
                f"{r['reward']:.3f} |"
            )
        ok = speedup >= 0.9 * bound
        verdicts.append(
            f"{name}: G = {G:.3f} s, T = {T:.3f} s; async / sync = {speedup:.2f}; target >= 0.9 x {bound:.2f} "
            f"= {0.9 * bound:.2f}: {'PASS' if ok else 'FAIL'} ({speedup / bound:.0%} of the ideal overlap)"
        )
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
