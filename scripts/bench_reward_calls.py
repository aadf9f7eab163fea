"""Calls and seconds per batch of a TRL-style reward with a fixed overhead per call (a reward model's forward,
a verifier service's round trip): called once per row (how lit_rl called TRL-style rewards before issue 26:
one-element lists per row) vs once per batch (now, as TRL's GRPOTrainer calls them).

    python scripts/bench_reward_calls.py [--overhead-ms 20] [--rows 64 128] [--workers 1 4]
"""

from __future__ import annotations

import argparse
import threading
import time

from lit_rl.data.prompts import Prompt
from lit_rl.rewards import RewardPool
from lit_rl.rewards.adapters import TRLRewardAdapter


def make_reward(overhead_s: float, counter: list[int]):
    lock = threading.Lock()

    def reward(prompts, completions, answer, **kwargs):
        with lock:
            counter[0] += 1
        time.sleep(overhead_s)  # fixed cost per call, whatever the batch size
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    return reward


def per_row(trl_fn):
    """The old adapter: the batched function called with one-element lists, once per row."""
    adapter = TRLRewardAdapter(trl_fn, "acc")

    def reward(prompt, completion):
        return adapter([prompt], [completion])[0]

    return reward


def run(mode: str, rows: int, workers: int, overhead_s: float, repeats: int) -> tuple[float, float]:
    counter = [0]
    fn = make_reward(overhead_s, counter)
    pool = RewardPool(
        {"acc": fn if mode == "per batch" else per_row(fn)},
        num_workers=workers,
        executor="thread",
        timeout_s=600,
    )
    prompts = [Prompt(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(rows)]
    texts = [str(i + 1) if i % 2 else "x" for i in range(rows)]
    t0 = time.monotonic()
    for _ in range(repeats):
        rb = pool.score(prompts, texts)
        assert bool(rb.valid.all())
    pool.close()
    return counter[0] / repeats, (time.monotonic() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overhead-ms", type=float, default=20.0)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    print(f"TRL-style reward, {a.overhead_ms:g} ms fixed overhead per call; mean of {a.repeats} batches")
    print(
        f"| {'rows/batch':>10} | {'workers':>7} | {'calls/batch before':>18} | {'s/batch before':>14} | "
        f"{'calls/batch after':>17} | {'s/batch after':>13} | {'speed-up':>8} |"
    )
    print("|" + "|".join("-" * (w + 2) for w in (10, 7, 18, 14, 17, 13, 8)) + "|")
    for rows in a.rows:
        for w in a.workers:
            c0, s0 = run("per row", rows, w, a.overhead_ms / 1000, a.repeats)
            c1, s1 = run("per batch", rows, w, a.overhead_ms / 1000, a.repeats)
            print(
                f"| {rows:>10} | {w:>7} | {c0:>18.0f} | {s0:>14.3f} | {c1:>17.0f} | {s1:>13.3f} | "
                f"{s0 / s1:>7.0f}x |"
            )


if __name__ == "__main__":
    main()
