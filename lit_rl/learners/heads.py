"""The policy's output projection as data: when the vocabulary logits can be left unmaterialised, and a forward
dict whose ``logits`` are computed only if a consumer reads them.

``PolicyModule.forward_outputs`` runs the CausalLM without projecting any position and hands back the last
hidden states plus the LM head's (weight, bias) (``core.fused_logprobs.Projection``). That is exact only when
the CausalLM's logits are literally ``lm_head(hidden)``; ``lm_head_projection`` says when, and otherwise the
module keeps the materialised path (stated once in the log, with the reason).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

# Config fields of architectures whose logits are not lm_head(hidden) alone (post-head softcapping / scaling).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def projection_blocker(model, sharded_ok: bool = False) -> str | None:
    """Why ``model``'s logits cannot be computed from its hidden states + a plain LM head here; None = they can.

    Checked: a ``get_decoder()`` (the hidden states come from a forward hook on it), an output embedding that
    is exactly ``torch.nn.Linear`` (a LoRA-wrapped ``lm_head`` is not: its low-rank path would be skipped),
    a weight that is not a DTensor, and no post-head logit transform in the config. ``sharded_ok`` skips the
    DTensor check: FSDP2 shards the head weight at rest, but the root unit that holds it is not resharded after
    its forward, so right after the CausalLM's forward the weight is the unsharded tensor the backward uses
    (``head_weight_after_forward``).
    """
    get_dec, get_out = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_dec is None or get_out is None:
        return "the model has no get_decoder()/get_output_embeddings()"
    try:
        dec, head = get_dec(), get_out()
    except (AttributeError, NotImplementedError) as e:
        return f"get_decoder()/get_output_embeddings() failed: {e}"
    if dec is None or head is None:
        return "the model exposes no decoder or no output embeddings"
    if type(head) is not torch.nn.Linear:
        return f"the output projection is a {type(head).__name__} (e.g. LoRA on lm_head), not a plain Linear"
    try:
        from torch.distributed.tensor import DTensor

        sharded = isinstance(head.weight, DTensor)
    except ImportError:  # pragma: no cover
        sharded = False
    if not sharded_ok and sharded:
        return "the output projection's weight is a DTensor (FSDP2-sharded)"
    if hasattr(
        head.weight, "ds_id"
    ):  # ZeRO-3 gathers it only inside lm_head's own forward and frees it after
        return "the output projection's weight is a DeepSpeed ZeRO-3 partition"
    cfg = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        v = getattr(cfg, name, None)
        if v not in (None, 1, 1.0):
            return f"config.{name}={v!r} transforms the logits after the head"
    return None


_warned: set[str] = set()


def _warn_once(model, why: str) -> None:
    if why not in _warned:
        _warned.add(why)
        log.warning("lit_rl: vocabulary logits are materialised for %s: %s", type(model).__name__, why)


_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> None (exact) | why not
CHECK_POSITIONS = 8


@torch.no_grad()
def logits_mismatch(model) -> str | None:
    """Why ``lm_head(hidden)`` is not the model's own logits, checked on ``CHECK_POSITIONS`` positions of one
    forward; None = equal (to 1e-3 relative to the largest logit).

    The config names in ``_LOGIT_TRANSFORMS`` are only the known ways a CausalLM changes its logits after the
    head; a model that soft-caps or scales under another name (a config field, a subclass's forward, a forward
    hook) would otherwise get silently wrong log-probs on the chunked path.
    """
    dev = next(model.parameters()).device
    V = model.get_output_embeddings().weight.shape[0]
    ids = (torch.arange(CHECK_POSITIONS, device=dev) * 7919 % V).unsqueeze(
        0
    )  # (1, L) spread over the vocabulary
    seen: dict[str, Tensor] = {}
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, o: seen.__setitem__(
            "h", o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]
        )
    )
    try:
        out = model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    proj = head_weight_after_forward(model)
    if proj is None or "h" not in seen or getattr(out, "logits", None) is None:
        return "the model's own logits could not be compared with lm_head(hidden)"
    weight, bias = proj
    ref = out.logits[0].double()  # (L, V)
    got = torch.nn.functional.linear(seen["h"][0].to(weight.dtype), weight, bias).double()  # (L, V)
    if got.shape != ref.shape:
        return f"lm_head(hidden) has shape {tuple(got.shape)}, the model's logits {tuple(ref.shape)}"
    err = float((got - ref).abs().max())
    if err > 1e-3 * max(1.0, float(ref.abs().max())):
        return (
            f"lm_head(hidden) differs from the model's own logits by up to {err:.3g} (a logit transform "
            "after the head, e.g. soft-capping or scaling)"
        )
    return None


def lm_head_projection(model, sharded_ok: bool = False) -> tuple[Tensor, Tensor | None] | None:
    """(weight (V, H), bias (V,) | None) of ``model``'s output projection, or None (materialised path; the
    reason is logged once per reason). With ``sharded_ok`` a DTensor weight passes (see ``projection_blocker``):
    the caller must read the weight again after the forward (``head_weight_after_forward``).

    The first call for a model also checks numerically that its logits are ``lm_head(hidden)``
    (``logits_mismatch``); the verdict is kept for the model's lifetime."""
    why = projection_blocker(model, sharded_ok)
    if why is None:
        if model not in _checked:
            _checked[model] = logits_mismatch(model)
        why = _checked[model]
    if why is not None:
        _warn_once(model, why)
        return None
    head = model.get_output_embeddings()
    return head.weight, head.bias


def head_weight_after_forward(model) -> tuple[Tensor, Tensor | None] | None:
    """The output projection's (weight, bias) as the backward will see them, read right after a forward.

    Under FSDP2 the root unit (embeddings, tied head, final norm) keeps its parameters unsharded from its
    forward to the end of the backward, so this is the full (V, H) weight FSDP already gathered: the chunked
    path costs no extra all-gather and its weight gradient is reduce-scattered by FSDP like any other. None if
    the weight is still a DTensor (a root resharded after forward): the caller falls back to the logits.
    """
    head = model.get_output_embeddings()
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return head.weight, head.bias
    if isinstance(head.weight, DTensor):
        _warn_once(
            model,
            "the output projection's weight is still a DTensor after the forward (FSDP2 root "
            "resharded after forward)",
        )
        return None
    return head.weight, head.bias


class LazyLogits(dict):
    """A forward-output dict whose ``"logits"`` (b, C, V) are computed from ``"head"`` on first access only.

    Consumers converted to the chunked path read ``head`` / ``hidden`` / ``logprobs`` / ``entropy``; any other
    consumer reading ``fwd["logits"]`` still works (differentiably), at the memory cost of the full logits.
    ``materialized`` counts how often that happened (tests assert the training path never does).
    """

    materialized = 0

    def __missing__(self, key: str) -> Any:
        if key == "logits" and self.get("head") is not None:
            type(self).materialized += 1
            v = self["head"].logits()
            self["logits"] = v
            return v
        raise KeyError(key)
