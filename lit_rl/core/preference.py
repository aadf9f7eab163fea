"""Pairwise preference loss for reward models (Bradley-Terry).

Shapes: P = number of (chosen, rejected) pairs; every tensor here is (P,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["bradley_terry_loss"]


def bradley_terry_loss(
    r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Mean negative log-likelihood of the Bradley-Terry model, P(chosen ≻ rejected) = σ(r_c − r_r − m).

    Equation: L = mean_p −log σ(r_c,p − r_r,p − m_p) = mean_p softplus(−(r_c,p − r_r,p − m_p)), evaluated as a
    softplus so a large reward gap never takes the log of a saturated probability. The reward-model loss of
    InstructGPT (arXiv 2203.02155, eq. 1), after Bradley & Terry (1952); the optional per-pair margin m is
    Llama 2's (arXiv 2307.09288, eq. 2). Departure: InstructGPT averages over all K-choose-2 pairs of a
    prompt; here every pair is its own row (the caller expands rankings into pairs).
    Metrics: ``accuracy`` = fraction of pairs with r_c > r_r (ties count as wrong), ``margin_mean`` =
    mean r_c − r_r.

    Shapes:
        r_chosen, r_rejected, margin: (P,). returns a scalar loss and dict[str, float].

    Raises ValueError on shape mismatch, an empty batch, or NaN/Inf rewards.
    """
    if r_chosen.shape != r_rejected.shape or r_chosen.dim() != 1:
        raise ValueError(
            f"r_chosen shape {tuple(r_chosen.shape)} and r_rejected shape {tuple(r_rejected.shape)} "
            "must be equal and 1-D (P,)"
        )
    if margin is not None and margin.shape != r_chosen.shape:
        raise ValueError(f"margin shape {tuple(margin.shape)} != r_chosen shape {tuple(r_chosen.shape)}")
    if r_chosen.numel() == 0:
        raise ValueError("bradley_terry_loss: no pairs (P = 0)")
    for name, x in (("r_chosen", r_chosen), ("r_rejected", r_rejected)):
        if not bool(torch.isfinite(x.detach()).all()):
            raise ValueError(f"{name} holds NaN or Inf")
    gap = r_chosen - r_rejected  # (P,)
    logit = gap if margin is None else gap - margin.to(gap)
    loss = F.softplus(-logit).mean()
    with torch.no_grad():
        metrics = {"accuracy": float((gap > 0).double().mean()), "margin_mean": float(gap.double().mean())}
    return loss, metrics
