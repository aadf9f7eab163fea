"""Stage 2, generate: rendered prompt ids → G completions each, through an ``EngineBase``.

The engine is shared with weight loads (the async producer, the trainer's pushes) and held-out evaluation, so
every call holds ``lock``: one user of the engine at a time, and a generation never straddles a weight load.
"""

from __future__ import annotations

import threading
import time

from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import Completion
from lit_rl.rollout.settings import RolloutSettings


class Generator:
    """``engine.generate(prompt_ids, n=group_size, sampling)`` under the engine lock, timed.

    Args:
        engine: the rollout engine (``generate(prompt_ids, n, sampling)`` of the contract, ``rollout.base``).
        settings: the rollout settings (``group_size``: G, completions per prompt; ``sampling``).
        lock: the engine lock (an ``RLock``: the async path already holds it when it calls in).
    """

    def __init__(self, engine: EngineBase, settings: RolloutSettings, lock: threading.RLock | None = None):
        self.engine, self.settings = engine, settings
        self.lock = lock if lock is not None else threading.RLock()

    def __call__(self, prompts, prompt_ids: list[list[int]]) -> tuple[list[list[Completion]], float]:
        """(N groups of G ``Completion``, wall seconds). ``prompts`` is unused here (an agent generator runs
        episodes from the prompts themselves); it keeps one signature for every generator."""
        t0 = time.perf_counter()
        with self.lock:
            groups = self.engine.generate(prompt_ids, self.settings.group_size, self.settings.sampling)
        return groups, time.perf_counter() - t0


def decode_with(engine: EngineBase):
    """``decode(completion) -> str`` with the engine's tokenizer, read at call time (engines bind late)."""

    def decode(c: Completion) -> str:
        return engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)

    return decode
