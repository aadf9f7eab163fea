"""Distillation losses: teacher top-k + tail reverse KL, masked cross-entropy, and the loss-name table.

The other distillation divergences live in :mod:`lit_rl.core.kl` (``kl_from_logits`` forward / reverse,
``generalized_jsd``); the sampled reverse KL is the ``"opd"`` advantage of :mod:`lit_rl.core.advantages`
optimised by a policy loss. This module adds what those do not cover:

* :func:`teacher_topk` / :func:`topk_reverse_kl` — reverse KL restricted to the teacher's top-k tokens plus
  one *tail bucket* holding the rest of the mass, so a teacher needs to hand over only (B, T, k) values
  instead of (B, T, V) logits (bounded memory for large vocabularies).
* :func:`masked_cross_entropy` — the per-token negative log-likelihood of rejection-sampled distillation
  (SFT on the teacher's successful rollouts).

Convention as in ``core.kl``: ``p`` is the student (being trained), ``q`` the teacher.
Shapes: B rows (completions), T tokens, V vocabulary, k kept teacher tokens.
"""

from __future__ import annotations

import torch

from lit_rl.core.logprobs import _check_mask, _check_temperature, _compute_dtype, _raise_if_nonfinite

__all__ = [
    "DISTILL_LOSSES",
    "FULL_VOCAB_LOSSES",
    "check_losses",
    "masked_cross_entropy",
    "teacher_topk",
    "topk_reverse_kl",
    "topk_reverse_kl_linear",
]

# Names a DistillModule accepts in ``losses``; the full-vocabulary ones need teacher logits over the
# *student's* vocabulary, i.e. an identical tokenizer.
DISTILL_LOSSES: tuple[str, ...] = (
    "reverse_kl_sampled",
    "reverse_kl_full",
    "topk_reverse_kl",
    "forward_kl",
    "jsd",
    "sft_on_success",
)
FULL_VOCAB_LOSSES: tuple[str, ...] = ("reverse_kl_full", "topk_reverse_kl", "forward_kl", "jsd")


def check_losses(losses: dict[str, float]) -> dict[str, float]:
    """Validate a ``{name: coefficient}`` table: known names, finite coefficients >= 0, at least one term."""
    if not isinstance(losses, dict) or not losses:
        raise ValueError(
            f"losses must be a non-empty mapping name -> coefficient; valid names: "
            f"{', '.join(DISTILL_LOSSES)}"
        )
    out = {}
    for name, coef in losses.items():
        if name not in DISTILL_LOSSES:
            raise ValueError(f"losses: unknown loss {name!r}; valid names: {', '.join(DISTILL_LOSSES)}")
        c = float(coef)
        if not (c >= 0 and c < float("inf")):
            raise ValueError(f"losses.{name}: coefficient must be a finite number >= 0, got {coef!r}")
        out[name] = c
    return out


