"""Masked reductions and the loss-aggregation modes that turn a per-token loss into one scalar.

Every function here takes an explicit boolean mask. Masked positions are *selected away* with
``torch.where`` rather than multiplied by zero, so a NaN/Inf sitting in padding (e.g. a logprob of
a pad token) can neither reach the result nor its gradient. NaN in an *unmasked* value is left to
propagate: it is then a real error upstream, and hiding it would be a silent wrong answer.

Aggregation modes (``AGG_MODES``), for a per-token loss ``l`` of shape (B, T) and mask ``m``:

=========================  =============================================  ==========================
mode                       equation                                       source
=========================  =============================================  ==========================
token_mean                 Σ_{i,t} m l / Σ_{i,t} m                        DAPO, arXiv 2503.14476
seq_mean_token_mean        1/|S| Σ_{i∈S} (Σ_t m l / Σ_t m)                GRPO, arXiv 2402.03300
seq_mean_token_sum         1/|S| Σ_{i∈S} Σ_t m l                          (sequence-sum loss)
seq_mean_token_sum_norm    1/|S| Σ_{i∈S} Σ_t m l / H                      Dr. GRPO, arXiv 2503.20783
=========================  =============================================  ==========================

where S is the set of rows with at least one unmasked token and H the horizon (default T).
"""

from __future__ import annotations

import numbers
from typing import get_args

import torch
from torch import Tensor

from lit_rl.core.names import LossAgg

AGG_MODES: tuple[str, ...] = get_args(LossAgg)  # the modes, declared once as the Literal (core/names.py)


def check_mask(x: Tensor, mask: Tensor, x_name: str = "x", mask_name: str = "mask") -> None:
    """Reject a mask that is not ``torch.bool`` (TypeError) or whose shape differs from ``x`` (ValueError).

    A float or int mask is refused rather than cast: a 0/1 float mask multiplied in elsewhere would
    still let NaN through (NaN * 0 = NaN), and an int mask used for indexing means something else.

    Shapes:
        x: any shape; mask: same shape as x.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{mask_name} must be a torch.bool tensor, got {got}")
    if mask.shape != x.shape:
        raise ValueError(
            f"{mask_name} shape {tuple(mask.shape)} does not match {x_name} shape {tuple(x.shape)}"
        )


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is True: Σ m·x (masked values never contribute).

    Shapes:
        x: (B, T) (any shape works); mask: same as x.
        returns: scalar if ``dim`` is None, else x's shape with ``dim`` removed.
    """
    check_mask(x, mask)
    picked = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of True entries of ``mask`` (int64), over everything or along ``dim``.

    Shapes:
        mask: (B, T); returns: scalar if ``dim`` is None else (B,) for dim=1 / (T,) for dim=0.
    """
    return mask.sum() if dim is None else mask.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over unmasked positions: Σ m·x / Σ m.

    A slice with no unmasked position gives 0 (not NaN): its count is clamped to 1 before dividing,
    which is exact because its sum is 0 as well.

    Shapes:
        x: (B, T); mask: (B, T); returns: scalar if ``dim`` is None, else reduced along ``dim``.
    """
    total = masked_sum(x, mask, dim)
    count = masked_count(mask, dim).clamp_min(1).to(total.dtype)
    return total / count


def masked_var(x: Tensor, mask: Tensor, dim: int | None = None, unbiased: bool = False) -> Tensor:
    """Variance of ``x`` over unmasked positions.

    Population form (default): Σ m·(x − μ)² / n;  unbiased form: Σ m·(x − μ)² / (n − 1),
    with μ the masked mean and n = Σ m. Slices with n = 0 (or n = 1 when unbiased) give 0, not NaN,
    because their denominator is clamped to 1 and their numerator is 0.

    Shapes:
        x: (B, T); mask: (B, T); returns: scalar if ``dim`` is None, else reduced along ``dim``.
    """
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)  # broadcast the per-slice mean back over ``dim``
    sq = masked_sum((x - mean) ** 2, mask, dim)
    n = masked_count(mask, dim)
    denom = (n - 1 if unbiased else n).clamp_min(1).to(sq.dtype)
    return sq / denom


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Standardise ``x`` with statistics taken over all unmasked positions (e.g. PPO advantage whitening).

    y = (x − μ) / sqrt(σ² + eps), and y + μ when ``shift_mean`` is False (rescale only, keep the mean,
    as for whitening a reward whose sign matters). σ² is the population variance (``masked_var``
    default); TRL's ``masked_whiten`` uses the unbiased one — the two differ by n/(n−1), which is
    negligible over a batch of tokens. Masked positions of the output are 0.

    Shapes:
        x: (B, T); mask: (B, T); returns: (B, T).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    y = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        y = y + mean
    return torch.where(mask, y, torch.zeros((), dtype=y.dtype, device=y.device))


