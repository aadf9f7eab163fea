"""How the policy reads a micro-batch: one forward to the LM head's input, log-probs chunked through the head.

``PolicyForward`` is a mixin of ``PolicyModule`` (it uses ``self.model``, ``self.config``,
``self.temperature`` (the rollout binding's, ``learners/binding.py``) and the class flag
``materialize_logits``); it is its own file because the forward has three shapes: the chunked head path (the
default: no (b, C, V) logits), the shared-prompt pass (each distinct prompt once) and the materialised path
(the test reference, and the fallback for heads the chunked path cannot read).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from lit_rl.core.fused_logprobs import Projection, linear_logprobs
from lit_rl.core.fused_sampler import linear_logprobs_and_sampler
from lit_rl.core.logprobs import token_logprobs
from lit_rl.core.processed import History, LogitProcessing, sampler_logprobs
from lit_rl.data.experience import Experience
from lit_rl.learners.heads import LazyLogits, head_weight_after_forward, lm_head_projection
from lit_rl.learners.host import PolicyHost
from lit_rl.models.packed import DEFAULT_ROW_TOKENS, pack_rows, unsupported_reason
from lit_rl.models.shared_prompt import shared_prompt_outputs


def _checkpoint_layers(model) -> list[torch.nn.Module]:
    """The modules transformers checkpoints (its ``GradientCheckpointingLayer`` decoder layers) when enabled."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]