def _tail_logprob(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log Σ_{v ∉ ids} exp(logp_v) per row, computed by masking the kept entries to -inf then logsumexp
    (never as log(1 - Σ p_k), which cancels catastrophically when the top-k hold almost all mass).

    Shapes: logp (r, V) log-probabilities; ids (r, k) int64; returns (r,)."""
    rest = logp.scatter(-1, ids, float("-inf"))  # (r, V)
    return torch.logsumexp(rest, dim=-1)


@torch.no_grad()
def teacher_topk(
    teacher_logits: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's k most likely tokens per position, their log-probs, and the tail bucket's log-prob.

    ``q = softmax(teacher_logits / τ)``; ``tail = log(1 − Σ_{v∈K} q_v)`` (−inf when the top-k hold all the mass).
    Computed row by row over positions in fp32 (fp64 for fp64 inputs); no gradient (the teacher is frozen).

    Shapes:
        teacher_logits: (B, T, V), or a ``core.fused_logprobs.Projection`` (the teacher's hidden states + LM
            head; its logits are then formed ``linear_chunk_rows`` rows at a time).
        returns: topk_logprobs (B, T, k) float, topk_ids (B, T, k) int64, tail_logprob (B, T) float.
    """
    from lit_rl.core.fused_logprobs import Projection, linear_chunk_rows

    if isinstance(
        teacher_logits, Projection
    ):  # chunk by chunk through the teacher's LM head: never (B, T, V)
        proj = teacher_logits
        B, T = proj.hidden.shape[:2]
        dev = proj.hidden.device
        rows = linear_chunk_rows(proj.vocab_size)
        parts = [
            teacher_topk(proj.rows(slice(s, s + rows), dev)[None], k, temperature)
            for s in range(0, B * T, rows)
        ]
        out = [torch.cat([p[j][0] for p in parts]).reshape(B, T, *parts[0][j].shape[2:]) for j in range(3)]
        return out[0], out[1], out[2]
    V = teacher_logits.shape[-1]
    if not 1 <= k <= V:
        raise ValueError(f"topk k={k} must be in [1, V={V}]")
    t = _check_temperature(temperature)
    cdt = _compute_dtype(teacher_logits.dtype)
    lq = torch.log_softmax(teacher_logits.to(cdt) / t, dim=-1)  # (B, T, V)
    vals, ids = lq.topk(k, dim=-1)  # (B, T, k)
    B, T = lq.shape[:2]
    tail = _tail_logprob(lq.reshape(B * T, V), ids.reshape(B * T, k)).reshape(B, T)  # (B, T)
    return vals, ids, tail


def _check_topk_args(
    topk_logprobs, topk_ids, tail_logprob, mask, temperature: float, B: int, T: int
) -> float:
    """Shape checks shared by both top-k reverse-KL entry points; returns the checked temperature."""
    if topk_ids.shape != topk_logprobs.shape or topk_ids.shape[:2] != (B, T):
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} / topk_logprobs {tuple(topk_logprobs.shape)} must be "
            f"(B, T, k) with (B, T) = {(B, T)}"
        )
    if tail_logprob.shape != (B, T):
        raise ValueError(f"tail_logprob shape {tuple(tail_logprob.shape)} != (B, T) = {(B, T)}")
    _check_mask(mask, (B, T))
    return _check_temperature(temperature)


