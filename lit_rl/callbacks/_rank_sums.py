"""Cross-rank sums for callback statistics (rank-consistent controller state).

Adaptive controllers (``ReferenceKL``'s β, ``EntropyRegularization``'s α) must move every rank's coefficient
the same way, or the ranks train different objectives and the checkpoint (written by rank 0) holds only rank
0's value. They therefore update from sums all-reduced over ranks, never from a rank's own mean.
"""

from __future__ import annotations

import torch


def global_sums(trainer, module, values: list[float]) -> list[float]:
    """Sum each of ``values`` over all ranks (float64); the values themselves on a single process.

    A collective: every rank must call it at the same point, including a rank that has nothing to add
    (zeros) — a rank that skipped the call would leave the others waiting.

    Shapes: ``values`` is a list of k Python floats; returns k floats.
    """
    world = getattr(trainer, "world_size", 1) if trainer is not None else 1
    if world <= 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dev = getattr(module, "device", torch.device("cpu"))  # NCCL needs the accelerator; gloo takes CPU
    out = trainer.strategy.reduce(t.to(dev), reduce_op="sum")
    return [float(v) for v in out.cpu()]
