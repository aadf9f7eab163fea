"""The optional protocols lit_rl adds to Lightning callbacks (docs/architecture.md "Contracts").

- ``ExperienceHook.on_experience(trainer, module, experience)``: annotate a freshly generated Experience
  (reference log-probs, teacher log-probs, values, token rewards) *before* advantages are computed.
- ``LossTerm.loss_terms(module, micro_batch, forward_out) -> dict[name, scalar]``: extra loss terms added to
  the policy loss of every micro-batch. ``forward_out`` holds ``logits`` (b, C, V), ``logprobs`` (b, C),
  ``mask`` (b, C), ``hidden`` (b, C, H) last hidden states when a shared-backbone critic asked for them
  (else None), and the minibatch denominators ``num_tokens`` / ``num_seqs``; a term should aggregate
  with ``module.aggregate(values, mask, forward_out)`` so micro-batch contributions sum to the minibatch
  value (gradient accumulation then equals one big batch). Each term is logged as ``loss/<name>``.
- ``RolloutSource``: the wiring the rollout callback hands the module (``module.rollout_source``) at setup.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ExperienceHook(Protocol):
    def on_experience(self, trainer: Any, module: Any, experience: Any) -> None: ...


@runtime_checkable
class LossTerm(Protocol):
    def loss_terms(self, module: Any, micro_batch: Any, forward_out: dict[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class RolloutSource(Protocol):
    """What the rollout callback hands the policy module at ``setup`` (``module.rollout_source``), so that
    evaluation, teacher rollouts and engines never search ``trainer.callbacks`` for it: the engine (with its
    lock and ``eval_generate``), the sampling settings, ``group_size``, the reward pool and the pipeline."""

    engine: Any
    sampling: Any
    group_size: int
    rewards: Any
    pipeline: Any
    engine_lock: Any

    def eval_generate(self, prompt_ids: list[list[int]], n: int, sampling: Any) -> list: ...


def experience_hooks(trainer) -> list:
    return [cb for cb in trainer.callbacks if isinstance(cb, ExperienceHook)]


def loss_term_providers(trainer) -> list:
    return [cb for cb in trainer.callbacks if isinstance(cb, LossTerm)]
