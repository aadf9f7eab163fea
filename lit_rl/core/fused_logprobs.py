"""Log-probs, entropy and full-vocabulary divergences straight from hidden states, chunked through the
output projection, so the (B, T, V) logits never exist — neither in the forward pass nor in the backward.

A causal LM's logits are ``z = h Wᵀ + b`` (the LM head applied to the last-layer hidden states h). With a
150k-token vocabulary, 8 rows × 1024 completion tokens of logits are 2.5 GB in bf16, and autograd keeps them
plus a same-sized gradient. Here the flattened B·T rows are processed ``rows`` at a time:

* forward: for each chunk compute its logits (r, V), reduce them to what is asked for (the token's log-prob,
  the entropy, a KL against a teacher), and drop them; only the (r,) results and the chunk's log-partition
  function survive.
* backward: recompute each chunk's logits from the saved hidden states and weight, form the gradient w.r.t.
  those logits, and push it through the projection: ``grad_h[chunk] = G W``, ``grad_W += Gᵀ h``,
  ``grad_b += Σ_rows G``. One extra (r, V) matmul per chunk is the price of never storing the logits.

What is saved for backward is only the inputs themselves (h (B, T, H), W (V, H), b) and (B, T) statistics. The
weight is the module's own parameter, so a weight tied to the input embedding receives this gradient *in
addition* to the embedding's (autograd accumulates both into the one parameter).

Precision: the projection runs in the weight's dtype (bf16 weights give bf16 logits, as the model's own
``lm_head`` does), the reductions in fp32 (fp64 for fp64 inputs), exactly like ``core.logprobs`` on full logits.
For low-precision weights, the weight gradient is accumulated over chunks in fp32 and cast once at the end.

Shapes: B rows, T positions, H hidden size, V vocabulary, r rows per chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lit_rl.core.logprobs import _check_mask, _check_temperature, _compute_dtype, _raise_if_nonfinite

__all__ = [
    "LINEAR_CHUNK_BYTES",
    "Projection",
    "linear_chunk_rows",
    "linear_divergence",
    "linear_logprobs",
    "linear_rowwise",
]

# Bytes of one fp32 (rows, V) logits chunk. Larger than core.logprobs' CPU budget on purpose: each chunk
# reads the whole (V, H) weight once, so small chunks make the matmul memory-bound on the weight.
LINEAR_CHUNK_BYTES = 128 * 2**20


def linear_chunk_rows(vocab_size: int, chunk_size: int | None = None) -> int:
    """Rows per chunk: ``chunk_size`` if given (validated), else one fp32 (rows, V) chunk ≈ LINEAR_CHUNK_BYTES."""
    if chunk_size is None:
        return max(1, LINEAR_CHUNK_BYTES // (4 * max(1, int(vocab_size))))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (rows per chunk) or None, got {chunk_size!r}")
    return chunk_size


@dataclass
class Projection:
    """Logits given as ``hidden @ weight.T + bias`` instead of a tensor.

    hidden: (B, T, H); weight: (V, H); bias: (V,) or None. ``logits()`` materialises (B, T, V) (only for
    consumers that still need the full tensor, and for tests); ``rows(i)`` gives the logits of flattened rows
    ``i`` (a slice of the B·T rows) on ``device`` (the hidden chunk moves to the weight's device first, so a
    teacher kept on another device projects where its weight lives).
    """

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __post_init__(self):
        if self.hidden.dim() != 3:
            raise ValueError(f"Projection.hidden must be (B, T, H), got shape {tuple(self.hidden.shape)}")
        if self.weight.dim() != 2 or self.weight.shape[1] != self.hidden.shape[-1]:
            raise ValueError(
                f"Projection.weight must be (V, H={self.hidden.shape[-1]}), got {tuple(self.weight.shape)}"
            )
        if self.bias is not None and self.bias.shape != self.weight.shape[:1]:
            raise ValueError(
                f"Projection.bias must be (V,) = {tuple(self.weight.shape[:1])}, got {tuple(self.bias.shape)}"
            )

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def logits(self) -> torch.Tensor:
        """The full (B, T, V) logits (differentiable; materialises them — avoid on the training path)."""
        h = self.hidden.to(self.weight.device)
        return F.linear(h.to(self.weight.dtype), self.weight, self.bias).to(self.hidden.device)

    def rows(self, idx: slice, device: torch.device) -> torch.Tensor:
        """(r, V) logits of flattened rows ``idx``, no gradient, on ``device``."""
        h = self.hidden.reshape(-1, self.hidden.shape[-1])[idx].to(self.weight.device, self.weight.dtype)
        return F.linear(h, self.weight, self.bias).to(device)


def _flat(h: torch.Tensor) -> torch.Tensor:
    return h.reshape(-1, h.shape[-1])  # (B·T, H); a copy only when h is a non-contiguous slice (small)


def _backprop_chunk(gz, h, weight, grads, idx) -> None:
    """Push the (r, V) gradient w.r.t. one chunk's logits through z = h Wᵀ + b (accumulating into ``grads``)."""
    gz = gz.to(weight.dtype)
    if grads["h"] is not None:
        torch.mm(gz, weight, out=grads["h"][idx])  # (r, H), straight into its rows (no temporary)
    if grads["w"] is not None:
        if grads["w"].dtype == weight.dtype:
            grads["w"].addmm_(gz.t(), h)  # (V, H), no temporary
        else:  # bf16/fp16: the chunk's product in the weight's dtype (as autograd's linear backward), fp32 sum
            grads["w"].add_(gz.t() @ h)
    if grads["b"] is not None:
        grads["b"].add_(gz.sum(0))


