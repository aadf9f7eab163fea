"""``RolloutCallback(mode="async")``'s producer over one fit: start it, take its items, hand it the pushes,
stop it, and checkpoint its counters (docs/architecture.md "Async mode").

``rollout/async_producer.py`` holds the Lightning-free machinery (``AsyncProducer``, the admission gate,
``take_fresh``, ``PromptStream``); this module is the glue the callback's hooks delegate to:

- ``check_setup`` (``setup``): the async settings against the other callbacks, the datamodule and the module.
- ``start`` (``on_train_start``): a ``PromptStream`` copying the training loader's sampler from the
  checkpointed prompt position, a queue of ``queue_size // rows`` items (``max_staleness + 1`` by default),
  and a producer whose item ``n`` is built with refill key ``first + n`` (``first``: the module's iteration
  at start). Item n is trained at iteration first + n (the gate drops nothing in normal operation), so a
  resumed run draws what the uninterrupted one drew for the same iteration.
- ``take`` (``on_train_batch_start``): the next item within ``max_staleness`` (``take_fresh``: too-stale
  items dropped or regenerated with the same prompts and refill key, counted in rows), the prompt position
  after it (what a checkpoint resumes from), and the ``async/*`` metrics.
- ``push`` (from ``WeightSync``): a weight snapshot, or for an engine whose load is a collective a load now
  in the trainer thread (``AsyncProducer.load_weights_now``); either way the new learner version is kept.
- ``state`` / ``state_dict``: ``version`` (learner pushes), ``prompt_pos`` (this rank's prompts drawn up to
  the last *trained* batch), ``dropped`` / ``regenerated`` (rows). Queued or in-flight items are not saved:
  a resumed run regenerates them from those prompts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor

from lit_rl.callbacks._async import check_async_correction, check_async_setup
from lit_rl.callbacks._roles import PromptEditor
from lit_rl.data.datamodule import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt
from lit_rl.rollout.async_producer import AsyncProducer, PromptStream, staleness, take_fresh
from lit_rl.rollout.settings import RolloutSettings, SyncSettings

# build(prompts, iteration) -> (Experience, metrics): pipeline steps 1-5 keyed by the refill iteration
Build = Callable[[list[Prompt], int], tuple[Experience, dict[str, float]]]


class AsyncRollouts:
    """The async producer of one ``RolloutCallback`` and its checkpointed counters; see the module docstring.

    Args:
        settings: the callback's ``RolloutSettings`` (``group_size``: rows per prompt).
        sync: its ``SyncSettings`` (``max_staleness``, ``queue_size``, ``stale_policy``).
        lock: the engine lock (generation, weight loads and evaluation use the engine one at a time).
    """

    def __init__(self, settings: RolloutSettings, sync: SyncSettings, lock: threading.RLock):
        self.settings, self.sync, self.lock = settings, sync, lock
        self.producer: AsyncProducer | None = None
        self.stream: PromptStream | None = None
        self.state = {"version": 0, "prompt_pos": 0, "dropped": 0, "regenerated": 0}

    @property
    def running(self) -> bool:
        """A producer was started and not stopped (the weight pushes go through it)."""
        return self.producer is not None

    def check_setup(self, trainer, pl_module) -> None:
        """At ``setup`` (fit): no ``PromptEditor`` callback (the producer draws its own batches, so edits of
        ``batch.prompts`` would never be seen), a datamodule it can draw from, a queue of at least one
        iteration, and an importance correction for rows from older weights (``_async.check_async_*``)."""
        editor = next((cb for cb in trainer.callbacks if isinstance(cb, PromptEditor)), None)
        check_async_setup(
            editor, getattr(trainer, "datamodule", None), self.settings.group_size, self.sync.queue_size
        )
        correction = pl_module.config.objective.rollout_correction  # async rows train a lit_rl learner
        check_async_correction(self.sync.max_staleness, correction)

    def start(self, dm, first: int, build: Build, load: Callable[[dict[str, Tensor], int], None]) -> None:
        """Start a producer drawing from ``dm`` (a ``PromptDataModule``-like datamodule); ``first``: the
        iteration its item 0 is trained at; ``load(weights, version)``: loads a snapshot into the engine."""
        self.stop()
        st = self.state
        self.stream = stream = PromptStream(
            dm.train_prompts,
            dm.batch_size,
            dm.seed,
            st["prompt_pos"],
            template=dm._sampler if isinstance(dm, PromptDataModule) else None,
        )
        rows, sync = dm.batch_size * self.settings.group_size, self.sync
        capacity = (sync.queue_size // rows) if sync.queue_size is not None else sync.max_staleness + 1

        def produce(n: int):
            prompts = stream.next_batch()
            exp, metrics = build(prompts, first + n)
            return exp, metrics, prompts, stream.pos, first + n

        self.producer = AsyncProducer(
            produce, load, sync.max_staleness, capacity, self.lock, version=st["version"]
        )
        self.producer.start()

    def take(self, build: Build) -> tuple[Experience, dict[str, float]]:
        """Next Experience within the staleness bound (dropping or regenerating older ones) + async metrics."""
        prod, st = self._running(), self.state

        def regenerate(
            payload,
        ):  # payload: (Experience, metrics, prompts, stream position after them, refill key)
            return (*build(payload[2], payload[4]), *payload[2:])

        def rows(payload) -> int:  # an item's size: its Experience's rows
            return len(payload[0])

        slot, waited = take_fresh(prod, self.sync.max_staleness, self.sync.stale_policy, st, rows, regenerate)
        exp, metrics, _, pos, _ = slot.payload
        st["prompt_pos"] = pos  # resume draws the prompts after the last trained batch
        stale = staleness(prod.learner_version, exp.policy_version).float()  # (B,)
        metrics.update(
            {
                "async/staleness_mean": float(stale.mean()),
                "async/staleness_max": float(stale.max()),
                "async/dropped": float(st["dropped"]),
                "async/regenerated": float(st["regenerated"]),
                "async/trainer_wait_s": waited,
                "async/producer_wait_s": prod.take_producer_wait(),
                "async/policy_version": float(prod.learner_version),
            }
        )
        return exp, metrics

    def push(self, weights: Iterable[tuple[str, Tensor]], collective: bool) -> None:
        """A learner push (trainer thread). ``collective``: the engine's load is a collective over the ranks
        (servers shared by URL), so load it here, where every rank is in the same iteration, after draining
        this rank's producer (``_async`` "Collective loads"); else snapshot it for the producer to load
        between items."""
        if collective:
            self.state["version"] = self._running().load_weights_now(weights)
        else:
            self.state["version"] = self._running().push_weights(weights)

    def _running(self) -> AsyncProducer:
        if self.producer is None:
            raise RuntimeError("the async rollout producer is not running (RolloutCallback.setup starts it)")
        return self.producer

    def end_iteration(self) -> None:
        if self.producer is not None:
            self.producer.end_iteration()

    def apply_pending(self) -> None:
        """Load the newest pushed weights now (evaluation generates with the learner's latest)."""
        if self.producer is not None:
            self.producer.apply_pending()

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.producer = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.update(state)
