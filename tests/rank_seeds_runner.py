"""One gloo rank of tests/test_rank_seeds.py: per-request seeds and their checkpointed cursor, per rank.

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/rank_seeds_runner.py OUT_DIR MODEL_DIR

Rank r sends (r + 1) prompts through ``VLLMServerEngine._body`` (the request body a server receives, seed
included) and draws (r + 1) seeds from a ``VLLMEngine``; both engines' state is checkpointed through
``RolloutCallback.state_dict`` (a collective, as in Lightning's checkpoint dump), rank 0's dict is what a
checkpoint file holds, and fresh engines restore from it. No server or model is started: the seed rule and
the checkpoint are what is under test, with the real rank from torch.distributed.

``HFEngine`` (tiny model at MODEL_DIR) samples the same prompt unseeded after ``torch.manual_seed(0)`` on every
rank (what ``seed_everything`` does), twice: its global-generator stream must differ per rank and replay on a
rank whose generators are restored; seeded (``sampling.seed``) it must be the same on every rank and replay at the
same generate call.
"""

import json
import sys

import torch
import torch.distributed as dist

from lit_rl.callbacks import RolloutCallback
from lit_rl.learners import PolicyModule
from lit_rl.rollout import HFEngine, SamplingConfig
from lit_rl.rollout.server import VLLMServerEngine
from lit_rl.rollout.vllm import VLLMEngine

N = 4  # samples per prompt: each prompt steps the cursor by N
SEED = 5  # sampling.seed of the seeded HFEngine runs


def _callback(engine) -> RolloutCallback:
    return RolloutCallback(engine=engine, rewards=lambda prompt, completion: 0.0, group_size=N)


def _hf_samples(model_dir: str, seed: int | None = None) -> list[list[list[int]]]:
    """Unseeded: one engine twice from the same global generator state (a resumed rank). Seeded
    (``sampling.seed``): two fresh engines, so both runs are at the same generate call."""
    module = PolicyModule(model=model_dir)
    engine = HFEngine()
    ids = module.tokenizer.encode("abcdef")
    out = []
    for _ in range(2):
        if seed is not None:
            engine = HFEngine()
        engine.bind(module)
        torch.manual_seed(0)
        groups = engine.generate([ids], N, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=seed))
        out.append([c.token_ids for c in groups[0]])
    return out


def main(out_dir: str, model_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sp = SamplingConfig(max_new_tokens=4)
    server = VLLMServerEngine(urls=["http://127.0.0.1:9"], seed=7)
    local = VLLMEngine(model="unused", seed=7)
    bodies = [server._body([1, 2, 3], N, sp) for _ in range(rank + 1)]
    local_seeds = [local._next_seed(sp, N) for _ in range(rank + 1)]
    saved = [_callback(e).state_dict() for e in (server, local)]  # every rank, like Lightning's dump
    box = [saved if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # the checkpoint file holds rank 0's dicts
    restored = []
    for fresh, state in zip(
        (VLLMServerEngine(urls=["http://127.0.0.1:9"], seed=7), VLLMEngine(model="unused", seed=7)), box[0]
    ):
        _callback(fresh).load_state_dict(state)
        restored.append({"cursor": fresh._seed_cursor, "next": fresh._next_seed(sp, N)})
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(
            {
                "server_seeds": [b["seed"] for b in bodies],
                "server_n": [b["n"] for b in bodies],
                "local_seeds": local_seeds,
                "restored": restored,
                "hf": _hf_samples(model_dir),
                "hf_seeded": _hf_samples(model_dir, seed=SEED),
            },
            f,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
