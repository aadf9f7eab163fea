"""Dropout off for RL: every pass of an RL step must see the same function of the weights.

The rollout, the old-log-prob pass, the reference and critic-value passes and the training forward all
evaluate the same policy; with dropout active each would draw its own mask, so the PPO ratio, the
importance weights and the mismatch KL would be noise even at θ = θ_old. TRL's trainers disable dropout in
the policy for the same reason. ``disable_dropout`` zeroes every dropout probability a transformers model
reads: ``nn.Dropout`` modules and the float attributes attention implementations pass to their functional
dropout (``attention_dropout`` / ``dropout`` / ``attn_pdrop`` ...), plus the config fields, so a model
rebuilt from the saved config has none either.
"""

from __future__ import annotations

import torch

_CONFIG_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "dropout",
    "activation_dropout",
    "attn_pdrop",
    "resid_pdrop",
    "embd_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "summary_first_dropout",
)
_MODULE_ATTRS = ("attention_dropout", "dropout", "dropout_p", "attn_dropout_p")


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability of ``model`` to 0 (in place); returns how many places were changed."""
    changed = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            changed += m.p != 0
            m.p = 0.0
        for attr in _MODULE_ATTRS:
            v = getattr(m, attr, None)
            if isinstance(v, float) and not isinstance(v, bool):
                changed += v != 0
                setattr(m, attr, 0.0)
    cfg = getattr(model, "config", None)
    for key in _CONFIG_KEYS:
        if cfg is not None and isinstance(getattr(cfg, key, None), float):
            setattr(cfg, key, 0.0)
    return int(changed)
