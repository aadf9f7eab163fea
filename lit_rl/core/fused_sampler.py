"""The model's log-probs, its entropy and the sampler's log-probs π^s (``core.processed``) in ONE chunked pass
through the LM head: each chunk's logits are computed once in forward and once in backward, as for
``core.fused_logprobs.linear_logprobs`` alone, and π^s costs only a few more V-wide elementwise passes.

Per chunk (raw logits z (r, V), temperature T > 0, shifted scores y = z/T − m with m = max z/T):

* full:    e = exp(y), S = Σ e;  log π(a) = y_a − log S;  H = log S − Σ e·y / S.
* sampler: x = the sampler's scores shifted by their own maximum: x = y without a repetition penalty (exp(x) = e
  already: π^s needs a compare and a masked sum, no new exp); with one, x = the penalised y − its row maximum s
  (one more exp: a penalised top logit can sit far below m, e.g. 45 / 0.2 / 2 = 112.5 under m = 225, where
  every exp(y) of the other tokens underflows in float32). The kept set K is one threshold τ and one cut id per
  row (``_kept_set``), the sampled token a placed in it by ``core.processed.keep_sampled``'s rule (``_kept``);
  log π^s(a) = x_a − log Σ_K exp(x).
* backward, w.r.t. z/T then divided by T: g_lp (onehot − π) − g_H π (log π + H) + g_s (onehot − π^s) ⊙ f, where
  f = d x / d(z/T) is 1/ρ or ρ on penalised tokens (by the sign of z, which z/T keeps) and 1 elsewhere, and
  π^s = π · S / S_K on K (0 off K) without a penalty, exp(x − log S_K) on K with one.

The forward keeps per row (N,) only max z/T, the penalised shift s, log S, H, τ, the cut id and log S_K (τ and the
masses in the shifted coordinates: the backward recomputes x with the same operations, bit for bit, and rebuilds
K from τ and the cut id with no second sort; an unshifted τ + max could round the boundary token out of K).
Greedy (temperature 0): T = 1 and nothing is removed, only the penalty applies.

Shapes: N selected positions, H hidden size, V vocabulary, r rows per chunk.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from lit_rl.core.fused_logprobs import _backprop_chunk, _chunk_logits, _finish, _new_grads, linear_chunk_rows
from lit_rl.core.logprobs import _raise_if_nonfinite
from lit_rl.core.processed import History, LogitProcessing

__all__ = ["linear_logprobs_and_sampler", "linear_sampler_logprobs"]

TOP_P_CANDIDATES = 256  # top-p reads this many largest scores first (``_kept_set``)


def _kept_set(x: Tensor, pr: LogitProcessing, ex: Tensor) -> tuple[Tensor, Tensor]:
    """The kept set of scores x (r, V) as (τ (r,), cut (r,) int64): K = {x > τ} ∪ {x = τ and id >= cut} (τ = −inf,
    cut 0: nothing removed); ``ex`` = exp(x) (x is shifted so that it does not overflow).

    Every rule keeps the top of the score order, so a threshold describes K up to the boundary's tied group, and
    the backward rebuilds K from two numbers per row instead of a second sort: min-p keeps x_v >= max x +
    log(min_p); top-k keeps x_v >= the k-th largest (both keep a tied group whole); top-p keeps the m most likely
    tokens, a token while the mass of the more likely kept ones is < p (vLLM's "ascending cumulative mass <= 1 − p
    is removed", read from the top). When m ends inside a group of scores equal to τ, the group keeps its highest
    ids (``core.processed``, "Ties at the boundary"): cut = the lowest id kept. top-p looks at the
    TOP_P_CANDIDATES (or top-k) largest scores and sorts a whole row only where they hold < p of the mass (a
    near-uniform row): a full sort of the vocabulary per position is the expensive part."""
    x = x.detach()
    tau = torch.full(x.shape[:1], -math.inf, dtype=x.dtype, device=x.device)
    cut = torch.zeros(x.shape[:1], dtype=torch.long, device=x.device)
    if pr.greedy:
        return tau, cut
    if pr.min_p > 0:
        tau = x.amax(-1) + math.log(pr.min_p)
    if 0 < pr.top_k < x.shape[-1]:
        tau = torch.maximum(tau, x.topk(pr.top_k, dim=-1).values[:, -1])
    if pr.top_p < 1:
        left = x >= tau[:, None]  # (r, V) what min-p / top-k kept
        log_mass = torch.log((ex * left).sum(-1, keepdim=True))  # (r, 1) of the set left so far
        k0 = min(x.shape[-1], pr.top_k if pr.top_k > 0 else TOP_P_CANDIDATES)
        vals = x.topk(k0, dim=-1).values  # (r, k0) descending
        short = (
            torch.exp(vals - log_mass).sum(-1) < pr.top_p
        )  # candidates hold too little: sort the whole row
        if bool(short.any()):
            vals = torch.cat([vals, vals.new_full((x.shape[0], x.shape[1] - k0), -math.inf)], -1)
            vals[short] = x[short].sort(-1, descending=True).values
        vals = torch.where(vals >= tau[:, None], vals, -math.inf)  # only what min-p / top-k kept
        mass = torch.exp(vals - log_mass).cumsum(-1)  # (r, k): mass of the i+1 most likely
        before = torch.cat([torch.zeros_like(mass[:, :1]), mass[:, :-1]], -1)  # mass strictly above token i
        # kept count: none past the set left, and the top token always stays (also in a NaN row: it raises later)
        m = torch.minimum((before < pr.top_p).sum(-1), left.sum(-1)).clamp(min=1)
        tau = vals.gather(-1, (m - 1)[:, None]).squeeze(-1)
        # m may end inside the group of scores equal to τ: where the next candidate ties with τ (or there is none)
        nxt = vals.gather(-1, m.clamp(max=vals.shape[1] - 1)[:, None]).squeeze(-1)
        rows = ((m >= vals.shape[1]) | (nxt == tau)).nonzero().squeeze(1)
        if rows.numel() == x.shape[0]:  # every row (bfloat16 logits: ties are the rule), no copy
            _cut_group(x, tau, m, cut, rows)
        elif rows.numel():
            _cut_group(x[rows], tau[rows], m[rows], cut, rows)
    return tau, cut


def _cut_group(x: Tensor, tau: Tensor, m: Tensor, cut: Tensor, rows: Tensor) -> None:
    """Where the m kept tokens of rows x (r', V) end inside their group of scores equal to τ (r'), write into
    ``cut`` at ``rows`` the lowest id of the group's kept part, its highest ids (a cumulative count of the
    group's ids)."""
    above, tied = (x > tau[:, None]).sum(-1), x == tau[:, None]
    n = tied.sum(-1)
    part = (m - above < n).nonzero().squeeze(1)
    if part.numel():
        seen = tied[part].cumsum(-1, dtype=torch.int32)  # (r'', V) the group's ids <= v
        rank = (n - (m - above) + 1)[part, None].to(torch.int32)  # (r'', 1) that of the lowest id kept
        cut[rows[part]] = torch.searchsorted(seen, rank).squeeze(1)


def _kept(x: Tensor, tau: Tensor, cut: Tensor, a: Tensor) -> Tensor:
    """(r, V) bool: the kept set (τ, cut) of ``_kept_set`` with the sampled tokens a (r, 1) in it, by
    ``core.processed.keep_sampled``'s rule (a token cut from the boundary's tied group replaces the group's
    lowest kept id, ``cut``; any other is added). The forward and the backward build K here, from the same bits."""
    keep = x >= tau[:, None]
    if bool((cut > 0).any()):  # a tied group at τ kept in part (cut 0 elsewhere: no id is below it)
        ids = torch.arange(x.shape[1], device=x.device)
        keep &= ~((x == tau[:, None]) & (ids < cut[:, None]))
        swap = ~keep.gather(-1, a) & (x.gather(-1, a) == tau[:, None])  # (r, 1): only where cut > 0
        c = cut[:, None]
        keep.scatter_(-1, c, keep.gather(-1, c) & ~swap)
    return keep.scatter_(-1, a, True)


def _shifted(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cdt: torch.dtype,
    buf: Tensor,
    t: float,
    m: Tensor | None,
    clamp: bool,
    out_max: Tensor | None = None,
) -> Tensor:
    """(r, V) y = z/T − max z/T of one chunk, in ``buf`` (``m`` given: subtract it, the forward's, so the backward
    recomputes the same bits; else the row max is taken and written to ``out_max``)."""
    y = _chunk_logits(h, weight, bias, cdt, buf)
    if t != 1.0:
        y.div_(t)
    if m is None:
        m = y.amax(-1, keepdim=True)
        if out_max is not None:
            out_max.copy_(m.squeeze(-1))
    y.sub_(m)
    if clamp:  # masked vocabulary (a −inf bias): e·y = 0, not 0·(−inf)
        y.clamp_min_(torch.finfo(cdt).min)
    return y


def _penalised(y: Tensor, m: Tensor, idx: Tensor, on: Tensor, rho: float) -> tuple[Tensor, Tensor, Tensor]:
    """The penalty in shifted coordinates (y = z/T − m: penalised z/T is (z/T)/ρ when positive, (z/T)·ρ else),
    applied sparsely at the history entries ``idx`` (r, L) where ``on``: (x (r, V), x at idx (r, L), d x / d(z/T) at
    idx (r, L)). Only a row's P + C history tokens change, so one copy and one scatter, no V-wide where()."""
    yv = y.gather(1, idx)
    s = yv + m  # z/T at the history entries; its sign is z's
    one = torch.ones((), dtype=y.dtype, device=y.device)
    factor = torch.where(on, torch.where(s > 0, one / rho, one * rho), one)
    xv = torch.where(on, s * factor - m, yv)
    return y.clone().scatter_(1, idx, xv), xv, factor


def _sampler_scores(
    y: Tensor, m: Tensor, hist: History, rows: Tensor, pos: Tensor, rho: float, shift: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x (r, V), history ids (r, L), d x / d(z/T) at them (r, L), shift (r,)): a chunk's penalised scores, from
    its shifted y (max z/T = m (r,)), shifted again by their own row maximum. The forward takes that maximum
    (``shift`` None), the backward passes the stored one, so that both compute the same bits."""
    idx, on = hist.sparse(rows, pos)
    x, _, factor = _penalised(y, m[:, None], idx, on, rho)
    if shift is None:
        shift = x.amax(-1)
    return x.sub_(shift[:, None]), idx, factor, shift


class _LinearLogprobsSampler(torch.autograd.Function):
    """(log π(y), H, log π^s(y)) per selected position; see the module doc for the formulas."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, rows_idx, pos, pr, hist, rows, with_entropy):
        ctx.set_materialize_grads(False)
        N, V = hidden.shape[0], weight.shape[0]
        cdt = torch.float64 if weight.dtype == torch.float64 else torch.float32
        t = pr.logprob_temperature
        lp, ent, lps, mx, sx, log_s, tau, log_sk = (
            torch.zeros(N, dtype=cdt, device=hidden.device) for _ in range(8)
        )
        cut = torch.zeros(N, dtype=torch.long, device=hidden.device)
        buf = torch.empty((min(rows, N), V), dtype=cdt, device=hidden.device)
        clamp = bias is not None and not bool(torch.isfinite(bias).all())
        for s in range(0, N, rows):
            j, a = slice(s, s + rows), ids[s : s + rows, None]
            y = _shifted(hidden[j], weight, bias, cdt, buf, t, None, clamp, mx[j])  # (r, V) z/T − max
            e = torch.exp(y)
            S = e.sum(-1)
            log_s[j] = S.log()
            lp[j] = y.gather(-1, a).squeeze(-1) - log_s[j]
            if with_entropy:
                ent[j] = log_s[j] - (e * y).sum(-1) / S
            x, ex = y, e
            if pr.repetition_penalty != 1:  # shifted by the penalised maximum (module doc), one more exp
                x, _, _, sx[j] = _sampler_scores(y, mx[j], hist, rows_idx[j], pos[j], pr.repetition_penalty)
                ex = torch.exp(x)
            # the kept set and its mass in the shifted coordinates: the backward recomputes x bit for bit, so the
            # boundary token compares the same way (an unshifted τ + m would round it out of K)
            if pr.truncates:
                tau[j], cut[j] = _kept_set(x, pr, ex)
                log_sk[j] = torch.log((ex * _kept(x, tau[j], cut[j], a)).sum(-1))
            else:  # a repetition penalty alone (or greedy): K is the whole vocabulary
                log_sk[j] = torch.log(ex.sum(-1))
            lps[j] = x.gather(-1, a).squeeze(-1) - log_sk[j]
        ctx.save_for_backward(hidden, weight, bias, ids, rows_idx, pos, mx, sx, log_s, ent, tau, cut, log_sk)
        ctx.pr, ctx.hist, ctx.rows, ctx.with_entropy, ctx.clamp = pr, hist, rows, with_entropy, clamp
        return lp, ent, lps

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lp, g_ent, g_s):
        hidden, weight, bias, ids, rows_idx, pos, mx, sx, log_s, ent, tau, cut, log_sk = ctx.saved_tensors
        pr, hist, N, V = ctx.pr, ctx.hist, hidden.shape[0], weight.shape[0]
        cdt, t = mx.dtype, pr.logprob_temperature
        grads = _new_grads(ctx, hidden[None], weight, bias)
        zero = torch.zeros(N, dtype=cdt, device=hidden.device)
        g_lp = zero if g_lp is None else g_lp.to(cdt)
        g_ent = zero if (g_ent is None or not ctx.with_entropy) else g_ent.to(cdt)
        g_s = zero if g_s is None else g_s.to(cdt)
        buf = torch.empty((min(ctx.rows, N), V), dtype=cdt, device=hidden.device)
        for s in range(0, N, ctx.rows):
            j, a = slice(s, s + ctx.rows), ids[s : s + ctx.rows, None]
            y = _shifted(hidden[j], weight, bias, cdt, buf, t, mx[j, None], ctx.clamp)  # as in forward
            logp = y - log_s[j, None]
            p = torch.exp(logp)
            # full: g_lp (onehot − p) − g_H p (log p + H), w.r.t. z/T
            gz = p * (-g_lp[j, None] - g_ent[j, None] * (logp + ent[j, None]))
            gz.scatter_add_(-1, a, g_lp[j, None])
            # π^s on K: π · S / S_K without a penalty (no exp), exp(x − log S_K) with one (π underflows where
            # π^s need not: the penalised shift can sit far below the model's)
            idx = None
            if pr.repetition_penalty != 1:
                x, idx, factor, _ = _sampler_scores(
                    y, mx[j], hist, rows_idx[j], pos[j], pr.repetition_penalty, sx[j]
                )
                keep = _kept(x, tau[j], cut[j], a) if pr.truncates else None
                ps = x.sub_(log_sk[j, None]).exp_()
            else:
                keep = _kept(y, tau[j], cut[j], a) if pr.truncates else None
                ps = p * torch.exp(log_s[j] - log_sk[j])[:, None]
            if keep is not None:
                ps.masked_fill_(~keep, 0.0)  # 0 off K
            gs = ps.mul_(-g_s[j, None]).scatter_add_(-1, a, g_s[j, None])  # g_s (onehot − π^s), w.r.t. x
            if (
                idx is not None
            ):  # d x / d(z/T): the penalty's factor at the history entries (one value per token)
                gs.scatter_(1, idx, gs.gather(1, idx) * factor)
            gz.add_(gs)
            if t != 1.0:
                gz.div_(t)
            _backprop_chunk(gz, hidden[j], weight, grads, j)
        gh, gw, gb = _finish(grads, hidden[None].shape, weight, bias)
        return (None if gh is None else gh[0]), gw, gb, None, None, None, None, None, None, None


