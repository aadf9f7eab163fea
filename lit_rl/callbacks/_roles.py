"""Roles two callbacks check each other for, so neither has to import the other.

``Curriculum`` must run before the callback that generates from ``batch.prompts``, and async rollouts refuse a
callback that edits ``batch.prompts`` (the producer draws its own batches ahead of the trainer). Each side
checks for the *role* (an ``isinstance`` against a base class here) instead of importing the other's module:
``callbacks/curriculum.py`` and ``callbacks/rollout.py`` both import this module and not each other.
"""

from __future__ import annotations

import lightning as L


class PromptEditor(L.Callback):
    """A callback that rewrites ``batch.prompts`` in ``on_train_batch_start``, before rollouts are generated."""


class RolloutProducer(L.Callback):
    """A callback that turns ``batch.prompts`` into ``batch.experience`` in ``on_train_batch_start``."""
