"""The sampler's distribution — what "the policy" is when sampling is truncated or penalised — as the trainer
computes it, exactly and chunk by chunk.

Every engine samples from *processed* scores and reports the sampled token's log-probability under them (μ).
The processing, in vLLM's order (``LogitProcessing.apply``):

1. repetition penalty on the raw logits z: a token already in the prompt or the completion so far has its logit
   divided by ρ when positive, multiplied by ρ when negative (Keskar et al. 2019, arXiv 1909.05858);
2. temperature: ``/ T`` (greedy: T = 1 and steps 3-5 skipped);
3. min-p: tokens with probability < ``min_p`` × the top token's probability are removed;
4. top-k: tokens below the k-th largest score are removed (ties kept);
5. top-p: sorted ascending by a *stable* sort, tokens whose cumulative probability is <= 1 − ``top_p`` are removed
   (the top token always stays).

**Ties at the boundary** (docs/architecture.md "Truncated sampling"). Min-p and top-k compare a score with a
value, so they keep or remove a tied group whole. Top-p counts: it keeps the m most likely tokens, and m can end
inside a group of equal scores (common with bfloat16 logits: 8 bits of mantissa). vLLM's torch sampler
(``apply_top_k_top_p_pytorch``) then keeps the group's tokens that its ascending sort put last; with a stable sort
(ties in id order) those are the **highest token ids**, which is the rule here, for the engine (``HFEngine``
samples with ``apply``) and the trainer alike (``core.fused_sampler`` stores it as a threshold and a cut id). m
itself does not depend on the order (the tied scores are equal, so is the cumulative sum), so every engine keeps
the same count; which tied ids it keeps is its sort's business (the vLLM CPU build's sort is not stable, its GPU
Triton kernel keeps the lowest ids).

**Which distribution each quantity uses** (docs/architecture.md "Truncated sampling"). Write x = step 1-2's
scores of the trainer's own logits, K its kept set after steps 3-5 and π^s(a) = exp(x_a) / Σ_{v∈K} exp(x_v)
the *sampler's* distribution of the trainer's weights. The samples come from π^s (the engine runs the same
processing on the same weights), so the ratios that correct or reweight samples compare π^s with π^s:

* the PPO ratio π^s_θ / π^s_old and the mismatch correction π^s_old / μ are 1 at the on-policy point whatever
  the settings, and their gradient ∇ log π^s_θ(a) = ∇x_a − Σ_{v∈K} π^s(v) ∇x_v is the policy gradient of
  the policy that actually samples (K held fixed: a set boundary has no gradient);
* KL to the reference and the entropy are properties of the *model*, not of the sampler: they use the full
  softmax(z / T) on both sides, so they are 0 where the policy equals the reference whatever the sampling.

The sampled token always stays in K: a token the engine kept but the trainer's scores put just past a boundary
(float rounding, or a stale behaviour policy) then has a small, finite probability instead of log 0 = −inf, which
would make a ratio 0 and a log-ratio NaN; the MIS band drops such tokens anyway. A sampled token of a partially
kept tied group at the boundary takes the place of the group's lowest-id kept token (``keep_sampled``): the
engine kept it, so its K holds it and m tokens, and log π^s(a) is the engine's whichever tied ids its sort kept;
any other sampled token outside K is added to it (``K ∪ {a}``).

Cost: one more chunked pass through the LM head in forward and one in backward (the top-p rule sorts each
(r, V) chunk), only when a setting of steps 1, 3-5 is on; at the defaults π^s is softmax(z / T) and nothing
extra runs (``LogitProcessing.active``).

Shapes: B rows, T (completion) positions, V vocabulary, N selected positions, r rows per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rl.core.logprobs import _raise_if_nonfinite

__all__ = ["History", "LogitProcessing", "keep_sampled", "sampler_logprobs"]


@dataclass(frozen=True)
class LogitProcessing:
    """The sampler's processing settings (``rollout.sampling.SamplingConfig`` fields of the same names; validated
    there). temperature 0 = greedy (scores at T = 1 after the repetition penalty, nothing removed)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0

    @property
    def truncates(self) -> bool:
        """True when steps 3-5 remove tokens (min-p, top-k or top-p on, not greedy)."""
        return not self.greedy and (self.top_p < 1 or self.top_k > 0 or self.min_p > 0)

    @property
    def active(self) -> bool:
        """True when the sampler's log-probs are not plain ``log softmax(logits / T)``."""
        return self.repetition_penalty != 1 or self.truncates

    def scale(self, logits: Tensor, seen: Tensor | None) -> Tensor:
        """Steps 1-2: penalised, temperature-scaled scores (differentiable). logits (N, V); seen (N, V) bool."""
        x = logits
        if self.repetition_penalty != 1:
            if seen is None:
                raise ValueError("LogitProcessing: repetition_penalty needs the seen-token mask")
            x = torch.where(
                seen, torch.where(x > 0, x / self.repetition_penalty, x * self.repetition_penalty), x
            )
        return x if self.greedy else x / self.temperature

    def removed(self, x: Tensor) -> Tensor | None:
        """Steps 3-5 on scaled scores x (N, V): (N, V) bool of the removed tokens, or None (nothing removed)."""
        if self.greedy:
            return None
        x = x.detach()
        drop = None
        if self.min_p > 0:
            p = torch.softmax(x, -1)
            drop = p < self.min_p * p.amax(-1, keepdim=True)
            x = x.masked_fill(drop, -math.inf)
        if 0 < self.top_k < x.shape[-1]:
            kth = x.topk(self.top_k, dim=-1).values[..., -1:]
            d = x < kth
            drop = d if drop is None else drop | d
            x = x.masked_fill(d, -math.inf)
        if self.top_p < 1:
            # ascending and stable: a tied group at the boundary loses its lowest ids first (module doc)
            srt, idx = x.sort(dim=-1, stable=True)
            cum = torch.softmax(srt, -1).cumsum(-1)
            d = cum <= 1 - self.top_p
            d[..., -1] = False  # the most likely token always stays
            d = torch.zeros_like(d).scatter(-1, idx, d)
            drop = d if drop is None else drop | d
        return drop

    def apply(self, logits: Tensor, seen: Tensor | None) -> Tensor:
        """Steps 1-5: the scores an engine samples from, removed tokens at −inf. logits (N, V) -> (N, V)."""
        x = self.scale(logits, seen)
        drop = self.removed(x)
        return x if drop is None else x.masked_fill(drop, -math.inf)


