"""The checks of ``RolloutCallback``'s async settings (``rollout.settings.SyncSettings``: ``mode``,
``max_staleness``, ``queue_size``, ``stale_policy``) against its other settings, the datamodule and the module;
each field alone is checked by its group. The Lightning-free machinery they guard (producer thread, staleness
gate, ``take_fresh``, ``PromptStream``) is ``rollout/async_producer.py``.
"""

from __future__ import annotations


def check_async_args(sync, settings, engine) -> None:
    """``RolloutCallback``'s async settings against the others, at construction (each field alone is checked
    by its group, ``rollout.settings.SyncSettings``): the queue holds at least one group of
    ``settings.group_size`` rows, and an async engine generates from its own copy of the weights."""
    from lit_rl.rollout.base import check_engine

    if sync.queue_size is not None and sync.queue_size < settings.group_size:
        raise ValueError(
            f"queue_size={sync.queue_size} rows is smaller than one group (group_size="
            f"{settings.group_size}), so smaller than one iteration; allowed: null or >= "
            "data.batch_size x group_size rows"
        )
    if sync.mode == "async" and engine is not None and check_engine(engine).share_weights:
        raise ValueError(
            f"engine {type(engine).__name__}(share_weights=True) is a sync-only engine option: in "
            "mode='async' the producer must generate from a snapshot, not the weights being trained; use "
            "HFEngine(share_weights=False) (the default engine in async mode) or mode='sync'"
        )


def check_async_correction(max_staleness: int, rollout_correction: str | None) -> None:
    """Async rows come from older weights: without an importance correction (and with one update per
    batch, where the ratio's denominator is the learner itself) they would train as on-policy data."""
    if max_staleness > 0 and rollout_correction == "none":
        raise ValueError(
            f"mode='async' with max_staleness={max_staleness} trains rows sampled by older weights, but the "
            "model's rollout_correction is 'none', so they would be trained as on-policy (ratio 1); set "
            "model rollout_correction: tis (token-level truncated IS, the recommended default) or mis, "
            "or max_staleness: 0 (synchronous)"
        )


def check_async_setup(editor, dm, group_size: int, queue_size: int | None) -> None:
    """At setup: no prompt editor (``editor``: the first ``PromptEditor`` callback, or None), a datamodule the
    producer can draw batches from, and a queue of at least one iteration."""
    if editor is not None:
        raise ValueError(
            f"mode='async' cannot be combined with a {type(editor).__name__} callback: the async "
            "producer draws its own prompt batches ahead of the trainer, so batch.prompts edits are "
            "never seen; use mode='sync' with a curriculum"
        )
    for attr in ("train_prompts", "batch_size", "seed"):
        if not hasattr(dm, attr):
            raise ValueError(
                f"mode='async' needs a datamodule with {attr!r} (e.g. PromptDataModule): the "
                f"producer draws prompt batches itself; got {type(dm).__name__}"
            )
    rows = dm.batch_size * group_size
    if queue_size is not None and queue_size < rows:
        raise ValueError(
            f"queue_size={queue_size} rows is smaller than one iteration ({rows} rows = "
            f"data.batch_size={dm.batch_size} x group_size={group_size}); allowed: >= {rows}"
        )
