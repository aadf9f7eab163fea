"""Bench: lock-step vs asynchronous agent episodes under a heavy-tailed tool latency (issue 56.5).

Same model (the tiny qwen2 by default, ``--model`` for another checkpoint), same episodes (greedy, ``--turns``
turns each, the environment ends them), one process. Each tool call sleeps a lognormal time (median chosen so
that the mean is one turn's generation time of a full batch, measured first) and in every batch one call of one
episode takes 4x the median (the straggler). Rows of the table:

* ``lockstep``: ``AgentLoop(concurrency="lockstep")``, batch after batch (each turn generates for the batch, then
  steps each environment in turn);
* ``async run``: ``concurrency="async"``, batch after batch (``run``: the batch waits for its last episode);
* ``async stream``: ``AgentLoop.stream`` with two batches' groups in flight and the engine's batch capped at one
  batch (``max_batch``): stragglers are carried while the next groups start;
* the two async rows with zero tool latency (run first: their mean generate call, a full batch's turn, sets the
  mean tool time of the others).

Episodes per second over all batches; engine idle share = 1 - generate seconds / wall seconds. Targets: async
>= 2x lock step, and within 1.2x of the same schedule with zero latency.

    python scripts/bench_agent_async.py                # tiny model, 4 batches of 8 episodes x 4 turns
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from typing import Any, ClassVar

SIGMA = 0.75  # lognormal shape of the tool latency (mean = median * exp(sigma^2 / 2))


class LatencyEnv:
    """``turns`` turns; step k of episode ``e`` sleeps ``latency[(e, k)]`` (drawn up front: the same episodes in
    every mode). Prompt p's ``group`` episodes (reset in order) are episodes p*group .. p*group+group-1."""

    latency: ClassVar[dict[tuple[int, int], float]] = {}
    turns: ClassVar[int] = 4
    group: ClassVar[int] = 1
    resets: ClassVar[dict[str, int]] = {}

    def reset(self, prompt: Any) -> str:
        j = self.resets.get(prompt, 0)
        self.resets[prompt] = j + 1
        self.e, self.k = int(prompt) * self.group + j % self.group, 0
        return f"task {prompt}: call the tool"

    def step(self, action: str):
        self.k += 1
        s = self.latency.get((self.e, self.k), 0.0)
        if s > 0:
            time.sleep(s)
        return f"result {self.k}", float(self.k), self.k >= self.turns, {}