def topk_reverse_kl(
    student_logits: torch.Tensor,
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    tail_logprob: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Reverse KL between student and teacher collapsed onto the teacher's top-k tokens + one tail bucket.

    With K the teacher's top-k set at a position, ``p_tail = 1 − Σ_{v∈K} p_v`` and ``q_tail`` likewise:

        KL_k(p‖q) = Σ_{v∈K} p_v (log p_v − log q_v) + p_tail (log p_tail − log q_tail)

    This is the exact reverse KL between the two (k+1)-outcome coarsenings; by the data-processing
    inequality ``KL_k ≤ KL(p‖q)`` with equality when K covers the vocabulary (k = V) or when p and q agree
    in shape on the tail. It is the reverse-KL objective of on-policy distillation (GKD arXiv 2306.13649
    with β → 1; MiniLLM arXiv 2306.08543) where the teacher only ships top-k log-probs (bounded memory).
    Departure: the tail bucket (instead of renormalising over K) keeps the student from dumping mass on
    tokens the teacher ranks outside its top-k without paying for it.

    Shapes:
        student_logits: (B, T, V), differentiable.
        topk_logprobs (teacher log q_v, already temperature-scaled), topk_ids: (B, T, k); tail_logprob (B, T).
        mask: (B, T) bool; False positions return exactly 0 and give zero gradient.
        returns: (B, T) float32 (float64 for float64 student logits).
    Chunked over rows of B (``chunk_size`` rows at a time) for the (r, T, V) log-softmax.
    """
    if student_logits.dim() != 3:
        raise ValueError(f"student_logits must be (B, T, V), got shape {tuple(student_logits.shape)}")
    B, T, V = student_logits.shape
    t = _check_topk_args(topk_logprobs, topk_ids, tail_logprob, mask, temperature, B, T)
    cdt = _compute_dtype(student_logits.dtype)
    k = topk_ids.shape[-1]
    step = chunk_size or B
    out = []
    for s in range(0, B, step):
        lp = torch.log_softmax(student_logits[s : s + step].to(cdt) / t, dim=-1)  # (r, T, V)
        r = lp.shape[0]
        ids = topk_ids[s : s + step].to(lp.device).long()  # (r, T, k)
        lp_k = lp.gather(-1, ids)  # (r, T, k)
        lp_tail = _tail_logprob(lp.reshape(r * T, V), ids.reshape(r * T, k)).reshape(r, T)  # (r, T)
        lq_k = topk_logprobs[s : s + step].to(lp)
        lq_tail = tail_logprob[s : s + step].to(lp)
        zero = torch.zeros((), dtype=cdt, device=lp.device)
        # 0·log 0 = 0 for buckets without student mass (e.g. the tail when k = V: both logs are -inf).
        kl_k = (lp_k.exp() * torch.where(lp_k.exp() > 0, lp_k - lq_k, zero)).sum(-1)  # (r, T)
        p_tail = lp_tail.exp()
        kl_tail = p_tail * torch.where(p_tail > 0, lp_tail - lq_tail, zero)  # (r, T)
        out.append(kl_k + kl_tail)
    kl = torch.cat(out)  # (B, T)
    m = mask.to(kl.device)
    _raise_if_nonfinite(kl.detach(), "topk_reverse_kl", m)
    return torch.where(m, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


def _topk_kl_rows(
    a: torch.Tensor, lq_k: torch.Tensor, ids: torch.Tensor, lq_tail: torch.Tensor, temperature: float
) -> torch.Tensor:
    """KL_k of :func:`topk_reverse_kl` for each row of an (r, V) block of student logits ``a``, with the teacher's
    (r, k) top-k log-probs / ids and (r,) tail log-prob. Returns (r,) in fp32 (fp64 for fp64 logits)."""
    cdt = _compute_dtype(a.dtype)
    lp = torch.log_softmax(a.to(cdt) / temperature, dim=-1)  # (r, V)
    ids = ids.long()
    lp_k = lp.gather(-1, ids)  # (r, k)
    lp_tail = _tail_logprob(lp, ids)  # (r,)
    zero = torch.zeros((), dtype=cdt, device=lp.device)
    p_k, p_tail = lp_k.exp(), lp_tail.exp()
    kl_k = (p_k * torch.where(p_k > 0, lp_k - lq_k.to(cdt), zero)).sum(-1)
    return kl_k + p_tail * torch.where(p_tail > 0, lp_tail - lq_tail.to(cdt), zero)


def topk_reverse_kl_linear(
    student,
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    tail_logprob: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """:func:`topk_reverse_kl` with the student's logits given as a ``core.fused_logprobs.Projection`` (hidden
    (B, T, H) + LM head): computed chunk by chunk through the head, recomputed in backward, never (B, T, V).
    Same shapes, values and gradients (w.r.t. hidden, weight, bias) as the materialised function."""
    from lit_rl.core.fused_logprobs import linear_rowwise

    B, T = student.hidden.shape[:2]
    t = _check_topk_args(topk_logprobs, topk_ids, tail_logprob, mask, temperature, B, T)
    kl = linear_rowwise(
        lambda a, lq, ids, tail: _topk_kl_rows(a, lq, ids, tail, t),
        student,
        [topk_logprobs, topk_ids, tail_logprob],
        chunk_size,
    )
    m = mask.to(kl.device)
    _raise_if_nonfinite(kl.detach(), "topk_reverse_kl", m)
    return torch.where(m, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


def masked_cross_entropy(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood ``−log p(y_t)`` of given (e.g. teacher-generated) tokens.

    Rejection-sampled distillation (SFT on the teacher's rollouts that pass a reward check) minimises its
    aggregate; this is the forward KL to the *filtered teacher sample distribution*, up to a constant.

    Shapes: logprobs (B, T) student log-probs of the tokens; mask (B, T) bool; returns (B, T), 0 off-mask.
    """
    _check_mask(mask, logprobs.shape)
    return torch.where(mask, -logprobs, torch.zeros((), dtype=logprobs.dtype, device=logprobs.device))