@dataclass
class History:
    """The tokens a repetition penalty looks at: each row's real tokens with the completion index at which they
    appear (−1 for the prompt). At completion index t (the scores predicting token t) the penalty applies to
    exactly the tokens with ``time < t``: the prompt and the completion so far, as the engines count them (left
    padding is no token). Kept sparse — a row has P + C tokens, the vocabulary V ≫ that.

    Shapes: ids, time, first (B, L) int64, L = P + C; padding has ``time`` past every index; ``first`` is, for
    every entry, the time of its token's first real occurrence in the row (so all entries of one token agree).
    """

    ids: Tensor
    time: Tensor
    first: Tensor

    @classmethod
    def of(cls, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> History:
        B, L = input_ids.shape
        real = attention_mask.to(input_ids.device).bool()
        t = torch.arange(L, device=input_ids.device).expand(B, L) - prompt_len  # (B, L): prompt < 0
        time = torch.where(t < 0, -1, t).masked_fill(~real, L + 1)
        # first real occurrence per (row, token): a transient (B, V') table, V' = the largest id + 2 (padding → last)
        V = int(input_ids.max()) + 2 if input_ids.numel() else 2
        table = torch.full((B, V), L + 1, dtype=torch.long, device=input_ids.device)
        table.scatter_reduce_(1, input_ids.masked_fill(~real, V - 1), time, reduce="amin")
        return cls(input_ids, time, table.gather(1, input_ids))

    def seen(self, rows: Tensor, pos: Tensor, vocab_size: int) -> Tensor:
        """(r, V) bool: the penalised tokens of the positions (rows[i], pos[i]) — one scatter of their histories."""
        ids, valid = self.ids[rows], self.time[rows] < pos[:, None]  # (r, L)
        out = torch.zeros(len(rows), vocab_size + 1, dtype=torch.bool, device=ids.device)
        return out.scatter_(1, ids.masked_fill(~valid, vocab_size), True)[
            :, :vocab_size
        ]  # column V: not seen

    def sparse(self, rows: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """(ids (r, L), penalised (r, L) bool) of the positions (rows[i], pos[i]): every history entry with whether
        the penalty applies to its token there. All entries of one token carry the same flag, so a scatter of
        per-token values over ``ids`` writes one value per token whatever the duplicates."""
        return self.ids[rows], self.first[rows] < pos[:, None]


def keep_sampled(drop: Tensor, x: Tensor, ids: Tensor) -> Tensor:
    """``drop`` with each row's sampled token kept (module doc): in place of the lowest-id kept token of its tied
    group when it is one of a partially kept group at the boundary, else added.

    Shapes: drop (r, V) bool (``LogitProcessing.removed``), x (r, V) the scores it was computed from, ids (r,);
    returns a new (r, V) bool."""
    a = ids[:, None]
    out = drop.clone()
    was = out.gather(-1, a)  # (r, 1) the sampled token was removed
    if bool(was.any()):
        x = x.detach()
        tau = x.masked_fill(drop, math.inf).amin(-1, keepdim=True)  # (r, 1) the smallest kept score
        first = ((x == tau) & ~drop).to(torch.uint8).argmax(-1, keepdim=True)  # its lowest kept id
        swap = was & (x.gather(-1, a) == tau)  # removed from the boundary's tied group
        out.scatter_(-1, first, out.gather(-1, first) | swap)
    return out.scatter_(-1, a, False)


def _rows_logprob(z: Tensor, ids: Tensor, processing: LogitProcessing, seen: Tensor | None) -> Tensor:
    """log π^s(ids) per row from raw logits z (r, V), differentiable through z (kept set fixed, sampled token
    kept: ``keep_sampled``)."""
    x = processing.scale(z, seen)
    drop = processing.removed(x)
    if drop is not None:
        x = x.masked_fill(keep_sampled(drop, x, ids), -math.inf)
    return torch.log_softmax(x, -1).gather(-1, ids[:, None]).squeeze(-1)


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def sampler_logprobs(
    logits: Tensor,
    token_ids: Tensor,
    processing: LogitProcessing,
    mask: Tensor,
    history: History | None = None,
    chunk_rows: int = 256,
) -> Tensor:
    """log π^s(y_t) from materialised logits (the reference path and the fallback), 0 off ``mask``.

    Shapes: logits (B, T, V); token_ids, mask (B, T); history (``History.of``; needed only with a
    repetition penalty), T = the completion positions; returns (B, T) float32 (float64 for float64 logits).
    Raises ValueError for a non-finite log-prob (NaN / inf logits).
    """
    B, T, V = logits.shape
    keep = mask.reshape(-1).to(logits.device).nonzero().squeeze(1)  # (N,)
    rows, pos = keep // T, keep % T
    z = logits.reshape(B * T, V).index_select(0, keep)
    ids = token_ids.reshape(-1).to(logits.device).index_select(0, keep)
    cdt = _compute(logits.dtype)
    parts = []
    for s in range(0, z.shape[0], chunk_rows):
        i = slice(s, s + chunk_rows)
        seen = None if history is None else history.seen(rows[i], pos[i], V)  # (r, V)
        parts.append(_rows_logprob(z[i].to(cdt), ids[i], processing, seen))
    lp = torch.cat(parts) if parts else z.new_zeros(0, dtype=cdt)
    out = lp.new_zeros(B * T).index_copy(0, keep, lp).view(B, T)
    _raise_if_nonfinite(out.detach(), "sampler_logprobs")
    return out