def _check_denominator(name: str, value: float | Tensor | None) -> None:
    """A global count must be positive. Tensors (e.g. an all-reduced count) are not read back to the
    host here — that would force a device sync every micro-batch — so only Python numbers are checked."""
    if value is None or isinstance(value, Tensor):
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    horizon: int | None = None,
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token quantity (usually a loss) to one scalar with one of ``AGG_MODES``.

    Equations (m = mask, S = rows with ≥ 1 unmasked token, H = ``horizon``):
        token_mean               Σ_{i,t} m·l / N_tok                    (DAPO, arXiv 2503.14476)
        seq_mean_token_mean      Σ_{i∈S} (Σ_t m·l / Σ_t m) / N_seq      (GRPO, arXiv 2402.03300)
        seq_mean_token_sum       Σ_{i∈S} Σ_t m·l / N_seq
        seq_mean_token_sum_norm  Σ_{i∈S} (Σ_t m·l / H) / N_seq          (Dr. GRPO, arXiv 2503.20783)
    with N_tok = Σ m and N_seq = |S| unless overridden (below).

    Empty rows: a row with no unmasked token contributes nothing and is not counted in N_seq (so it
    cannot drag a sequence mean towards 0). An all-masked input returns 0 that still depends on
    ``values`` (a sum of selected-away zeros), so ``backward()`` works and gives zero gradients.

    Global denominators — gradient accumulation and data parallelism: a micro-batch (or a rank)
    only sees part of the global batch, and "mean of micro-batch means" is *not* the global
    token_mean when micro-batches hold different numbers of tokens. Pass the global counts instead:
    ``num_tokens`` = unmasked tokens in the whole global batch (token_mean) and ``num_seqs`` = non-empty
    rows in the whole global batch (seq_mean_* modes). Each micro-batch then returns its *partial*
    loss, Σ_local / N_global, and the partial losses (summed over micro-batches, and over ranks)
    equal the full-batch loss exactly — so call ``backward`` on each partial loss without rescaling.
    (DDP *averages* gradients over ranks, so there multiply each rank's partial loss by world size.)
    Each mode reads only its own override, so a caller may always pass both.
    For ``seq_mean_token_sum_norm`` fix ``horizon`` (e.g. to max_new_tokens) when micro-batches are
    padded to different lengths; the default H = T would otherwise differ between them.

    Args:
        values: per-token values, floating.
        mask: True where a token counts (e.g. generated, non-padding action tokens).
        mode: one of ``AGG_MODES``.
        horizon: H for ``seq_mean_token_sum_norm``; defaults to T = values.shape[1].
        num_tokens: global token count replacing Σ m in ``token_mean``.
        num_seqs: global non-empty-row count replacing |S| in the seq_mean_* modes.

    Shapes:
        values: (B, T); mask: (B, T) bool; returns: scalar ().
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    if values.dim() != 2:
        raise ValueError(f"values must be (B, T), got shape {tuple(values.shape)}")
    check_mask(values, mask, "values", "mask")
    if not values.is_floating_point():
        raise TypeError(f"values must be a floating tensor, got {values.dtype}")
    _check_denominator("num_tokens", num_tokens)
    _check_denominator("num_seqs", num_seqs)

    if mode == "token_mean":
        total = masked_sum(values, mask)
        denom = masked_count(mask).clamp_min(1) if num_tokens is None else num_tokens
        return total / denom

    row_sum = masked_sum(values, mask, dim=1)  # (B,)
    row_count = masked_count(mask, dim=1)  # (B,)
    if mode == "seq_mean_token_mean":
        per_row = row_sum / row_count.clamp_min(1).to(row_sum.dtype)  # empty rows: 0 / 1 = 0
    elif mode == "seq_mean_token_sum":
        per_row = row_sum
    else:  # seq_mean_token_sum_norm
        h = max(values.shape[1], 1) if horizon is None else horizon  # T = 0: every row is empty anyway
        if not isinstance(h, numbers.Real) or isinstance(h, bool) or not h > 0:
            raise ValueError(f"horizon must be a positive number, got {horizon!r}")
        per_row = row_sum / h
    denom = (row_count > 0).sum().clamp_min(1) if num_seqs is None else num_seqs
    return per_row.sum() / denom
