"""The contracts lit_rl adds to Lightning callbacks and the policy module (docs/architecture.md "Contracts").

- ``ExperienceHook.on_experience(trainer, module, experience)``: annotate a freshly generated Experience
  (reference log-probs, teacher log-probs, values, token rewards) *before* advantages are computed.
- ``LossTerm``: one part Σ_terms L_term of the objective L = L_policy + Σ_terms L_term. A base class, not a
  structural protocol: the module reads what a term declares and calls every hook, whose default does nothing,
  so nothing is probed. Its one required method,
  ``loss_terms(module, micro_batch, forward_out) -> dict[name, scalar]``, returns the term's loss parts for
  every micro-batch (each logged as ``loss/<name>``; a ``LossParts`` return also hands over its metrics and
  shares).
  ``forward_out`` holds ``logits`` (b, C, V, computed only if read), ``logprobs`` (b, C), ``entropy`` (b, C or
  None), ``mask`` (b, C), ``hidden`` (b, C, H) / ``cache`` when some term declared it needs them (else None),
  and the minibatch denominators ``num_tokens`` / ``num_seqs`` / ``horizon``; a term should aggregate with
  ``module.aggregate(values, mask, forward_out)`` so micro-batch contributions sum to the minibatch value
  (gradient accumulation then equals one big batch). The hooks, each a no-op unless overridden:

  - ``needs() -> ForwardNeeds``: what the shared training forward must return besides log-probs (hidden states
    for a shared regression value head, the key/value cache for a shared yes/no value head);
  - ``bind(module)``: a term the module owns is built against the policy at the end of its ``__init__``
    (a callback term builds itself in Lightning's ``setup`` instead);
  - ``on_experience(trainer, module, experience)``: annotate each Experience; a term the module owns is run by
    the module's own ExperienceHook (after old log-probs), a callback term by the rollout, in callback order;
  - ``trains_alone(module) -> bool``: while True, every other term's loss parts are multiplied by 0 (a
    critic's warmup);
  - ``advantage_metrics(experience) -> dict``: logged with the advantage metrics;
  - ``bootstrap_rows(experience) -> (B,) bool | None``: rows whose GAE continues from the last state's value.

  The terms of one update, in the order their parts are added: the module's own
  (``PolicyModule.own_loss_terms``: DistillModule's student distillation, the ``critic``), then every
  ``LossTerm`` in ``trainer.callbacks``.

The module's side of the rollout wiring is not a protocol but one typed object: the frozen ``RolloutBinding`` the
rollout callback hands over at setup (``learners/binding.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ExperienceHook(Protocol):
    def on_experience(self, trainer: Any, module: Any, experience: Any) -> None: ...


@dataclass(frozen=True)
class ForwardNeeds:
    """What a loss term reads from the shared training forward besides log-probs and entropy."""

    hidden: bool = False  # forward_out["hidden"]: last hidden states at the completion positions
    cache: bool = False  # forward_out["cache"]: the forward's key/value cache

    def __or__(self, other: ForwardNeeds) -> ForwardNeeds:
        return ForwardNeeds(hidden=self.hidden or other.hidden, cache=self.cache or other.cache)


class LossTerm(ABC):
    """A part of the objective (see the module doc); subclass it and implement ``loss_terms``."""

    @abstractmethod
    def loss_terms(self, module: Any, micro_batch: Any, forward_out: dict[str, Any]) -> dict[str, Any]:
        """``{name: scalar}``: this term's loss parts of one micro-batch (``{}``: none this time)."""

    def needs(self) -> ForwardNeeds:
        return ForwardNeeds()

    def bind(self, module: Any) -> None:
        return None

    def on_experience(self, trainer: Any, module: Any, experience: Any) -> None:
        return None

    def trains_alone(self, module: Any) -> bool:
        return False

    def advantage_metrics(self, experience: Any) -> dict[str, float]:
        return {}

    def bootstrap_rows(self, experience: Any) -> Any:
        return None


def forward_needs(terms: list[LossTerm]) -> ForwardNeeds:
    """What the shared forward must return for all of ``terms`` together."""
    needs = ForwardNeeds()
    for term in terms:
        needs = needs | term.needs()
    return needs


def experience_hooks(trainer) -> list:
    return [cb for cb in trainer.callbacks if isinstance(cb, ExperienceHook)]


def loss_term_providers(trainer) -> list[LossTerm]:
    """The ``LossTerm`` callbacks, in callback order. A callback with a ``loss_terms`` method that does not
    subclass ``LossTerm`` is an error, not a term silently left out of the loss."""
    terms = []
    for cb in trainer.callbacks:
        if isinstance(cb, LossTerm):
            terms.append(cb)
        elif callable(getattr(cb, "loss_terms", None)):
            raise TypeError(
                f"{type(cb).__name__} defines loss_terms but is not a LossTerm: subclass "
                "lit_rl.learners.LossTerm (class X(L.Callback, LossTerm)) for its terms to count"
            )
    return terms
