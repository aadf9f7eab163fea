"""KL divergences: sampled per-token estimators, and exact ones from full logits.

Two situations call for a KL term in RL post-training:

* Against a frozen reference policy, where only the log-prob of the *sampled* token is at hand
  under both models: :func:`kl_estimate` gives Schulman's k1/k2/k3 Monte-Carlo estimators of
  KL(π‖π_ref) from tokens sampled from π. Only from π: when the tokens come from a truncated or
  otherwise processed sampler π^s ≠ π (:func:`sampler_differs`) their mean is Σ_a π^s(a)·k(a), not
  the KL, and the exact per-position KL from both models' logits (below) is the unbiased choice.
* Distillation, where both student and teacher logits over the whole vocabulary are available:
  :func:`kl_from_logits` (forward or reverse KL, exact per position) and :func:`generalized_jsd`.

Convention throughout: ``p`` is the *student* (the policy being trained), ``q`` the teacher /
reference. Shapes: B rows (completions), T tokens, V vocabulary.
"""

from __future__ import annotations

import math

import torch

from lit_rl.core.logprobs import (
    _check_logits,
    _check_mask,
    _check_temperature,
    _compute_dtype,
    _raise_if_nonfinite,
    rowwise_chunked,
)
from lit_rl.core.processed import LogitProcessing
from lit_rl.core.registry import Registry

__all__ = [
    "DEFAULT_LOG_RATIO_CLAMP",
    "KL_DIRECTIONS",
    "KL_ESTIMATORS",
    "KL_KINDS",
    "generalized_jsd",
    "kl_estimate",
    "kl_from_logits",
    "sampler_differs",
]

# --------------------------------------------------------------------------------------------
# sampled estimators (Schulman 2020, http://joschu.net/blog/kl-approx.html; no arXiv id)
# --------------------------------------------------------------------------------------------
KL_ESTIMATORS: Registry = Registry("kl_estimator")


@KL_ESTIMATORS.register("k1")
def _k1(log_r: torch.Tensor) -> torch.Tensor:
    """k1 = -log r: unbiased, high variance, can be negative per token; as a loss its expected gradient
    is 0 (see ``kl_estimate``)."""
    return -log_r