def _new_grads(ctx, h, weight, bias) -> dict:
    acc = torch.float64 if weight.dtype == torch.float64 else torch.float32  # fp32 sum over chunks for bf16
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = bias is not None and ctx.needs_input_grad[2]
    return {
        "h": torch.empty((h.shape[0] * h.shape[1], h.shape[2]), dtype=h.dtype, device=h.device)
        if need_h
        else None,  # (B·T, H)
        "w": torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None,
        "b": torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None,
    }


def _finish(grads, h_shape, weight, bias, zero=False):
    if zero and grads["h"] is not None:  # no output gradient at all: grad_h was allocated empty
        grads["h"].zero_()
    gh = grads["h"].reshape(h_shape) if grads["h"] is not None else None
    gw = grads["w"].to(weight.dtype) if grads["w"] is not None else None
    gb = grads["b"].to(bias.dtype) if grads["b"] is not None else None
    return gh, gw, gb


# --------------------------------------------------------------------------------------------
# token log-probs + entropy in one pass
# --------------------------------------------------------------------------------------------
def _chunk_logits(h, weight, bias, cdt, buf):
    """(r, V) logits ``h Wᵀ + b`` of one chunk in ``cdt``. When the weight already is ``cdt`` (fp32/fp64) the
    product lands in the reused ``buf`` (no fresh pages to fault in per chunk); bf16/fp16 weights project in
    their own dtype (as the model's ``lm_head`` does) and are upcast into a new tensor."""
    if weight.dtype != cdt:
        return F.linear(h, weight, bias).to(cdt)
    z = buf[: h.shape[0]]
    if bias is None:
        return torch.mm(h, weight.t(), out=z)
    return torch.addmm(bias, h, weight.t(), out=z)


