"""The loss of one micro-batch of ``PolicyModule``: L = L_policy + Σ_terms L_term, from one shared forward.

``_micro_loss`` runs the forward every part reads (``_training_forward``), the policy objective
(``_policy_loss``, ``core.objective``), then each active loss term's parts, and gates the parts while a term
trains alone. Kept apart from ``learners/policy.py``, which owns the iteration loop and the micro-batch plan
that calls it, as ``PolicyModule``'s other pieces are (``PolicyForward``, ``OldLogprobs``, ``PolicyAssembly``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rl.core.logprobs import entropy_from_logits
from lit_rl.core.objective import ObjectiveInputs, policy_objective
from lit_rl.data.experience import Experience
from lit_rl.learners.assembly import advantages_of
from lit_rl.learners.heads import LazyLogits
from lit_rl.learners.host import PolicyHost
from lit_rl.learners.optim_step import LossParts
from lit_rl.learners.protocols import ForwardNeeds, LossTerm, forward_needs


class MicroLoss(PolicyHost):
    """Mixin of ``PolicyModule`` (uses ``self.config``, ``temperature``, ``active_loss_terms``,
    ``forward_outputs``, ``logprobs_of``; sets ``_last_metrics``: declared in ``PolicyHost``)."""

    def _micro_loss(self, micro: Experience, common: dict[str, Any]) -> LossParts:
        """L = L_policy + Σ_terms L_term on one micro-batch: its loss parts (``{"policy": ..., <part>: ...}``)
        with their metrics attached. One shared forward that every part reads, the policy objective
        (``core.objective``), then each active loss term; a term that trains alone zeroes every other part."""
        terms = self.active_loss_terms()
        fwd, sampled = self._training_forward(micro, common, forward_needs(terms))
        loss = self._policy_loss(micro, fwd, sampled)
        alone: set[str] = set()
        for term in terms:
            parts = _loss_parts(term.loss_terms(self, micro, fwd))
            _add_parts(loss, parts, term)
            if term.trains_alone(self):  # e.g. a critic's value-only warmup
                alone.update(parts)
        loss = _train_alone(loss, alone)
        self._last_metrics = loss.metrics
        return loss

    def _training_forward(
        self, micro: Experience, common: dict[str, Any], needs: ForwardNeeds
    ) -> tuple[LazyLogits, Tensor | None]:
        """The micro-batch's one forward as every part of the loss reads it (``fwd``, ``protocols.py``): the
        model's full-softmax log-probs (KL terms read them) and entropy, the train mask, what the terms
        need (hidden states for a shared value head, or its key/value cache), the minibatch denominators.
        Also the rollout sampler's log-probs (``core.processed``; None while they are the full softmax's)."""
        out = self.forward_outputs(micro, hidden=needs.hidden, cache=needs.cache)
        logprobs, entropy, sampled = self.logprobs_of(micro, out, entropy=True)
        mask = micro.train_mask  # the one training mask: valid, trainable rows' generated tokens
        # ``logits`` stay unmaterialised unless a consumer reads them (LazyLogits)
        fwd = LazyLogits(
            common,
            logprobs=logprobs,
            entropy=entropy,
            mask=mask,
            hidden=out["hidden"],
            head=out["head"],
            cache=out["cache"],
        )
        if out["head"] is None:
            fwd["logits"] = out["logits"]
        return fwd, sampled

    def _policy_loss(self, micro: Experience, fwd: LazyLogits, sampled: Tensor | None) -> LossParts:
        """L_policy (``core.objective.policy_objective``) and its metrics. The ratio and the mismatch
        correction compare the sampler's distribution with itself (``sampled``, core.processed); the entropy
        metric reads the model's full softmax, from the logits on the materialised path (no gradient: a term
        computes its own)."""
        entropy, mask = fwd["entropy"], fwd["mask"]
        if entropy is None and mask.any():
            with torch.no_grad():
                entropy = entropy_from_logits(
                    fwd["logits"].detach(), self.config.forward.logprob_chunk_size, self.temperature
                )
        parts, metrics = policy_objective(
            ObjectiveInputs(
                logprobs=fwd["logprobs"] if sampled is None else sampled,
                mask=mask,
                advantages=advantages_of(micro),
                num_tokens=fwd["num_tokens"],
                num_seqs=fwd["num_seqs"],
                horizon=fwd.get("horizon"),
                old_logprobs=micro.old_logprobs,
                rollout_logprobs=micro.rollout_logprobs,
                is_weights=micro.is_weights,
                entropy=entropy,
            ),
            self.config.objective,
        )
        return LossParts(parts, metrics)


def _loss_parts(parts: dict[str, Tensor]) -> LossParts:
    """A term's return as ``LossParts``: a plain dict carries no metrics or shares."""
    return parts if isinstance(parts, LossParts) else LossParts(parts)


def _add_parts(loss: LossParts, parts: LossParts, term: LossTerm) -> None:
    """Add one term's parts (and their metrics, shares) to the micro-batch's loss. Two parts of one name would
    silently replace each other in the sum: an error instead."""
    if clash := sorted(loss.keys() & parts.keys()):
        raise ValueError(
            f"{type(term).__name__} adds the loss part {clash[0]!r}, which another term (or the "
            "policy objective) already added; give one of the two terms another part name"
        )
    loss.update(parts)
    loss.metrics.update(parts.metrics)
    loss.shares.update(parts.shares)


def _train_alone(loss: LossParts, alone: set[str]) -> LossParts:
    """While some term trains alone (a critic's warmup), every other part is multiplied by 0: still logged and
    backpropagated (the same graph every step), adding nothing to the gradient."""
    if not alone:
        return loss
    return LossParts({k: v if k in alone else v * 0.0 for k, v in loss.items()}, loss.metrics, loss.shares)