def draw_latencies(n_batches: int, batch: int, turns: int, median: float, seed: int) -> dict:
    rng = random.Random(seed)
    lat = {}
    for b in range(n_batches):
        for i in range(batch):
            e = b * batch + i
            for k in range(1, turns + 1):
                lat[(e, k)] = median * math.exp(rng.gauss(0.0, SIGMA))
        straggler = b * batch + rng.randrange(batch)
        lat[(straggler, rng.randrange(1, turns + 1))] = 4.0 * median
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: a tiny qwen2, built here)")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="episodes per batch (prompts x group)")
    ap.add_argument("--group", type=int, default=2, help="episodes per prompt")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch

    from lit_rl.learners import PolicyModule
    from lit_rl.rollout.agent_loop import AgentLoop
    from lit_rl.rollout.engine import HFEngine, SamplingConfig

    torch.manual_seed(args.seed)
    model = args.model
    if model is None:
        from lit_rl.models.tiny import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench_agent_"), arch="qwen2", seed=args.seed))
    engine = HFEngine()
    engine.bind(PolicyModule(model=model))
    sp = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    B, G = args.batch, args.group
    LatencyEnv.turns, LatencyEnv.group = args.turns, G
    if B % G:
        raise SystemExit(f"--batch ({B}) must be a multiple of --group ({G})")
    per = B // G  # prompts per batch
    prompts = [str(e) for e in range(args.batches * per)]

    def loop(concurrency: str, max_batch: int | None = None) -> AgentLoop:
        return AgentLoop(
            LatencyEnv, engine, max_turns=args.turns, concurrency=concurrency, max_batch=max_batch
        )

    # a warm-up batch, then the zero-latency runs; their mean generate call (a full batch's turn) is the mean
    # tool time of the others (measured in the same conditions: a loaded machine makes a one-off timing wrong)
    LatencyEnv.latency, LatencyEnv.resets = {}, {}
    loop("async").run(prompts[:per], G, sp)
    lat: dict = {}

    last_call_s = [0.0]

    def run(mode: str, latency: bool) -> tuple[float, float, list, float]:
        """(wall s, engine idle share, episodes, mean sequences per generate call)."""
        LatencyEnv.latency, LatencyEnv.resets = (lat if latency else {}), {}
        episodes: list = []
        if mode == "stream":
            agent = loop("async", max_batch=B)
            for _, eps in agent.stream(prompts, G, sp, max_groups_in_flight=2 * per):
                episodes += eps
            st = agent.last_stats
            return st.wall_s, st.engine_idle_frac, episodes, st.sequences / st.calls
        agent = loop(mode)
        wall = busy = 0.0
        calls = seqs = 0
        for b in range(args.batches):
            for g in agent.run(prompts[b * per : (b + 1) * per], G, sp):
                episodes += g
            wall += agent.last_stats.wall_s
            busy += agent.last_stats.generate_s
            calls += agent.last_stats.calls
            seqs += agent.last_stats.sequences
        last_call_s[0] = busy / calls
        return wall, 1 - busy / wall, episodes, seqs / calls

    rows = {}

    def record(name: str, mode: str, latency: bool) -> None:
        wall, idle, eps, per_call = run(mode, latency)
        n = len(eps)
        actions = sorted(tuple(t.action_ids) for e in eps for t in e.turns)
        rows[name] = (n / wall, idle, wall, per_call, actions)
        print(f"{name}: {n} episodes in {wall:.1f} s, engine idle {idle:.0%}", flush=True)

    record("async run, zero latency", "async", False)
    gen_s = last_call_s[0]
    median = gen_s / math.exp(SIGMA**2 / 2)
    lat.update(draw_latencies(args.batches, B, args.turns, median, args.seed))
    record("async stream, zero latency", "stream", False)
    for name, mode in (("lockstep", "lockstep"), ("async run", "async"), ("async stream", "stream")):
        record(name, mode, True)
    ref = rows["lockstep"][4]
    same = all(r[4] == ref for r in rows.values())
    load = os.getloadavg()[0]
    print(
        f"\nmodel {model}; {args.batches} batches x {B} episodes ({per} prompts x {G}) x {args.turns} turns, "
        f"{args.max_new_tokens} new tokens per turn; one batch turn generates in {gen_s * 1e3:.0f} ms (zero-latency "
        f"async run's mean call) = mean "
        f"tool time (lognormal sigma {SIGMA}, median {median * 1e3:.0f} ms, one 4x-median straggler per batch); "
        f"load average {load:.1f}; same episodes in every mode: {same}"
    )
    print(
        "| mode | episodes/s | engine idle | wall s | sequences per call | vs lockstep | vs its zero-latency run |"
    )
    print("|---|---|---|---|---|---|---|")
    lock = rows["lockstep"][0]
    zero = {"async run": "async run, zero latency", "async stream": "async stream, zero latency"}
    order = ["lockstep", "async run", "async stream", "async run, zero latency", "async stream, zero latency"]
    for name in order:
        eps_s, idle, wall, per_call, _ = rows[name]
        z = f"{rows[zero[name]][0] / eps_s:.2f}x slower" if name in zero else ""
        print(
            f"| {name} | {eps_s:.2f} | {idle:.0%} | {wall:.1f} | {per_call:.1f} | {eps_s / lock:.2f}x | {z} |"
        )


if __name__ == "__main__":
    main()