class _LinearLogprobs(torch.autograd.Function):
    """Outputs (log p(y), H) per row. Per chunk, with z = (h Wᵀ + b)/τ and log p = z − lse(z):
    d log p(y)/dz = onehot(y) − p,   dH/dz = −p (log p + H),   both divided by τ for the raw logits.

    On the CPU the V-wide passes cost mostly their ``exp`` (the rest is memory-bound and cheap), so each pass
    evaluates exp once per logit: the forward gets log p(y), lse and H from one exp(z − max); the backward
    reuses the forward's per-row lse (N,) for p = exp(z − lse). Each chunk's (r, V) logits land by one matmul
    in a buffer reused across chunks (no fresh pages per chunk), and are turned into their gradient in place.
    Without an entropy gradient (the entropy only a metric: autograd then hands None) the backward skips the
    entropy's terms."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, token_ids, rows, temperature, with_entropy):
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        hf, ids = _flat(hidden), token_ids.reshape(-1)
        N, V = hf.shape[0], weight.shape[0]
        cdt = _compute_dtype(weight.dtype)
        lp = torch.empty(N, dtype=cdt, device=hidden.device)
        ent = torch.zeros_like(lp)
        lse = torch.empty_like(lp)  # (N,) log Σ exp z per row
        # h Wᵀ is finite for finite inputs; only a −inf bias entry (masked vocabulary) needs 0·log 0 = 0 care
        clamp = bias is not None and not bool(torch.isfinite(bias).all())
        buf = torch.empty((min(rows, N), V), dtype=cdt, device=hidden.device)  # (r, V), reused per chunk
        eb = torch.empty_like(buf)  # (r, V) exp(z − max)
        for s in range(0, N, rows):
            j = slice(s, s + rows)
            zb = _chunk_logits(hf[j], weight, bias, cdt, buf)  # (r, V)
            if temperature != 1.0:
                zb.div_(temperature)
            # One exp per logit: y = z − max, e = exp(y), S = Σ e; lse = max + log S, log p(y) = y_y − log S,
            # H = −Σ p log p = log S − Σ e·y / S (Σ p = 1 pulled out of the sum; same terms as the log-softmax
            # form, and y keeps the shifted logits' precision for peaked distributions).
            m = zb.amax(-1, keepdim=True)  # (r, 1)
            y = zb.sub_(m)
            if clamp:  # masked vocabulary: y = −inf → e = 0; keep e·y = 0 instead of 0·(−inf)
                y.clamp_min_(torch.finfo(cdt).min)
            e = torch.exp(y, out=eb[: y.shape[0]])
            S = e.sum(-1)  # (r,)
            logS = S.log()
            torch.add(m.squeeze(-1), logS, out=lse[j])
            lp[j] = y.gather(-1, ids[j].unsqueeze(-1)).squeeze(-1).sub_(logS)
            if with_entropy:
                ent[j] = logS - e.mul_(y).sum(-1).div_(S)
        ctx.save_for_backward(hidden, weight, bias, ids, ent, lse)
        ctx.rows, ctx.temperature, ctx.clamp, ctx.with_entropy = rows, temperature, clamp, with_entropy
        B, T = token_ids.shape
        return lp.view(B, T), ent.view(B, T)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, ids, ent, lse = ctx.saved_tensors
        hf, cdt, t = _flat(hidden), _compute_dtype(weight.dtype), ctx.temperature
        N, V = hf.shape[0], weight.shape[0]
        grads = _new_grads(ctx, hidden, weight, bias)
        if g_lp is None and (g_ent is None or not ctx.with_entropy):
            return (*_finish(grads, hidden.shape, weight, bias, zero=True), None, None, None, None)
        # gz = g_lp (onehot − p) − g_H p (log p + H), all divided by τ (chain rule through z = logits / τ):
        # the 1/τ is folded into the per-row coefficients, so it costs no pass over the block.
        g_lp = torch.zeros(N, dtype=cdt, device=hf.device) if g_lp is None else g_lp.reshape(-1).to(cdt)
        c_lp = g_lp / t  # (N,)
        if g_ent is not None and ctx.with_entropy:
            g_ent = g_ent.reshape(-1).to(cdt)
            c_plogp, c_p = (
                -g_ent / t,
                -(g_ent * ent + g_lp) / t,
            )  # gz = c_plogp·p log p + c_p·p (+ onehot term)
        else:
            c_plogp, c_p = None, -c_lp
        buf = torch.empty((min(ctx.rows, N), V), dtype=cdt, device=hf.device)  # (r, V), reused per chunk
        pb = torch.empty_like(buf) if c_plogp is not None else None  # (r, V) p
        for s in range(0, N, ctx.rows):
            i = slice(s, s + ctx.rows)
            gz = _chunk_logits(
                hf[i], weight, bias, cdt, buf
            )  # (r, V) logits, turned into their gradient in place
            if t != 1.0:
                gz.div_(t)
            gz.sub_(lse[i].unsqueeze(-1))  # log p
            if c_plogp is None:
                gz.exp_().mul_(c_p[i].unsqueeze(-1))  # −g_lp p / τ: the one exp per logit
            else:
                if ctx.clamp:  # masked vocabulary: p log p = 0, not 0·(−inf)
                    gz.clamp_min_(torch.finfo(cdt).min)
                p = torch.exp(gz, out=pb[: gz.shape[0]])
                gz.mul_(p).mul_(c_plogp[i].unsqueeze(-1)).addcmul_(p, c_p[i].unsqueeze(-1))
            gz.scatter_add_(-1, ids[i].unsqueeze(-1), c_lp[i].unsqueeze(-1))
            _backprop_chunk(gz, hf[i], weight, grads, i)
        return (*_finish(grads, hidden.shape, weight, bias), None, None, None, None)


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy: bool = True,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each token and the entropy at each position under softmax((h Wᵀ + b) / τ).

    Equal (values and gradients w.r.t. hidden, weight, bias) to ``token_logprobs`` / ``entropy_from_logits``
    on ``F.linear(hidden, weight, bias)``, without materialising those logits. Differentiable through both
    outputs (the entropy bonus backpropagates through the second); one recompute of each chunk's logits in
    backward serves both.

    Shapes:
        hidden: (B, T, H) last-layer states whose logits predict ``token_ids`` (already aligned).
        weight: (V, H) output projection (e.g. ``lm_head.weight``, possibly tied); bias (V,) or None.
        token_ids: (B, T) integer in [0, V) (padding must carry a valid id; mask downstream).
        mask: optional (B, T) bool, the positions to compute: the projection (forward, and its recompute and
            gradients in backward) runs on those rows only, and the other positions return 0 with zero gradient.
            A padded (B, T) block is often mostly padding, and the projection to V is the costliest matmul of a
            small model (SmolLM2-135M: 2·H·V = 57M FLOPs per position, half its decoder's).
        returns: logprobs (B, T), entropy (B, T), float32 (float64 for float64 weights); with
            ``entropy=False`` the second output is zeros (saves two passes over each chunk).
    Raises ValueError for bad shapes, ids out of range, temperature <= 0, and non-finite log-probs.
    """
    if mask is not None:
        if mask.shape != hidden.shape[:2]:
            raise ValueError(
                f"mask shape {tuple(mask.shape)} must equal hidden.shape[:2] = {tuple(hidden.shape[:2])}"
            )
        B, T, H = hidden.shape
        keep = mask.reshape(-1).to(hidden.device).nonzero().squeeze(1)  # (N,) flat positions computed
        lp, ent = linear_logprobs(
            hidden.reshape(B * T, H).index_select(0, keep)[None],
            weight,
            token_ids.reshape(-1).to(keep.device).index_select(0, keep)[None],
            bias,
            temperature,
            chunk_size,
            entropy,
        )
        zeros = lp.new_zeros(B * T)
        return zeros.index_copy(0, keep, lp[0]).view(B, T), zeros.index_copy(0, keep, ent[0]).view(B, T)
    proj = Projection(hidden, weight, bias)  # validates shapes
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise TypeError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    if token_ids.shape != hidden.shape[:2]:
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal hidden.shape[:2] = "
            f"{tuple(hidden.shape[:2])}"
        )
    V = proj.vocab_size
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= V):
        raise ValueError(
            f"token_ids must lie in [0, {V}); got min {int(token_ids.min())}, max {int(token_ids.max())}"
        )
    t = _check_temperature(temperature)
    rows = linear_chunk_rows(V, chunk_size)
    lp, ent = _LinearLogprobs.apply(
        hidden, weight, bias, token_ids.long().to(hidden.device), rows, t, entropy
    )
    _raise_if_nonfinite(lp.detach(), "linear_logprobs")
    return lp, ent


