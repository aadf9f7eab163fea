"""Per-token log-probabilities and entropies from logits, chunked over rows.

A language model's logits are (B, T, V) with V in the tens or hundreds of thousands, usually in bf16.
The obvious ``torch.log_softmax(logits.float(), -1).gather(...)`` materialises an fp32 copy of the
whole (B, T, V) tensor, plus another one that autograd keeps for the backward pass: for B·T = 8192
tokens and V = 152k that is 5 GB each. Everything here instead walks the flattened B·T rows in
chunks, upcasting one chunk at a time, and the backward pass recomputes the softmax of each chunk
from the saved (original-dtype) logits instead of keeping fp32 activations. The only full-size
tensor ever created is the gradient w.r.t. the logits, in the logits' own dtype, which any
implementation has to produce.

Why temperature is an argument: inference engines (vLLM, ``transformers.generate``) sample from
softmax(logits / temperature) and report log-probs of that distribution. Importance ratios and KL
terms are only meaningful if the trainer evaluates the same distribution, so the trainer must pass
the rollout temperature here.

Shapes: B rows (completions), T tokens, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch.autograd.function import once_differentiable

__all__ = ["default_chunk_rows", "entropy_from_logits", "rowwise_chunked", "token_logprobs"]

# Chunk budget, in bytes of one fp32 (rows, V) chunk. On CPU a small chunk stays in cache and
# below glibc's mmap threshold regime where every fresh large allocation page-faults; measured with
# scripts/bench_logprobs.py, 16 MiB chunks are ~2x *faster* than the naive full-tensor version and
# 64 MiB ones are slower. On accelerators a larger chunk amortises kernel-launch overhead.
CPU_CHUNK_BYTES = 16 * 2**20
ACCELERATOR_CHUNK_BYTES = 256 * 2**20


def default_chunk_rows(vocab_size: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk such that one fp32 (rows, V) chunk is about CPU_CHUNK_BYTES (or
    ACCELERATOR_CHUNK_BYTES off the CPU); at least 1.

    Shapes: scalar V in, scalar row count out (rows of the flattened (B·T, V) logits).
    """
    budget = CPU_CHUNK_BYTES if torch.device(device).type == "cpu" else ACCELERATOR_CHUNK_BYTES
    return max(1, budget // (4 * max(1, int(vocab_size))))


# --------------------------------------------------------------------------------------------
# validation helpers (shared with kl.py)
# --------------------------------------------------------------------------------------------
def _check_logits(logits: torch.Tensor, name: str = "logits") -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 3:
        raise ValueError(f"{name} must be 3-D (B, T, V), got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.shape[-1] < 1:
        raise ValueError(f"{name} has an empty vocabulary dimension: shape {tuple(logits.shape)}")


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


def _check_chunk_size(chunk_size: int | None, vocab_size: int, device: torch.device) -> int:
    if chunk_size is None:
        return default_chunk_rows(vocab_size, device)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (rows per chunk) or None, got {chunk_size!r}")
    return chunk_size


def _check_mask(mask: torch.Tensor, shape: tuple[int, ...], name: str = "mask") -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a torch.bool tensor, got {got}")
    if mask.shape != shape:
        raise ValueError(f"{name} shape {tuple(mask.shape)} does not match expected shape {tuple(shape)}")


def _raise_if_nonfinite(values: torch.Tensor, what: str, mask: torch.Tensor | None = None) -> None:
    """A NaN/Inf here would silently poison a loss; fail loudly and say where."""
    bad = ~torch.isfinite(values)
    if mask is not None:
        bad &= mask
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(
            f"{what}: {int(bad.sum())} non-finite value(s), first at (b, t)={first} "
            f"(NaN/+inf logits, or a token with probability 0)"
        )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp32 for fp16/bf16/fp32 inputs (reductions over V in bf16 lose ~3 digits); fp64 stays fp64.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scaled(block: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """Upcast one (r, V) chunk and divide by the temperature, without touching the caller's tensor."""
    z = block.to(dtype)
    if temperature != 1.0:
        # In place only when .to() made a copy; otherwise z aliases the caller's logits.
        z = z.div_(temperature) if z.data_ptr() != block.data_ptr() else z / temperature
    return z


# --------------------------------------------------------------------------------------------
# row chunking
# --------------------------------------------------------------------------------------------
def _layout(*tensors: torch.Tensor) -> tuple[bool, list[torch.Tensor]]:
    """(B, T, V) tensors as (B·T, V) views when that needs no copy (the fast, flat path); otherwise
    (e.g. ``logits[:, :-1]`` of a (B, T+1, V) output) keep them 3-D and chunk within each row b."""
    try:
        return True, [t.view(-1, t.shape[-1]) for t in tensors]  # (B·T, V)
    except RuntimeError:
        return False, list(tensors)


def _blocks(B: int, T: int, rows: int, flat: bool) -> Iterator[tuple]:
    """Index tuples selecting consecutive (r, ...) row chunks of a flat (B·T, ...) or 3-D tensor."""
    if flat:
        for s in range(0, B * T, rows):
            yield (slice(s, s + rows),)
    else:
        for b in range(B):
            for s in range(0, T, rows):
                yield (b, slice(s, s + rows))


def _bt(x: torch.Tensor, flat: bool) -> torch.Tensor:
    """A (B, T) tensor in the layout chosen by _layout."""
    return x.reshape(-1) if flat else x  # (B·T,) or (B, T)


# --------------------------------------------------------------------------------------------
# token log-probs
# --------------------------------------------------------------------------------------------
class _TokenLogprobs(torch.autograd.Function):
    """Forward: per chunk log_softmax + gather. Backward: d/dz log p[y] = onehot(y) - softmax(z),
    recomputed per chunk from the saved original-dtype logits (no fp32 activations are kept)."""

    @staticmethod
    def forward(ctx, logits, token_ids, rows, temperature):
        B, T, _ = logits.shape
        cdt = _compute_dtype(logits.dtype)
        out = torch.empty((B, T), dtype=cdt, device=logits.device)
        flat, (lg,) = _layout(logits)
        ids, o = _bt(token_ids, flat), _bt(out, flat)
        for idx in _blocks(B, T, rows, flat):
            z = _scaled(lg[idx], cdt, temperature)  # (r, V)
            # log_softmax is one fused kernel and bitwise equal to the unchunked reference.
            o[idx] = torch.log_softmax(z, dim=-1).gather(-1, ids[idx].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, token_ids)
        ctx.rows, ctx.temperature = rows, temperature
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits, token_ids = ctx.saved_tensors
        B, T, _ = logits.shape
        cdt = _compute_dtype(logits.dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat, (lg, gr) = _layout(logits, grad)
        ids, g = _bt(token_ids, flat), _bt(grad_out, flat)
        for idx in _blocks(B, T, ctx.rows, flat):
            gb = g[idx].to(cdt).unsqueeze(-1)  # (r, 1)
            d = torch.softmax(_scaled(lg[idx], cdt, ctx.temperature), dim=-1)  # (r, V)
            d.mul_(-gb).scatter_add_(-1, ids[idx].unsqueeze(-1), gb)  # g·(onehot − softmax)
            if ctx.temperature != 1.0:
                d.div_(ctx.temperature)  # chain rule through z = logits / temperature
            gr[idx] = d  # casts back to the logits' dtype
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probability of each given token under softmax(logits / temperature).

    Equation: ``out[b, t] = z[b, t, y] - logsumexp_v z[b, t, v]`` with ``z = logits / temperature``
    and ``y = token_ids[b, t]``.

    Shapes:
        logits:    (B, T, V), any float dtype; already aligned with ``token_ids`` (the caller drops
                   the last position / shifts, so ``logits[:, t]`` predicts ``token_ids[:, t]``).
        token_ids: (B, T) integer, each in [0, V). Padding must carry a valid id (e.g. the pad
                   token, not -100); mask the result downstream.
        returns:   (B, T) float32 (float64 for float64 logits).

    Memory: rows of the flattened (B·T, V) logits are processed ``chunk_size`` at a time (default:
    :func:`default_chunk_rows`); only one fp32 chunk exists at a time in the forward pass, and the
    backward pass recomputes each chunk's softmax from the saved logits instead of storing fp32
    activations. Gradients equal those of the naive ``log_softmax(logits.float()/T).gather`` up to
    rounding. Double backward is not supported (raises).

    Temperature: engines sample from, and report log-probs of, the temperature-scaled distribution,
    so the trainer must use the rollout temperature for ratios against rollout log-probs.

    Raises ValueError on bad shapes, out-of-range ids, temperature <= 0, and on non-finite results
    (NaN/+inf logits, or a token whose logit is -inf).
    """
    _check_logits(logits)
    if (
        not isinstance(token_ids, torch.Tensor)
        or token_ids.dtype.is_floating_point
        or token_ids.dtype == torch.bool
    ):
        got = token_ids.dtype if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
        raise TypeError(f"token_ids must be an integer tensor, got {got}")
    if token_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits.shape[:2]; "
            f"logits shape is {tuple(logits.shape)}"
        )
    V = logits.shape[-1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= V):
        raise ValueError(
            f"token_ids must lie in [0, {V}) (V from logits shape {tuple(logits.shape)}); "
            f"got min {int(token_ids.min())}, max {int(token_ids.max())}"
        )
    temperature = _check_temperature(temperature)
    rows = _check_chunk_size(chunk_size, V, logits.device)
    out = _TokenLogprobs.apply(logits, token_ids.long(), rows, temperature)
    _raise_if_nonfinite(out.detach(), "token_logprobs")
    return out


# --------------------------------------------------------------------------------------------
# entropy
# --------------------------------------------------------------------------------------------
def _safe_log_softmax(z: torch.Tensor) -> torch.Tensor:
    # -inf logits (masked vocabulary) have p = 0; clamping log p to the dtype's most negative
    # finite value makes p·log p = 0 instead of 0·(-inf) = NaN, in both passes.
    return torch.log_softmax(z, dim=-1).clamp_min_(torch.finfo(z.dtype).min)


class _Entropy(torch.autograd.Function):
    """Forward: H = -Σ p log p per chunk. Backward: dH/dz_v = -p_v (log p_v + H), recomputed."""

    @staticmethod
    def forward(ctx, logits, rows, temperature):
        B, T, _ = logits.shape
        cdt = _compute_dtype(logits.dtype)
        out = torch.empty((B, T), dtype=cdt, device=logits.device)
        flat, (lg,) = _layout(logits)
        o = _bt(out, flat)
        for idx in _blocks(B, T, rows, flat):
            logp = _safe_log_softmax(_scaled(lg[idx], cdt, temperature))  # (r, V)
            o[idx] = -(logp.exp().mul_(logp)).sum(-1)
        ctx.save_for_backward(logits, out)
        ctx.rows, ctx.temperature = rows, temperature
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits, ent = ctx.saved_tensors
        B, T, _ = logits.shape
        cdt = _compute_dtype(logits.dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat, (lg, gr) = _layout(logits, grad)
        h, g = _bt(ent, flat), _bt(grad_out, flat)
        for idx in _blocks(B, T, ctx.rows, flat):
            logp = _safe_log_softmax(_scaled(lg[idx], cdt, ctx.temperature))  # (r, V)
            d = logp.exp().mul_(logp.add_(h[idx].unsqueeze(-1)))  # p·(log p + H)
            d.mul_(-(g[idx].to(cdt) / ctx.temperature).unsqueeze(-1))
            gr[idx] = d
        return grad, None, None


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at every position.

    Equation: ``H = logsumexp(z) - Σ_v softmax(z)_v · z_v = -Σ_v p_v log p_v``, ``z = logits/temperature``
    (computed in the second form, with 0·log 0 = 0 so -inf logits for masked vocabulary are fine).

    Shapes:
        logits:  (B, T, V), any float dtype.
        returns: (B, T) float32 (float64 for float64 logits).

    Chunked and differentiable exactly like :func:`token_logprobs` (same memory behaviour; the
    backward recomputes ``dH/dz = -p (log p + H) / temperature`` per chunk). Raises ValueError for
    temperature <= 0 and for non-finite results (NaN or +inf logits).
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    rows = _check_chunk_size(chunk_size, logits.shape[-1], logits.device)
    out = _Entropy.apply(logits, rows, temperature)
    _raise_if_nonfinite(out.detach(), "entropy_from_logits")
    return out


# --------------------------------------------------------------------------------------------
# generic chunked row function with recompute-in-backward (used by kl.py)
# --------------------------------------------------------------------------------------------
class _RowwiseRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, rows, *logits):
        B, T, _ = logits[0].shape
        out = torch.empty((B, T), dtype=_compute_dtype(logits[0].dtype), device=logits[0].device)
        flat, views = _layout(*logits)
        o = _bt(out, flat)
        for idx in _blocks(B, T, rows, flat):
            o[idx] = fn(*(v[idx] for v in views))
        ctx.save_for_backward(*logits)
        ctx.fn, ctx.rows = fn, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits = ctx.saved_tensors
        need = ctx.needs_input_grad[2:]
        B, T, _ = logits[0].shape
        grads = [
            torch.empty(x.shape, dtype=x.dtype, device=x.device) if n else None for x, n in zip(logits, need)
        ]
        flat, views = _layout(*logits, *[x for x in grads if x is not None])
        views, it = views[: len(logits)], iter(views[len(logits) :])
        gviews = [next(it) if x is not None else None for x in grads]
        g = _bt(grad_out, flat)
        for idx in _blocks(B, T, ctx.rows, flat):
            blocks = [v[idx].detach().requires_grad_(n) for v, n in zip(views, need)]  # (r, V) each
            with torch.enable_grad():
                val = ctx.fn(*blocks)  # (r,)
            gb = g[idx]
            pieces = torch.autograd.grad(val, [b for b, n in zip(blocks, need) if n], gb.to(val.dtype))
            # A row with zero upstream gradient (masked position) contributes exactly zero, even
            # if its logits are garbage that would make 0·NaN.
            zero_rows = (gb == 0).unsqueeze(-1)  # (r, 1)
            it = iter(pieces)
            for gv, n in zip(gviews, need):
                if n:
                    gv[idx] = next(it).masked_fill_(zero_rows, 0)
        return (None, None, *grads)


def rowwise_chunked(
    fn: Callable[..., torch.Tensor], *logits: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """Apply a per-row reduction over the vocabulary chunk by chunk, differentiably, with the
    backward pass recomputing each chunk (activation checkpointing per chunk).

    ``fn(*blocks)`` receives one (r, V) block of each input in its *own* dtype (it should upcast
    itself, e.g. to :func:`torch.float32`) and returns (r,) values. Gradients are exactly those of
    applying ``fn`` to the whole tensors, while peak memory is one chunk's intermediates plus the
    (original-dtype) gradients. Inputs not requiring grad get none computed.

    Shapes:
        logits:  one or more (B, T, V) tensors of identical shape.
        returns: (B, T) float32 (float64 for float64 inputs).
    """
    if not logits:
        raise ValueError("rowwise_chunked needs at least one (B, T, V) tensor")
    for i, x in enumerate(logits):
        _check_logits(x, f"logits[{i}]")
        if x.shape != logits[0].shape:
            raise ValueError(
                f"logits[{i}] shape {tuple(x.shape)} != logits[0] shape {tuple(logits[0].shape)}"
            )
    rows = _check_chunk_size(chunk_size, logits[0].shape[-1], logits[0].device)
    return _RowwiseRecompute.apply(fn, rows, *logits)