def enable_gradient_checkpointing(model, enabled: bool = True) -> None:
    """Transformers' gradient checkpointing on every decoder layer, non-reentrant (``use_reentrant=False``:
    exact gradients, no ``requires_grad`` input needed, works under a PEFT wrapper). Each layer's activations
    are recomputed in the backward instead of kept, in training mode only (the engines generate in eval mode).

    A checkpointed layer drops its key/value cache (a replay would write it twice), so ``PolicyForward`` runs
    the shared-prompt pass only without checkpointing, and a forward that must return a cache (a critic's
    yes/no value head) runs with checkpointing off. Dropout stays off (``disable_dropout``), so the replay
    computes the same function as the first forward."""
    if not enabled:
        return
    if not getattr(model, "supports_gradient_checkpointing", True):
        raise ValueError(
            f"gradient_checkpointing: {type(model).__name__} does not support it (transformers' "
            "supports_gradient_checkpointing is False)"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not _checkpoint_layers(model):
        raise ValueError(
            f"gradient_checkpointing: {type(model).__name__} has no checkpointable decoder layer"
        )


@contextmanager
def checkpointing_off(model):
    """Run the enclosed forward without gradient checkpointing (its backward then needs no replay)."""
    layers = _checkpoint_layers(model)
    for m in layers:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True


def real_completion_tokens(micro: Experience) -> Tensor:
    """(b, C) bool: the completion positions that hold a token (the attention mask's completion part). The LM
    head runs on these only: a padded block can be mostly padding, and the head is the widest matmul."""
    return micro.attention_mask[:, micro.prompt_len :].bool()


class PolicyForward(PolicyHost):
    """Forward and log-prob methods of ``PolicyModule`` (see the module doc; the state they read is declared in
    ``PolicyHost``)."""

    materialize_logits: bool = False  # PolicyModule's class flag (the test reference path); see there
    # The rollout sampler's processing and temperature: properties of ``RolloutBound`` (learners/binding.py),
    # read from the rollout binding's sampling settings. Declared here without a value: a class attribute of
    # this mixin would shadow those properties (it comes first in PolicyModule's bases).
    processing: LogitProcessing
    temperature: float

    def forward_logits(self, micro: Experience, model=None, return_hidden: bool = False):
        """Logits predicting each completion token: (b, C, V); entry t is read at sequence position P+t-1.

        Materialises the full logits: only for consumers that need them (tests, a model without a plain output
        projection); the training path uses ``forward_outputs``' ``head`` instead. ``model`` defaults to the
        policy. With ``return_hidden`` returns ``(logits, hidden)``, hidden = last-layer states (b, C, H).
        """
        out = self.forward_outputs(micro, model, hidden=return_hidden, materialize=True)
        return (out["logits"], out["hidden"]) if return_hidden else out["logits"]

    def forward_outputs(
        self,
        micro: Experience,
        model=None,
        hidden: bool = False,
        cache: bool = False,
        materialize: bool = False,
    ) -> dict[str, Any]:
        """One forward over the micro-batch, without the vocabulary logits when the model allows it.

        Returns a dict with ``head`` — a ``core.fused_logprobs.Projection`` (hidden (b, C, H) at the positions
        predicting the completion tokens, the LM head's weight and bias) from which log-probs, entropy and
        divergences are computed chunk by chunk — or None when the model needs the materialised path
        (``lm_head_projection`` says why); ``hidden`` (b, C, H) (always, on the projection path); ``cache`` (the
        key/value cache when asked, for a yes/no value head) or None; and ``logits`` (b, C, V), computed only
        when read (``LazyLogits``) so a consumer that still needs them keeps working. ``materialize`` forces
        the old path (the full logits from the CausalLM; the test reference).
        """
        model = self.model if model is None else model
        if cache and model.training and _checkpoint_layers(model):  # a checkpointed layer returns no cache
            with checkpointing_off(model):
                return self.forward_outputs(micro, model, hidden=hidden, cache=cache, materialize=materialize)
        dev = next(model.parameters()).device
        att = micro.attention_mask.long().to(dev)
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # left padding: same positions generate() used
        C = micro.completion_len
        materialize = materialize or self.materialize_logits
        kw: dict[str, Any] = {
            "input_ids": micro.input_ids.to(dev),
            "attention_mask": att,
            "position_ids": pos,
            "use_cache": cache,
        }
        proj = None if materialize else lm_head_projection(model, sharded_ok=True)
        packed = self._packed(micro, model) if not cache else None
        run_kw = kw  # what the projection path feeds the model: the padded rows, or the packed ones
        if packed is not None:  # padding-free: real tokens only, each prompt once (models/packed.py)
            run_kw = {
                **packed.model_kwargs(model.config._attn_implementation, next(model.parameters()).dtype),
                "use_cache": False,
            }
        elif not (hidden or cache) and self._shares_prompt(model):
            # a group's rows share their prompt: compute it once (models/shared_prompt.py), same outputs
            shared = shared_prompt_outputs(
                model, kw["input_ids"], att, pos, micro.prompt_len, project=proj is None
            )
            if shared is not None and proj is None:
                return {"logits": shared, "hidden": None, "cache": None, "head": None}  # (b, C, V)
            if shared is not None and proj is not None:
                weight, bias = proj
                return LazyLogits(
                    hidden=shared, head=Projection(shared, weight, bias), cache=None
                )  # (b, C, H)
        if proj is None and packed is not None:  # e.g. ZeRO-3's head: the packed rows' logits, gathered back
            out = model(**run_kw, output_hidden_states=hidden)
            return {
                "logits": packed.gather(out.logits),
                "cache": None,
                "head": None,  # (b, C, V)
                "hidden": packed.gather(out.hidden_states[-1]) if hidden else None,
            }  # (b, C, H)
        if proj is None:
            return self._materialised_outputs(model, kw, C, hidden, cache)
        seen: dict[str, Tensor] = {}
        # The decoder's output is exactly what the CausalLM feeds its lm_head (final norm applied); the
        # CausalLM itself runs (hooks of FSDP / PEFT wrappers included) but projects no position (an empty
        # ``logits_to_keep`` index), so no (b, L, V) tensor is created.
        hook = model.get_decoder().register_forward_hook(
            lambda m, a, o: seen.__setitem__(
                "h", o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]
            )
        )
        try:
            out = model(**run_kw, logits_to_keep=torch.zeros(0, dtype=torch.long, device=dev))
        finally:
            hook.remove()
        proj = head_weight_after_forward(
            model
        )  # FSDP2: the unsharded weight the root unit holds until backward
        if proj is None:
            return self._materialised_outputs(model, kw, C, hidden, cache)
        weight, bias = proj
        h = packed.gather(seen["h"]) if packed is not None else seen["h"][:, -(C + 1) : -1]  # (b, C, H)
        return LazyLogits(
            hidden=h, head=Projection(h, weight, bias), cache=out.past_key_values if cache else None
        )

    def _packed(self, micro: Experience, model):
        """The micro-batch packed padding-free (``models/packed.py``), or None for the padded forward. ``true``:
        packed (the policy was checked when it was built; a reference or teacher that cannot be packed runs
        padded); ``null`` (the default): packed wherever the model takes a packed forward, except a float64
        model, as ``share_prompt_forward``: transformers' RMSNorm computes in float32 inside, so there the two
        layouts differ by ~1e-7, and the exact float64 checks compare layouts. Both layouts compute the same
        function (float64-equal with an exact RMSNorm, tests/test_packed.py); packed measured faster at every
        completion fill (docs/guides/scaling-out.md "No padding at all"). ``false``: padded."""
        fw = self.config.forward
        if fw.padding_free is False or unsupported_reason(model) is not None:
            return None
        if fw.padding_free is None and next(model.parameters()).dtype == torch.float64:
            return None
        # the Experience may still be on the CPU (the no-grad passes run before ``training_step`` moves it)
        return pack_rows(
            micro.input_ids,
            micro.attention_mask,
            micro.prompt_len,
            fw.pack_row_tokens or DEFAULT_ROW_TOKENS,
            device=next(model.parameters()).device,
        )

    def _shares_prompt(self, model) -> bool:
        """``share_prompt_forward`` resolved for this model: None = on, except for a float64 model (see the
        argument's doc); never for a sharded model (FSDP2 DTensor or ZeRO-3 parameters), whose units gather
        and free weights once per forward and backward (two forwards before one backward are not tested); never
        under gradient checkpointing (its layers drop the prompt's cache: ``enable_gradient_checkpointing``)."""
        if model.training and _checkpoint_layers(model):
            return False
        share = self.config.forward.share_prompt_forward
        if share is None:
            share = next(model.parameters()).dtype != torch.float64
        if not share:
            return False
        try:
            from torch.distributed.tensor import DTensor

            sharded: tuple[type, ...] = (DTensor,)
        except ImportError:  # pragma: no cover
            sharded = ()
        return not any(isinstance(p, sharded) or hasattr(p, "ds_id") for p in model.parameters())

    @staticmethod
    def _materialised_outputs(model, kw: dict[str, Any], C: int, hidden: bool, cache: bool) -> dict[str, Any]:
        """The old path: the CausalLM's own (b, C, V) logits (the reference, and the fallback)."""
        out = model(**kw, logits_to_keep=C + 1, output_hidden_states=hidden)
        return {
            "logits": out.logits[:, :-1],  # (b, C, V)
            "hidden": out.hidden_states[-1][:, -(C + 1) : -1] if hidden else None,  # (b, C, H)
            "cache": out.past_key_values if cache else None,
            "head": None,
        }

    def completion_logprobs(self, micro: Experience, logits: Tensor | None = None, model=None) -> Tensor:
        """log π(y_t) of every completion token at the module's temperature, (b, C), 0 at padding positions;
        chunked through the LM head (no logits materialised, real completion tokens only) unless ``logits`` are
        given or the model needs the materialised path. The model's full softmax(z / T): what KL and entropy read."""
        if logits is None:
            out = self.forward_outputs(micro, model)
            return self._full_logprobs(micro, out)
        lp = token_logprobs(
            logits,
            micro.completion_ids.to(logits.device),
            self.config.forward.logprob_chunk_size,
            self.temperature,
        )
        return lp.masked_fill(~real_completion_tokens(micro).to(lp.device), 0.0)  # 0 at padding, as chunked

    def _full_logprobs(self, micro: Experience, out: dict[str, Any]) -> Tensor:
        """``completion_logprobs`` of an existing forward ``out``."""
        return self.logprobs_of(micro, out, sampler=False)[0]

    def logprobs_of(
        self, micro: Experience, out: dict[str, Any], entropy: bool = False, sampler: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(log π(y_t), H(π)(t) or None, log π^s(y_t) or None) of forward ``out``, each (b, C), 0 at padding,
        differentiable: the model's full softmax(z / T) log-probs (what KL terms read), its entropy (None on the
        materialised path or without ``entropy``), and the rollout sampler's (``core.processed``: the trainer's
        scores truncated / penalised as the engine's were, renormalised over the kept set), None while the
        processing is inactive (π^s is then the full softmax) or without ``sampler``. Chunked through the LM head
        in one pass when ``out["head"]`` exists (no (b, C, V) tensor; real completion tokens only)."""
        h, head = self.config.forward, out["head"]
        proc = self.processing if sampler else LogitProcessing()
        dev = head.hidden.device if head is not None else out["logits"].device
        mask, ids = real_completion_tokens(micro).to(dev), micro.completion_ids.to(dev)
        hist = None  # the tokens the repetition penalty applies to at each position
        if proc.active and proc.repetition_penalty != 1:
            hist = History.of(micro.input_ids.to(dev), micro.attention_mask.to(dev), micro.prompt_len)
        if head is not None and proc.active:
            lp, ent, lps = linear_logprobs_and_sampler(
                head.hidden,
                head.weight,
                ids,
                proc,
                mask,
                head.bias,
                hist,
                h.logprob_chunk_size,
                entropy=entropy,
            )
            return lp, (ent if entropy else None), lps
        if head is not None:
            lp, ent = linear_logprobs(
                head.hidden,
                head.weight,
                ids,
                head.bias,
                self.temperature,
                h.logprob_chunk_size,
                entropy=entropy,
                mask=mask,
            )
            return lp, (ent if entropy else None), None
        logits = out["logits"]
        lp = token_logprobs(logits, ids, h.logprob_chunk_size, self.temperature).masked_fill(~mask, 0.0)
        return lp, None, (sampler_logprobs(logits, ids, proc, mask, hist) if proc.active else None)

    def old_logprobs_pair(self, micro: Experience) -> tuple[Tensor, Tensor | None]:
        """One no-grad forward's (log π^s, log π) of a micro-batch: the ratio's denominator and, when the sampling
        is processed, the full distribution's log-probs for KL-type quantities (else None: the same values)."""
        lp, _, lps = self.logprobs_of(micro, self.forward_outputs(micro))
        return (lp, None) if lps is None else (lps, lp)

    @torch.no_grad()
    def kl_policy_logprobs(self, exp: Experience) -> Tensor:
        """(B, C) log π_old(y_t) of the model's full softmax(z / T), for what compares the policy with another model
        at rollout time (reward-form KL, a teacher's advantage): ``old_full_logprobs`` or ``old_logprobs`` when the
        module computed them; with plain sampling the engine's ``rollout_logprobs`` (the same distribution); with
        processed sampling a no-grad forward (the engine's are the truncated distribution: comparing them with a
        full-softmax reference would report a KL where the policy equals the reference)."""
        if exp.old_full_logprobs is not None:
            return exp.old_full_logprobs
        if not self.processing.active:
            if exp.old_logprobs is not None:
                return exp.old_logprobs
            if exp.rollout_logprobs is not None:
                return exp.rollout_logprobs
        chunks = [self.completion_logprobs(m) for m in exp.micro_batches(self.config.step.micro_batch_size)]
        lp = torch.cat([c.to(exp.input_ids.device) for c in chunks])  # (B, C)
        return lp if lp.dtype == torch.float64 else lp.float()