@KL_ESTIMATORS.register("k2")
def _k2(log_r: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log r)²: biased (exact only to second order as π_ref → π), low variance, ≥ 0; as a loss
    its expected gradient is ∇ KL(π‖π_ref) (see ``kl_estimate``)."""
    return 0.5 * log_r.square()


@KL_ESTIMATORS.register("k3")
def _k3(log_r: torch.Tensor) -> torch.Tensor:
    """k3 = (r - 1) - log r: unbiased (E_π[r] = 1), low variance, ≥ 0; as a loss its expected gradient
    is ∇ KL(π_ref‖π), not ∇ KL(π‖π_ref) (see ``kl_estimate``). expm1 keeps r - 1 accurate when r ≈ 1,
    which is the common case."""
    return torch.expm1(log_r) - log_r


KL_KINDS: tuple[str, ...] = tuple(KL_ESTIMATORS.names())  # ("k1", "k2", "k3")

# |log r| beyond 20 means the two policies disagree by a factor > e^20 ≈ 5e8 on a sampled token;
# k3 then holds e^20 and, in fp32, overflows to inf from log r ≈ 88. The clamp keeps the loss
# finite at the cost of a biased (under-)estimate and zero gradient for those rare tokens.
DEFAULT_LOG_RATIO_CLAMP = 20.0


def sampler_differs(processing: LogitProcessing | None) -> str | None:
    """Why a sampler with these settings does not draw from the model's softmax(z / T) itself — the settings
    that make π^s ≠ π, e.g. ``"top_k=3, top_p=0.9"`` — or None when it does (None: no processing known).

    Where it is not None, a sampled estimator's mean (:func:`kl_estimate`, a sampled distillation advantage) is
    an expectation under π^s, and the probability outside the kept set is out of every sample's reach."""
    if processing is None:
        return None
    if processing.greedy:
        return "temperature=0 (greedy)"
    why = [
        f"{name}={value}"
        for name, value, off in (
            ("top_k", processing.top_k, 0),
            ("top_p", processing.top_p, 1.0),
            ("min_p", processing.min_p, 0.0),
            ("repetition_penalty", processing.repetition_penalty, 1.0),
        )
        if value != off
    ]
    return ", ".join(why) or None


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str,
    mask: torch.Tensor | None = None,
    log_ratio_clamp: float | None = DEFAULT_LOG_RATIO_CLAMP,
) -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from tokens sampled from π.

    With ``log r = ref_logprobs - logprobs`` (log π_ref(y) - log π(y) at the sampled token y):

    * ``k1 = -log r``                  unbiased, high variance
    * ``k2 = ½ (log r)²``              biased, low variance, non-negative
    * ``k3 = (r - 1) - log r``         unbiased, low variance, non-negative (the estimator of
                                       GRPO, arXiv 2402.03300)

    *As values* k1 and k3 have expectation KL(π‖π_ref) under y ~ π; k2 does not. *As a loss* (y ~ π held
    fixed, the estimator differentiated through log π(y), as a KL-in-loss term is), the expected
    gradients are, exactly:

    * k1: E_π[∇ log π(y)] = 0 — no gradient in expectation (k1 belongs in the reward);
    * k2: E_π[log(π/π_ref)(y) ∇ log π(y)] = ∇ KL(π‖π_ref);
    * k3: E_π[(1 - r(y)) ∇ log π(y)] = -Σ_y π_ref(y) ∇ log π(y) = ∇ KL(π_ref‖π), the *forward* KL,
      although its value estimates KL(π‖π_ref). The two gradients agree to first order as π → π_ref.

    Checked by exact enumeration over a small vocabulary in float64 (tests/core/test_kl_gradients.py).

    Reference: J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html.
    Departure: ``log r`` is clamped to ±``log_ratio_clamp`` (default 20, ``None`` disables) before the
    estimator, for numerical safety; this biases the estimate for tokens beyond the bound and gives
    them zero gradient.

    Shapes:
        logprobs, ref_logprobs: (B, T) (any identical shape works), float.
        mask:    optional bool, same shape; False positions return exactly 0 and get zero gradient.
        returns: same shape, dtype of ``logprobs`` / ``ref_logprobs`` promoted.

    Raises ValueError for an unknown ``kind`` (listing KL_KINDS), mismatched shapes, and NaN/Inf
    log-ratios at unmasked positions; TypeError for a non-bool mask.
    """
    estimator = KL_ESTIMATORS.get(kind)
    if not isinstance(logprobs, torch.Tensor) or not isinstance(ref_logprobs, torch.Tensor):
        raise TypeError("logprobs and ref_logprobs must be torch.Tensors")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs shape {tuple(logprobs.shape)} != ref_logprobs shape {tuple(ref_logprobs.shape)}"
        )
    if mask is not None:
        _check_mask(mask, logprobs.shape)
    if log_ratio_clamp is not None and not (float(log_ratio_clamp) > 0):
        raise ValueError(f"log_ratio_clamp must be > 0 or None, got {log_ratio_clamp!r}")
    log_r = ref_logprobs - logprobs
    _raise_if_nonfinite(log_r.detach(), "kl_estimate: log-ratio ref_logprobs - logprobs", mask)
    if mask is not None:
        # Replace masked log-ratios *before* the estimator so garbage there (e.g. -inf log-probs of
        # padding) can neither produce NaN nor leak NaN into the gradient.
        log_r = torch.where(mask, log_r, torch.zeros((), dtype=log_r.dtype, device=log_r.device))
    if log_ratio_clamp is not None:
        log_r = log_r.clamp(-float(log_ratio_clamp), float(log_ratio_clamp))
    kl = estimator(log_r)
    if mask is not None:
        kl = kl.masked_fill(~mask, 0.0)  # k1/k2/k3 of log r = 0 are already 0; explicit for clarity
    return kl


# --------------------------------------------------------------------------------------------
# exact KL from logits
# --------------------------------------------------------------------------------------------
KL_DIRECTIONS: tuple[str, ...] = ("forward", "reverse")


def _kl_rows(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(a/τ) ‖ softmax(b/τ)) for each row of two (r, V) blocks, in fp32/fp64."""
    cdt = _compute_dtype(a.dtype)
    la = torch.log_softmax(a.to(cdt) / temperature, dim=-1)  # (r, V)
    lb = torch.log_softmax(b.to(cdt) / temperature, dim=-1)  # (r, V)
    pa = la.exp()
    # 0·log 0 = 0: entries where the first distribution has no mass contribute nothing, even when
    # both logits are -inf (masked vocabulary), where la - lb would be NaN.
    diff = torch.where(pa > 0, la - lb, torch.zeros((), dtype=cdt, device=a.device))
    return (pa * diff).sum(-1)


