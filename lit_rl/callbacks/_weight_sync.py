"""The weight-sync schedule of ``RolloutCallback``: when, and by which route, the learner's weights reach the
rollout engine (docs/architecture.md "Data flow of one RL iteration", the last step).

Contract of ``WeightSync`` (one per callback, used only from the trainer thread):

- **Which step pushes.** At the end of an iteration (``on_train_batch_end``, after its optimizer steps) when
  ``global_step - last_sync_step >= sync_every``; ``global_step`` counts optimizer steps, so with several
  optimizer steps per iteration the push comes at the first iteration end at or past the boundary. The push
  is closed by an agreement (``callbacks/_agree.py``): one rank's failed push raises on every rank. Its wall
  time is logged as ``perf/weight_sync_s``.
- **Route.** Sync mode: ``engine.update_weights(engine.sync_items(model))`` on every rank (sharded weights
  are gathered by collectives every rank joins, also where only rank 0 sends them), and the engine bumps its
  own ``policy_version``. Async mode: handed to the running producer (``AsyncRollouts.push``: a cloned
  snapshot the producer loads between items, or for a ``collective_sync`` engine a load now, in the trainer
  thread); the learner's version is then the producer's count of pushes.
- **First push** (``first_push``, at ``on_train_start``). Sync mode, fresh run: none (an engine sharing the
  learner's weights reads them; one holding its own copy was bound to the loaded model at setup). Sync mode,
  resumed (``global_step > 0``) with an engine holding its own weights: the restored learner's weights, under
  an agreement, keeping the checkpointed ``policy_version``. Async mode: always (the engine may hold weights
  from before a checkpoint restore), under the engine lock, labelled with the checkpointed learner version.
- **Counters and state.** ``last_sync_step`` (the ``global_step`` of the last push, 0 before any) is the
  whole ``state_dict`` (key ``"last_sync_step"``); the engine's ``policy_version`` is saved by the callback
  beside it, and the async learner version by ``AsyncRollouts``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterable
from typing import Any

from torch import Tensor

from lit_rl.callbacks._agree import agree


class WeightSync:
    """When the learner's weights are pushed to ``engine`` (an ``EngineBase``) and how; see the module docstring.

    Args:
        engine: the callback's engine.
        sync_every: push every this many optimizer steps (>= 1, checked by the callback).
        lock: the engine lock shared with generation and evaluation.
    """

    def __init__(self, engine, sync_every: int, lock: threading.RLock):
        self.engine, self.sync_every, self.lock = engine, sync_every, lock
        self.last_sync_step = 0

    def items(self, model) -> Iterable[tuple[str, Tensor]]:
        """The weights ``engine.update_weights`` takes: the engine's own choice (a LoRA adapter alone for
        ``VLLMServerEngine``'s adapter path), else the merged model."""
        return self.engine.sync_items(model)

    def load(self, weights: dict[str, Tensor], version: int) -> None:
        """Load ``weights`` into the engine labelled ``version`` (the async producer's ``apply_weights``; the
        caller holds the engine lock). Versions count learner pushes, whatever the engine counts itself."""
        self.engine.update_weights(weights.items())
        self.engine.policy_version = version

    def due(self, global_step: int) -> bool:
        return global_step - self.last_sync_step >= self.sync_every

    def first_push(self, trainer, model, async_version: int | None) -> None:
        """Before a fit's first iteration; ``async_version``: the checkpointed learner version in async mode,
        None in sync mode."""
        if async_version is not None:
            with self.lock:
                self.load(dict(self.items(model)), async_version)
        elif trainer.global_step > 0 and not self.engine.share_weights:
            version = self.engine.policy_version
            agree(trainer, "the weight sync", lambda: self.engine.update_weights(list(self.items(model))))
            self.engine.policy_version = version

    def after_iteration(self, trainer, pl_module, producer: Any = None) -> None:
        """Push when due. ``producer``: the running ``AsyncRollouts`` (async mode), else None."""
        if not self.due(trainer.global_step):
            return
        t0 = time.perf_counter()

        def push():
            if producer is not None:
                producer.push(self.items(pl_module.model), collective=self.engine.collective_sync)
            else:
                self.engine.update_weights(list(self.items(pl_module.model)))

        agree(trainer, "the weight sync", push)
        self.last_sync_step = trainer.global_step
        release_freed_heap()
        pl_module.log("perf/weight_sync_s", time.perf_counter() - t0, on_step=True, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"last_sync_step": self.last_sync_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_sync_step = state["last_sync_step"]


def release_freed_heap() -> None:
    """Hand the heap pages freed by the step and the sync back to the OS (glibc ``malloc_trim(0)``; a no-op
    elsewhere). glibc keeps freed blocks below its adaptive mmap threshold (the step's activations, the sync's
    copies: 1-32 MB tensors) in its arenas, so a full SmolLM2 fit held 5.5 GB resident after two iterations
    where 3.5 GB were live; one trim per iteration returns them (scripts/bench_memory_real.py ``trim``) for
    about a second of page faults per iteration. Serving every large block by mmap instead
    (``MALLOC_MMAP_THRESHOLD_``) returned as much but made the step ~30% slower."""
    global _malloc_trim  # noqa: PLW0603 - resolved once per process
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None
