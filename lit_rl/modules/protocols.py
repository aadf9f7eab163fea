"""The optional protocols lit_rl adds to Lightning callbacks (docs/architecture.md "Contracts").

- ``ExperienceHook.on_experience(trainer, module, experience)``: annotate a freshly generated Experience
  (reference log-probs, teacher log-probs, values, token rewards) *before* advantages are computed.
- ``LossTerm.loss_terms(module, micro_batch, forward_out) -> dict[name, scalar]``: extra loss terms added to
  the policy loss of every micro-batch. ``forward_out`` holds ``logits`` (b, C, V), ``logprobs`` (b, C),
  ``mask`` (b, C), ``hidden`` (b, C, H) last hidden states when a shared-backbone critic asked for them
  (else None), and the minibatch denominators ``num_tokens`` / ``num_seqs``; a term should aggregate
  with ``module.aggregate(values, mask, forward_out)`` so micro-batch contributions sum to the minibatch
  value (gradient accumulation then equals one big batch). Each term is logged as ``loss/<name>``.

A loss term owned by the module itself (``PolicyModule.loss_modules``: the ``CriticModule``) has the same
``loss_terms`` shape and may also declare, each optional:

- ``bind(module)``: called once at the end of the module's ``__init__`` (build against the policy);
- ``wants_hidden`` / ``wants_cache`` (bool): the shared training forward must return the last hidden states /
  its key/value cache (``forward_out["hidden"]`` / ``["cache"]``);
- ``on_experience(trainer, module, experience)``: run by the module's own ExperienceHook, after old log-probs;
- ``trains_alone(module) -> bool``: while True, every other loss part is multiplied by 0 (a critic's warmup);
- ``advantage_metrics(experience) -> dict``: logged with the advantage metrics;
- ``bootstrap_rows(experience) -> (B,) bool | None``: rows whose GAE continues from the last state's value.

And one protocol for the module's side of the rollout wiring:

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
    lock and ``eval_generate``), the rollout settings (``settings.group_size``, ``settings.sampling``), the
    reward pool and the pipeline."""

    engine: Any
    settings: Any
    rewards: Any
    pipeline: Any
    engine_lock: Any

    def eval_generate(self, prompt_ids: list[list[int]], n: int, sampling: Any) -> list: ...


def experience_hooks(trainer) -> list:
    return [cb for cb in trainer.callbacks if isinstance(cb, ExperienceHook)]


def loss_term_providers(trainer) -> list:
    return [cb for cb in trainer.callbacks if isinstance(cb, LossTerm)]
