r"""vLLM's KV-cache block size on CPU: the SmolLM2 recipe's rollout, its held-out evaluation and long rows.

    python scripts/bench_vllm_blocks.py                          # blocks of 32 (lit_rl's CPU default) vs 128 (vLLM's)
    python scripts/bench_vllm_blocks.py --blocks 32 64 128 --threads 2 --repeats 3

One process starts a ``VLLMEngine`` per block size in turn (one in-process engine alive at a time), in the
order given and then once more in reverse, so drift from other load on the machine hits every size alike. Each
engine runs three workloads on the real checkpoint (``lit-rl models smollm2``, or ``--model``), all with the
recipe's sampling code (per-request seeds, sampled-token log-probs):

- ``rollout``: the recipe's iteration, 8 ``chat_addition`` prompts x 8 samples x <= 16 new tokens at
  temperature 1, ``max_model_len`` 128, 256 MiB of KV cache (``configs/smollm2_addition.yaml``);
- ``eval``: its held-out evaluation, the 200 held-out prompts greedy, <= 16 new tokens, the same engine;
- ``long``: 8 chat prompts asking for a long story x 8 samples x <= 256 new tokens at temperature 1, its own
  engine with ``max_model_len`` 320 and 1 GiB of KV cache (the tokens generated are printed: rows stop at eos).

It prints, per workload and block size, the best and median seconds over ``--repeats`` timed runs (after one
untimed warm-up) and the ratio of each median to the first block size's. Why it matters:
``lit_rl/rollout/_vllm_memory.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path


def _time(fn, repeats: int) -> list[float]:
    """One untimed warm-up (first-call allocations, the prefix cache's first fill), then bench_rollout's timer."""
    from bench_rollout import _timed  # scripts/ is on sys.path when this runs as a script

    fn()
    return _timed(fn, repeats)


def _engine(module, block: int, max_len: int, kv_bytes: int):
    from lit_rl.rollout.vllm import VLLMEngine

    engine = VLLMEngine(max_model_len=max_len, kv_cache_memory_bytes=kv_bytes, block_size=block, seed=0)
    engine.bind(module)
    return engine


def run_block(module, block: int, train, heldout, stories, repeats: int) -> dict[str, list[float]]:
    """Seconds per run of each workload with KV blocks of ``block`` tokens."""
    from lit_rl.rollout.sampling import SamplingConfig

    sample = SamplingConfig(temperature=1.0, max_new_tokens=16)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    full = SamplingConfig(temperature=1.0, max_new_tokens=256)
    out = {}
    engine = _engine(module, block, 128, 256 << 20)
    try:
        out["rollout"] = _time(lambda: engine.generate(train, 8, sample), repeats)
        out["eval"] = _time(lambda: engine.generate(heldout, 1, greedy), repeats)
    finally:
        engine.close()
    engine = _engine(module, block, 320, 1 << 30)
    try:
        out["long"] = _time(lambda: engine.generate(stories, 8, full), repeats)
        tokens = sum(len(c.token_ids) for group in engine.generate(stories, 8, full) for c in group)
        print(f"block {block}: long rows generated {tokens} tokens per run", flush=True)
    finally:
        engine.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint directory (default: lit-rl models smollm2's)")
    p.add_argument("--blocks", type=int, nargs="+", default=[32, 128])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import types

    import torch

    from lit_rl.data.prompts import Prompt, render_prompt
    from lit_rl.data.tasks import get_task
    from lit_rl.models.loading import load_causal_lm, load_tokenizer

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model is None:
        from lit_rl.models.smollm2 import build

        a.model = str(build())  # the cached conversion (built once, ~35 s)
    path = str(Path(a.model).expanduser())
    tok = load_tokenizer(path)
    module = types.SimpleNamespace(model=load_causal_lm(path), tokenizer=tok, model_path=path)
    train_prompts, heldout_prompts = get_task("chat_addition", heldout=200)
    train = [render_prompt(q, tok) for q in train_prompts[:8]]
    heldout = [render_prompt(q, tok) for q in heldout_prompts]
    topics = (
        "a lighthouse",
        "a lost key",
        "the moon",
        "a robot",
        "a storm",
        "a garden",
        "a train",
        "a dragon",
    )
    stories = [
        render_prompt(Prompt(messages=[{"role": "user", "content": f"Write a long story about {t}."}]), tok)
        for t in topics
    ]

    times: dict[int, dict[str, list[float]]] = {b: {} for b in a.blocks}
    for b in [*a.blocks, *reversed(a.blocks)]:
        for k, v in run_block(module, b, train, heldout, stories, a.repeats).items():
            times[b].setdefault(k, []).extend(v)
    print(f"\nKV-cache block size on CPU ({Path(path).name}, {torch.get_num_threads()} threads)")
    print("| workload | block | best s | median s | median / block " + f"{a.blocks[0]} |")
    print("|---|---|---|---|---|")
    for w in ("rollout", "eval", "long"):
        base = statistics.median(times[a.blocks[0]][w])
        for b in a.blocks:
            t = times[b][w]
            print(
                f"| {w} | {b} | {min(t):.2f} | {statistics.median(t):.2f} | {statistics.median(t) / base:.2f} |"
            )


if __name__ == "__main__":
    main()
