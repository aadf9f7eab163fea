"""Runs one `lit-rl fit` (any world size) and saves the final full policy weights from rank 0.

    python tests/dist_runner.py OUT.pt fit -c cfg.yaml [--trainer.devices 2 ...]

Used by tests/test_distributed.py; Lightning's launcher re-executes this script for the extra local ranks.
Sharded parameters (FSDP2 DTensors, ZeRO-3 partitions) are gathered on every rank (collectives), rank 0
writes the file.
"""
import sys

import torch

from lit_rl.cli import main

def _break_engine_on_rank(spec: str) -> None:
    """``KILL_ENGINE=rank:call``: that rank's HFEngine dies (raises) on its call-th generate — a rollout engine
    crash on one rank only; the others are left waiting in the next collective."""
    import os

    from lit_rl.rollout.engine import HFEngine

    rank, call = (int(x) for x in spec.split(":"))
    original = HFEngine.generate

    def generate(self, *a, **kw):
        if int(os.environ.get("LOCAL_RANK", "0")) == rank and self._calls + 1 >= call:
            raise RuntimeError(f"test: rollout engine on rank {rank} died")
        return original(self, *a, **kw)

    HFEngine.generate = generate


if __name__ == "__main__":
    import os

    if os.environ.get("KILL_ENGINE"):
        _break_engine_on_rank(os.environ["KILL_ENGINE"])
    out, args = sys.argv[1], sys.argv[2:]
    cli = main(args)
    from lit_rl.models.loading import merged_state_items

    # FSDP2 DTensors and ZeRO-3 partitions are gathered one parameter at a time (collectives on every rank)
    state = {name: t.detach().cpu().clone() for name, t in merged_state_items(cli.model.model)}
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    if cli.trainer.global_rank == 0:
        torch.save({"state": state, "metrics": metrics, "world_size": cli.trainer.world_size}, out)
