"""One seed per run (issue 36): ``seed_everything`` seeds every source of randomness a run has.

Each component that draws its own random stream (the prompt order of ``PromptDataModule``, the policy's
sampling RNG and minibatch shuffles, a ``tiny_if_missing`` model's initial weights, engines' per-request
sampling seeds, a curriculum's re-draws, the inspector's choice of groups) takes ``seed: int | None = None``.
``None`` means "the run's seed": the one ``lightning.seed_everything`` recorded in ``PL_GLOBAL_SEED`` (the CLI
calls it from ``seed_everything:`` before building anything; DDP children inherit the variable), else 0. A
number set explicitly (in a config or on the command line) wins over it. Task splits (``tasks.addition(seed=)``)
are data definitions, not run randomness: they stay fixed, so runs with different seeds evaluate on the same
held-out prompts.

Torch-free (floor 0): the early config check and the light commands may import it.
"""

from __future__ import annotations

import os


def run_seed(seed: int | None = None) -> int:
    """``seed`` when set, else the run's ``seed_everything`` seed (``PL_GLOBAL_SEED``), else 0."""
    if seed is not None:
        return int(seed)
    env = os.environ.get("PL_GLOBAL_SEED", "")
    try:
        return int(env) if env else 0
    except ValueError:  # Lightning itself refuses such a value when seeding; 0 as when nothing was seeded
        return 0