def kl_from_logits(
    p_logits: torch.Tensor,
    q_logits: torch.Tensor,
    mask: torch.Tensor,
    direction: str = "reverse",
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Exact KL divergence over the vocabulary at every position, from two sets of logits.

    ``p = softmax(p_logits/τ)`` is the *student* (the policy being trained), ``q = softmax(q_logits/τ)``
    the teacher / reference:

    * ``direction="reverse"``: ``KL(p‖q) = Σ_v p_v (log p_v - log q_v)`` — mode-seeking; the
      per-token objective of on-policy distillation (GKD arXiv 2306.13649 with β → 1; MiniLLM arXiv 2306.08543).
    * ``direction="forward"``: ``KL(q‖p) = Σ_v q_v (log q_v - log p_v)`` — mode-covering; classic
      (sequence-level) knowledge distillation.

    Both use the same temperature τ. Computed chunk by chunk over rows in fp32 (fp64 for fp64
    inputs), differentiable w.r.t. both logits with the backward recomputing each chunk, so no
    full-size fp32 copy is held (see :func:`lit_rl.core.logprobs.rowwise_chunked`).

    Shapes:
        p_logits, q_logits: (B, T, V), identical shapes (same vocabulary; align tokenizers first).
        mask:    (B, T) bool; False positions return exactly 0 and give zero gradient.
        returns: (B, T) float32 (float64 for float64 p_logits).

    Raises ValueError on shape mismatch, unknown direction, temperature <= 0, or non-finite KL at
    an unmasked position (e.g. q has zero mass where p has some); TypeError for a non-bool mask.
    """
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {', '.join(KL_DIRECTIONS)}")
    _check_pair(p_logits, q_logits, mask)
    t = _check_temperature(temperature)
    if direction == "reverse":
        kl = rowwise_chunked(lambda a, b: _kl_rows(a, b, t), p_logits, q_logits, chunk_size=chunk_size)
    else:
        kl = rowwise_chunked(lambda a, b: _kl_rows(b, a, t), p_logits, q_logits, chunk_size=chunk_size)
    _raise_if_nonfinite(kl.detach(), f"kl_from_logits({direction})", mask)
    return torch.where(mask, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


def _check_pair(p_logits: torch.Tensor, q_logits: torch.Tensor, mask: torch.Tensor) -> None:
    _check_logits(p_logits, "p_logits")
    _check_logits(q_logits, "q_logits")
    if p_logits.shape != q_logits.shape:
        raise ValueError(f"p_logits shape {tuple(p_logits.shape)} != q_logits shape {tuple(q_logits.shape)}")
    _check_mask(mask, p_logits.shape[:2])


# --------------------------------------------------------------------------------------------
# generalized Jensen-Shannon divergence (GKD)
# --------------------------------------------------------------------------------------------
def _jsd_rows(a: torch.Tensor, b: torch.Tensor, beta: float, temperature: float) -> torch.Tensor:
    """β·KL(q‖M) + (1-β)·KL(p‖M), M = β q + (1-β) p, rows of (r, V) student a / teacher b blocks."""
    cdt = _compute_dtype(a.dtype)
    lp = torch.log_softmax(a.to(cdt) / temperature, dim=-1)  # (r, V) student
    lq = torch.log_softmax(b.to(cdt) / temperature, dim=-1)  # (r, V) teacher
    fmin = torch.finfo(cdt).min
    # log M by logaddexp (never forms M itself). Clamping the -inf of zero-mass entries keeps the
    # logaddexp gradient finite where both p and q are 0; those entries are dropped below anyway.
    lm = torch.logaddexp(lq.clamp_min(fmin) + math.log(beta), lp.clamp_min(fmin) + math.log1p(-beta))
    zero = torch.zeros((), dtype=cdt, device=a.device)
    p, q = lp.exp(), lq.exp()
    kl_pm = (p * torch.where(p > 0, lp - lm, zero)).sum(-1)
    kl_qm = (q * torch.where(q > 0, lq - lm, zero)).sum(-1)
    return beta * kl_qm + (1.0 - beta) * kl_pm


def generalized_jsd(
    p_logits: torch.Tensor,
    q_logits: torch.Tensor,
    beta: float,
    mask: torch.Tensor,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence of GKD (Agarwal et al., arXiv 2306.13649), per position.

    With ``p`` the student and ``q`` the teacher (softmax of the logits / τ), following the GKD
    paper, where the divergence is written D(p_teacher ‖ p_student) and **β weights the teacher**:

        M = β·q + (1-β)·p,      JSD_β = β·KL(q‖M) + (1-β)·KL(p‖M)

    β = 0.5 is the usual symmetric JSD. At the end points JSD_β itself goes to 0, while
    ``JSD_β / β → KL(q‖p)`` (forward KL) as β → 0 and ``JSD_β / (1-β) → KL(p‖q)`` (reverse KL) as
    β → 1; so β must lie strictly in (0, 1) — use :func:`kl_from_logits` for the limits. (The paper
    and TRL special-case β ∈ {0, 1} as those KLs; here that is an error rather than a silent switch.)
    ``log M`` is computed with logaddexp, never as log of a sum of probabilities.

    Shapes:
        p_logits (student), q_logits (teacher): (B, T, V), identical shapes.
        mask:    (B, T) bool; False positions return exactly 0 and give zero gradient.
        returns: (B, T) float32 (float64 for float64 p_logits).

    Chunked over rows and differentiable w.r.t. both logits like :func:`kl_from_logits`.
    Raises ValueError for β outside (0, 1), shape mismatches, temperature <= 0, non-finite results
    at unmasked positions; TypeError for a non-bool mask.
    """
    b = float(beta)
    if not (0.0 < b < 1.0):
        raise ValueError(
            f"beta must lie strictly in (0, 1), got {beta!r}; for beta -> 0 / 1 use "
            f"kl_from_logits(direction='forward' / 'reverse')"
        )
    _check_pair(p_logits, q_logits, mask)
    t = _check_temperature(temperature)
    jsd = rowwise_chunked(lambda x, y: _jsd_rows(x, y, b, t), p_logits, q_logits, chunk_size=chunk_size)
    _raise_if_nonfinite(jsd.detach(), "generalized_jsd", mask)
    return torch.where(mask, jsd, torch.zeros((), dtype=jsd.dtype, device=jsd.device))
