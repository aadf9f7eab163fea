"""Reward throughput: RewardPool with 1 vs 2 workers on CPU-bound rewards, and per-reward latency.

Two CPU-bound rewards, each calibrated to about ``--work`` seconds of pure computation per call:

* ``code_tests``: ``CodeTestsReward`` on a candidate whose function burns CPU, run in the real sandbox
  (thread executor: the work happens in sandboxed child processes, so threads run in parallel);
* ``py_cpu``: a pure-Python reward function (process executor: forked workers sidestep the GIL).
  ``py_cpu`` on the thread executor is printed too, to show why the process executor exists.

Throughput is completions per second over one ``RewardPool.score`` call (after a warm-up call); latency is
the pool's ``perf/reward_<name>_call_s``. The target is >= 1.7x with 2 workers; that needs 2 idle cores, so
the load average and the machine's own ceiling (two plain processes together vs in turn) are printed too.

Second table (``--section budget``): sandboxed evaluations/s of a 5-test program through a 2-worker
``RewardPool``, for mixes of passing and hanging candidates, with the old per-test wall budget
(``budget="per_test"``: a hang costs 5 x timeout) and the per-program budget (``budget="program"``: a hang
costs one timeout) side by side, plus each run's worst evaluation time (``timeout + 1 s`` is the target).

    python scripts/bench_rewards.py [--n 16] [--work 0.15] [--section all|pool|budget] [--timeout 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from lit_rl.data.prompts import Prompt
from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.pool import RewardPool
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

_ITERS = {"n": 1_000_000}  # loop length of ~`work` seconds, set by calibrate()


def _burn(n: int) -> int:
    x = 0
    for i in range(n):
        x += i & 7
    return x


def calibrate(work_s: float) -> int:
    t0 = time.perf_counter()
    _burn(200_000)
    per_iter = (time.perf_counter() - t0) / 200_000
    return max(10_000, int(work_s / per_iter))


def machine_ceiling(n: int) -> float:
    """Speed-up of 2 plain (unsandboxed, trusted) burn processes run together vs one after the other: the most
    any 2-worker pool can reach on this machine right now."""
    cmd = [sys.executable, "-S", "-c", f"x = 0\nfor i in range({n}): x += i & 7"]
    t0 = time.perf_counter()
    for _ in range(2):
        subprocess.run(cmd, check=True)
    seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(lambda _: subprocess.run(cmd, check=True), range(2)))
    return seq / (time.perf_counter() - t0)


def py_cpu(prompt, completion: str) -> float:
    """A CPU-bound pure-Python reward: burns ~work seconds, then checks the answer."""
    _burn(_ITERS["n"])
    return float(completion.strip() == str(prompt.answer))


def run_case(name: str, fn, executor: str, workers: int, prompts, completions) -> dict:
    pool = RewardPool({name: fn}, timeout_s=120.0, num_workers=workers, executor=executor)
    try:
        pool.score(prompts[:workers], completions[:workers])  # warm-up: spawn workers / threads
        t0 = time.perf_counter()
        batch = pool.score(prompts, completions)
        wall = time.perf_counter() - t0
    finally:
        pool.close()
    assert bool(batch.valid.all()), f"{name}: infra errors {batch.errors}"
    return {
        "wall": wall,
        "tput": len(prompts) / wall,
        "lat": batch.metrics[f"perf/reward_{name}_call_s"],
        "mean": float(batch.total.mean()),
    }


ADD_OK = "def add(a, b):\n    return a + b\n"
ADD_HANG = "def add(a, b):\n    while True:\n        pass\n"


def budget_table(n: int, timeout: float) -> None:
    """Evaluations/s of a 5-test program, pass/hang mixes, per-test vs per-program wall budget."""
    tests = [{"call": "add", "args": [i, 2], "expected": i + 2} for i in range(5)]
    sandbox = Sandbox(SandboxLimits(cpu_s=max(1, int(timeout) + 1)), timeout_s=timeout)
    prompts = [Prompt(prompt="add", metadata={"tests": tests}) for _ in range(n)]
    print(
        f"\n# 5-test program, timeout_s={timeout}, {n} evaluations per mix, RewardPool thread x2, "
        f"cgroup={sandbox.cgroups.version}, load1={os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'hang share':>10} | {'per_test eval/s':>15} {'max eval s':>10} {'ok':>4} | {'program eval/s':>14} "
        f"{'max eval s':>10} {'ok':>4} | {'speed-up':>8}"
    )
    for hang_share in (0.0, 0.25, 0.5, 1.0):
        n_hang = round(n * hang_share)
        completions = [ADD_HANG] * n_hang + [ADD_OK] * (n - n_hang)
        row = {}
        for budget in ("per_test", "program"):
            reward = CodeTestsReward("binary", timeout_s=timeout, sandbox=sandbox, budget=budget)
            walls: list[float] = []

            def timed(prompt, completion, reward=reward, walls=walls):
                t0 = time.perf_counter()
                out = reward(prompt, completion)
                walls.append(time.perf_counter() - t0)
                return out

            timed.name = "code_tests"
            pool = RewardPool(
                {"code_tests": timed}, timeout_s=5 * timeout + 60, num_workers=2, executor="thread"
            )
            try:
                t0 = time.perf_counter()
                batch = pool.score(prompts, completions)
                wall = time.perf_counter() - t0
            finally:
                pool.close()
            assert bool(batch.valid.all()), batch.errors  # a hang is a fail, never an infrastructure error
            # ok: evaluations with the right verdict (a passing program failed by a too small budget shows here)
            ok = sum(int(s == e) for s, e in zip(batch.total.tolist(), [0.0] * n_hang + [1.0] * (n - n_hang)))
            row[budget] = (n / wall, max(walls), ok)
        (pt, pt_max, pt_ok), (pp, pp_max, pp_ok) = row["per_test"], row["program"]
        print(
            f"{hang_share:>10.2f} | {pt:>15.2f} {pt_max:>10.2f} {pt_ok:>4} | {pp:>14.2f} {pp_max:>10.2f} {pp_ok:>4} "
            f"| {pp / pt:>7.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16, help="completions per timed batch")
    ap.add_argument("--work", type=float, default=0.15, help="seconds of CPU per reward call")
    ap.add_argument(
        "--section", choices=("all", "pool", "budget"), default="all", help="which table(s) to print"
    )
    ap.add_argument("--timeout", type=float, default=1.0, help="code reward timeout_s for the budget table")
    args = ap.parse_args()
    if args.section in ("all", "budget"):
        budget_table(args.n, args.timeout)
    if args.section == "budget":
        return
    _ITERS["n"] = calibrate(args.work)
    n = _ITERS["n"]

    sandbox = Sandbox(SandboxLimits(cpu_s=30), timeout_s=60.0)
    code_reward = CodeTestsReward("binary", timeout_s=60.0, sandbox=sandbox)
    candidate = (
        "def burn(n):\n    x = 0\n    for i in range(n):\n        x += i & 7\n    return x\n\n"
        f"def add(a, b):\n    burn({n})\n    return a + b\n"
    )
    code_prompts = [
        Prompt(prompt="add", metadata={"tests": [{"call": "add", "args": [i, 1], "expected": i + 1}]})
        for i in range(args.n)
    ]
    py_prompts = [Prompt(prompt="p", answer="42") for _ in range(args.n)]

    cases = [
        ("code_tests", code_reward, "thread", code_prompts, [candidate] * args.n),
        ("py_cpu", py_cpu, "process", py_prompts, ["42"] * args.n),
        ("py_cpu", py_cpu, "thread", py_prompts, ["42"] * args.n),
    ]
    load = os.getloadavg()[0]
    print(
        f"# cpus={os.cpu_count()} load1={load:.2f} completions={args.n} work/call~{args.work}s (loop {n}); "
        f"machine ceiling for 2 workers (2 plain processes): {machine_ceiling(3 * n):.2f}x"
    )
    print(
        f"{'reward':<11} {'executor':<8} {'workers':>7} {'wall_s':>8} {'compl/s':>8} {'speedup':>8} "
        f"{'latency_s':>10} {'reward':>7}"
    )
    for name, fn, executor, prompts, completions in cases:
        base = None
        for workers in (1, 2):
            r = run_case(name, fn, executor, workers, prompts, completions)
            base = base or r["tput"]
            print(
                f"{name:<11} {executor:<8} {workers:>7} {r['wall']:>8.2f} {r['tput']:>8.2f} "
                f"{r['tput'] / base:>7.2f}x {r['lat']:>10.3f} {r['mean']:>7.2f}"
            )


if __name__ == "__main__":
    main()