# --------------------------------------------------------------------------------------------
# any per-row reduction over the vocabulary (divergences against a teacher)
# --------------------------------------------------------------------------------------------


def _source_rows(src, idx: slice, device) -> torch.Tensor:
    """Rows ``idx`` of a frozen second input: a Projection (logits computed on the fly) or a (B, T, ...) tensor."""
    if isinstance(src, Projection):
        return src.rows(idx, device)
    return src.reshape(-1, *src.shape[2:])[idx].to(device)


class _LinearRowwise(torch.autograd.Function):
    """``out[row] = fn(z[row], *others[row])`` with z = h Wᵀ + b chunked and recomputed in backward; the
    gradient w.r.t. each chunk's logits comes from autograd on ``fn`` alone (exactly fn's own gradient)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, fn, rows, others):
        hf = _flat(hidden)
        N = hf.shape[0]
        out = torch.empty(N, dtype=_compute_dtype(weight.dtype), device=hidden.device)
        for s in range(0, N, rows):
            i = slice(s, s + rows)
            out[i] = fn(F.linear(hf[i], weight, bias), *(_source_rows(o, i, hidden.device) for o in others))
        ctx.save_for_backward(hidden, weight, bias)
        ctx.fn, ctx.rows, ctx.others = fn, rows, others  # others carry no gradient (frozen teacher)
        return out.view(hidden.shape[:2])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        hidden, weight, bias = ctx.saved_tensors
        hf, g = _flat(hidden), grad_out.reshape(-1)
        grads = _new_grads(ctx, hidden, weight, bias)
        for s in range(0, hf.shape[0], ctx.rows):
            i = slice(s, s + ctx.rows)
            gb = g[i]
            if not bool((gb != 0).any()):  # fully masked chunk: zero gradient, skip the recompute
                if grads["h"] is not None:
                    grads["h"][i] = 0
                continue
            z = F.linear(hf[i], weight, bias).detach().requires_grad_(True)  # (r, V)
            others = [_source_rows(o, i, hidden.device) for o in ctx.others]
            with torch.enable_grad():
                val = ctx.fn(z, *others)  # (r,)
            (gz,) = torch.autograd.grad(val, [z], gb.to(val.dtype))
            gz = gz.masked_fill_((gb == 0).unsqueeze(-1), 0)  # masked rows: exactly 0 even for garbage logits
            _backprop_chunk(gz, hf[i], weight, grads, i)
        return (*_finish(grads, hidden.shape, weight, bias), None, None, None)


def linear_rowwise(
    fn: Callable[..., torch.Tensor], student: Projection, others: Sequence = (), chunk_size: int | None = None
) -> torch.Tensor:
    """Apply ``fn(student_logits_rows, *other_rows) -> (r,)`` chunk by chunk over the flattened rows, where the
    student logits are ``student``'s projection (differentiable w.r.t. its hidden, weight and bias, recomputed
    in backward) and each of ``others`` is a frozen Projection (e.g. a teacher's hidden + head: its logits are
    computed chunk-wise too) or a (B, T, ...) tensor (e.g. teacher logits or its top-k ids), sliced per chunk.

    ``fn`` receives the student's raw logits in the weight's dtype (it upcasts and applies the temperature
    itself, as the ``core.kl`` row functions do). Returns (B, T) float32 (float64 for float64 weights).
    """
    B, T = student.hidden.shape[:2]
    for k, o in enumerate(others):
        shape = o.hidden.shape[:2] if isinstance(o, Projection) else o.shape[:2]
        if tuple(shape) != (B, T):
            raise ValueError(f"others[{k}] covers {tuple(shape)} positions, the student (B, T) = {(B, T)}")
        if isinstance(o, Projection) and o.vocab_size != student.vocab_size:
            raise ValueError(
                f"others[{k}] has {o.vocab_size} logits per position, the student {student.vocab_size}: "
                "full-vocabulary divergences need identical vocabularies"
            )
    others = tuple(
        Projection(o.hidden.detach(), o.weight.detach(), None if o.bias is None else o.bias.detach())
        if isinstance(o, Projection)
        else o.detach()
        for o in others
    )
    rows = linear_chunk_rows(student.vocab_size, chunk_size)
    return _LinearRowwise.apply(student.hidden, student.weight, student.bias, fn, rows, others)


def linear_divergence(
    kind: str,
    student: Projection,
    teacher,
    mask: torch.Tensor,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Full-vocabulary divergence per position between the student's projected logits and a teacher (a frozen
    Projection or (B, T, V) logits), same values and gradients as ``core.kl`` on materialised logits.

    kind: ``reverse`` KL(p‖q), ``forward`` KL(q‖p) (``core.kl.kl_from_logits``), ``jsd`` generalised JSD_β
    (``core.kl.generalized_jsd``, β weights the teacher). mask: (B, T) bool, False positions are exactly 0 with
    zero gradient. Returns (B, T).
    """
    from lit_rl.core.kl import _jsd_rows, _kl_rows  # the very row functions of the materialised path

    B, T = student.hidden.shape[:2]
    _check_mask(mask, (B, T))
    t = _check_temperature(temperature)
    if kind == "reverse":
        fn = lambda a, b: _kl_rows(a, b, t)  # noqa: E731
    elif kind == "forward":
        fn = lambda a, b: _kl_rows(b, a, t)  # noqa: E731
    elif kind == "jsd":
        if not 0.0 < float(beta) < 1.0:
            raise ValueError(f"beta must lie strictly in (0, 1), got {beta!r}")
        fn = lambda a, b: _jsd_rows(a, b, float(beta), t)  # noqa: E731
    else:
        raise ValueError(f"kind={kind!r}; valid values: reverse, forward, jsd")
    d = linear_rowwise(fn, student, [teacher], chunk_size)
    m = mask.to(d.device)
    _raise_if_nonfinite(d.detach(), f"linear_divergence({kind})", m)
    return torch.where(m, d, torch.zeros((), dtype=d.dtype, device=d.device))