def linear_logprobs_and_sampler(
    hidden: Tensor,
    weight: Tensor,
    token_ids: Tensor,
    processing: LogitProcessing,
    mask: Tensor,
    bias: Tensor | None = None,
    history: History | None = None,
    chunk_size: int | None = None,
    entropy: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """(log π(y_t), H(π)(t), log π^s(y_t)) from hidden states through the LM head in one chunked pass: the model's
    full softmax(z / T) log-probs and entropy (what ``core.fused_logprobs.linear_logprobs`` returns) and the
    sampler's (``core.processed``), all differentiable, without (B, T, V) logits. The projection runs on the
    ``mask`` positions only; the others are 0 with zero gradient.

    Shapes: hidden (B, T, H); weight (V, H); bias (V,) or None; token_ids, mask (B, T); history
    (``processed.History.of``; needed only with a repetition penalty); returns three (B, T) float32 (float64 for
    float64 weights). ``entropy=False``: the second output is zeros. Raises ValueError for a non-finite log-prob
    (NaN / inf logits), as ``linear_logprobs`` does.
    """
    if processing.repetition_penalty != 1 and history is None:
        raise ValueError(
            "linear_logprobs_and_sampler: repetition_penalty needs the token history (History.of)"
        )
    B, T, H = hidden.shape
    keep = mask.reshape(-1).to(hidden.device).nonzero().squeeze(1)  # (N,) flat positions computed
    rows, pos = keep // T, keep % T
    h = hidden.reshape(B * T, H).index_select(0, keep)  # (N, H)
    ids = token_ids.reshape(-1).to(hidden.device).long().index_select(0, keep)  # (N,)
    outs = _LinearLogprobsSampler.apply(
        h,
        weight,
        bias,
        ids,
        rows,
        pos,
        processing,
        history,
        linear_chunk_rows(weight.shape[0], chunk_size),
        entropy,
    )
    lp, ent, lps = (o.new_zeros(B * T).index_copy(0, keep, o).view(B, T) for o in outs)
    _raise_if_nonfinite(lp.detach(), "linear_logprobs_and_sampler (log π)")
    _raise_if_nonfinite(lps.detach(), "linear_logprobs_and_sampler (log π^s)")
    return lp, ent, lps


def linear_sampler_logprobs(
    hidden: Tensor,
    weight: Tensor,
    token_ids: Tensor,
    processing: LogitProcessing,
    mask: Tensor,
    bias: Tensor | None = None,
    history: History | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """log π^s(y_t) (B, T) alone (``linear_logprobs_and_sampler``'s third output)."""
    return linear_logprobs_and_sampler(
        hidden, weight, token_ids, processing, mask, bias, history, chunk_size, entropy=False
    )[2]
