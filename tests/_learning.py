"""Seeds and measurements of the learning tests (tests that assert a reward, accuracy or explained variance rose
or reached a level), shared so that ``scripts/sweep_learning.py`` can rerun them under other seeds and CPU
kernels (``ATEN_CPU_CAPABILITY``) and collect what they measured.

- ``LIT_RL_TEST_SEED=k`` (an integer, default 0) shifts every seed a learning test uses by ``k``: ``seed(7)`` is
  7 in the default run and ``7 + k`` under ``LIT_RL_TEST_SEED=k``, so the default run is unchanged.
- ``LIT_RL_TEST_RECORD=FILE``: ``record(name, **values)`` appends one JSON line per call to FILE (nothing
  without the variable), e.g. ``{"name": "distill/add_teacher", "seed": 0, "cpu": "AVX512", "accuracy": 0.9}``.
"""

from __future__ import annotations

import json
import os

SEED_ENV, RECORD_ENV = "LIT_RL_TEST_SEED", "LIT_RL_TEST_RECORD"


def seed_offset() -> int:
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{SEED_ENV}={raw!r}: expected an integer seed offset (0 = the default seeds)"
        ) from None


def seed(base: int) -> int:
    """The seed a learning test uses where its default is ``base``."""
    return base + seed_offset()


def seed_args(base: int = 0, *also: str) -> list[str]:
    """CLI arguments that set a recipe's global seed (``seed_everything``), and each option in ``also`` (e.g. an
    engine's own sampling seed), to ``seed(base)``."""
    return [a for key in ("--seed_everything", *also) for a in (key, str(seed(base)))]


def record(name: str, **values) -> None:
    """Print the measured values (visible with ``pytest -s``) and append them to ``$LIT_RL_TEST_RECORD``."""
    print(f"\n[learning] {name} (seed offset {seed_offset()}): {values}")
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    import torch

    row = {"name": name, "seed": seed_offset(), "cpu": torch.backends.cpu.get_cpu_capability(), **values}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
