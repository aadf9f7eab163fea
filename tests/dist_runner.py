"""Runs one `lit-rl fit` (any world size) and saves the final full policy weights from rank 0.

    python tests/dist_runner.py OUT.pt fit -c cfg.yaml [--trainer.devices 2 ...]

Used by tests/test_distributed.py; Lightning's launcher re-executes this script for the extra local ranks.
FSDP2 parameters are DTensors: every rank gathers each one (a collective), rank 0 writes the file.
"""
import sys

import torch

from lit_rl.cli import main

if __name__ == "__main__":
    out, args = sys.argv[1], sys.argv[2:]
    cli = main(args)
    state = {}
    for name, p in cli.model.model.state_dict().items():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        state[name] = full.detach().cpu().clone()
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    if cli.trainer.global_rank == 0:
        torch.save({"state": state, "metrics": metrics, "world_size": cli.trainer.world_size}, out)
