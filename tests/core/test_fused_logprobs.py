"""Chunked log-probs / entropy / divergences through the output projection (``core.fused_logprobs``) against the
materialised path (``F.linear`` then ``core.logprobs`` / ``core.kl`` / ``core.distill``): same values and the same
gradients w.r.t. hidden, weight and bias (float64, rtol 1e-9), bf16 within the rounding of the logits, and no
(N, V) tensor saved for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_rl.core.distill import teacher_topk, topk_reverse_kl, topk_reverse_kl_linear
from lit_rl.core.fused_logprobs import (
    LINEAR_CHUNK_BYTES,
    Projection,
    linear_chunk_rows,
    linear_divergence,
    linear_logprobs,
)
from lit_rl.core.kl import generalized_jsd, kl_from_logits
from lit_rl.core.logprobs import entropy_from_logits, token_logprobs

B, T, H, V = 3, 5, 8, 37


def _inputs(seed=0, dtype=torch.float64, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    W = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    b = torch.randn(V, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True) if bias else None
    ids = torch.randint(0, V, (B, T), generator=g)
    return h, W, b, ids


def _params(h, W, b):
    return [x for x in (h, W, b) if x is not None]


def _close(got, ref, rtol=1e-9):
    scale = ref.abs().max().clamp_min(1e-300)
    assert float((got - ref).abs().max() / scale) <= rtol, float((got - ref).abs().max() / scale)


@pytest.mark.parametrize("chunk", [1, 4, 7, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("which", ["both", "logprobs", "entropy"])
def test_logprobs_entropy_equal_materialised_float64(chunk, temperature, which):
    h, W, b, ids = _inputs()
    g = torch.Generator().manual_seed(1)
    g_lp, g_ent = (
        torch.randn(B, T, generator=g, dtype=torch.float64),
        torch.randn(B, T, generator=g, dtype=torch.float64),
    )

    def loss(lp, ent):
        return ((lp * g_lp).sum() if which != "entropy" else 0) + (
            (ent * g_ent).sum() if which != "logprobs" else 0
        )

    lp, ent = linear_logprobs(h, W, ids, b, temperature, chunk)
    got = torch.autograd.grad(loss(lp, ent), _params(h, W, b))
    z = F.linear(h, W, b)
    lp0, ent0 = token_logprobs(z, ids, None, temperature), entropy_from_logits(z, None, temperature)
    ref = torch.autograd.grad(loss(lp0, ent0), _params(h, W, b))
    _close(lp, lp0)
    _close(ent, ent0)
    for a, r in zip(got, ref):
        _close(a, r)


def test_hand_values_one_position():
    """h = [1, 0], W rows (0,0), (1,0), (0,1) → z = (0, 1, 0): log p(1) = 1 − log(2 + e), H by hand."""
    h = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    lp, ent = linear_logprobs(h, W, torch.tensor([[1]]))
    e = torch.e
    Z = 2 + e
    assert abs(float(lp) - (1 - torch.log(torch.tensor(Z, dtype=torch.float64)))) < 1e-15
    p = torch.tensor([1 / Z, e / Z, 1 / Z], dtype=torch.float64)
    assert abs(float(ent) - float(-(p * p.log()).sum())) < 1e-15


def test_tied_weight_accumulates_both_gradients():
    """The head's weight is the input embedding (tied): its gradient is the embedding's plus the head's."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(V, H).double()
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))

    def run(fused):
        emb.zero_grad()
        hid = torch.tanh(emb(ids))  # (B, T, H): the "decoder"
        if fused:
            lp, ent = linear_logprobs(hid, emb.weight, targets, None, 0.9, 4)
        else:
            z = F.linear(hid, emb.weight)
            lp, ent = token_logprobs(z, targets, None, 0.9), entropy_from_logits(z, None, 0.9)
        (lp.sum() + 0.3 * ent.sum()).backward()
        return emb.weight.grad.clone()

    got, ref = run(True), run(False)
    _close(got, ref)
    emb.zero_grad()
    torch.tanh(emb(ids)).sum().backward()  # the embedding path alone is not the whole gradient
    assert float((ref - emb.weight.grad).abs().max()) > 1e-3


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_bf16_within_logit_rounding_of_fp32_reference(temperature):
    """bf16 weights: the projection runs in bf16 (as the model's lm_head does), so each logit carries ≤ one bf16
    ulp of rounding; the log-prob and entropy then differ from the fp32 reference (same bf16-valued inputs, fp32
    math) by at most one bf16 ulp of the row's largest logit — the same bound today's path meets."""
    h, W, _b, ids = _inputs(dtype=torch.bfloat16, bias=False)
    lp, ent = linear_logprobs(h, W, ids, None, temperature, 4)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    z32 = F.linear(h.detach().float(), W.detach().float())
    ref_lp, ref_ent = token_logprobs(z32, ids, None, temperature), entropy_from_logits(z32, None, temperature)
    zmax = z32.abs().amax(-1) / temperature  # (B, T)
    ulp = 2.0 ** (torch.floor(torch.log2(zmax)) - 7)  # bf16 has 8 significand bits
    old = token_logprobs(F.linear(h.detach(), W.detach()), ids, None, temperature)
    assert bool(((old - ref_lp).abs() <= ulp).all())  # today's path meets the bound
    assert bool(((lp.detach() - ref_lp).abs() <= ulp).all())
    assert bool(((ent.detach() - ref_ent).abs() <= ulp).all())
    # gradients: as close to the fp32 reference as today's bf16 path is
    g = torch.randn(B, T)
    got = torch.autograd.grad((lp * g).sum(), [h, W])
    old = torch.autograd.grad((token_logprobs(F.linear(h, W), ids, None, temperature) * g).sum(), [h, W])
    h32, W32 = h.detach().float().requires_grad_(True), W.detach().float().requires_grad_(True)
    ref = torch.autograd.grad(
        (token_logprobs(F.linear(h32, W32), ids, None, temperature) * g).sum(), [h32, W32]
    )
    for a, o, r in zip(got, old, ref):
        assert a.dtype == torch.bfloat16
        err_new = float((a.float() - r).norm() / r.norm())
        err_old = float((o.float() - r).norm() / r.norm())
        assert err_new <= 2 * err_old + 1e-3, (err_new, err_old)


def test_backward_saves_no_vocabulary_sized_tensor():
    h, W, b, ids = _inputs()
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        lp, ent = linear_logprobs(h, W, ids, b, 1.0, 4)
    assert max(sizes) <= V * H  # the weight itself; never B·T·V
    assert B * T * V not in sizes
    (lp.sum() + ent.sum()).backward()


def test_entropy_off_gives_same_logprobs_and_gradient():
    h, W, b, ids = _inputs()
    lp, ent = linear_logprobs(h, W, ids, b, 0.7, 4, entropy=False)
    assert bool((ent == 0).all())
    got = torch.autograd.grad(lp.sum(), [h, W, b])
    lp0, _ = linear_logprobs(h, W, ids, b, 0.7, 4)
    _close(lp, lp0)
    for a, r in zip(got, torch.autograd.grad(lp0.sum(), [h, W, b])):
        _close(a, r)


def test_minus_inf_bias_entries_are_masked_vocabulary():
    """A −inf bias (a banned token) has p = 0: entropy and gradients stay finite and equal the materialised path."""
    h, W, b, ids = _inputs()
    bias = b.detach().clone()
    bias[3] = float("-inf")
    ids = torch.where(ids == 3, torch.zeros_like(ids), ids)
    lp, ent = linear_logprobs(h, W, ids, bias, 1.0, 4)
    got = torch.autograd.grad(lp.sum() + ent.sum(), [h, W])
    z = F.linear(h, W, bias)
    ref = torch.autograd.grad(token_logprobs(z, ids).sum() + entropy_from_logits(z).sum(), [h, W])
    _close(ent, entropy_from_logits(F.linear(h, W, bias)))
    for a, r in zip(got, ref):
        assert bool(torch.isfinite(a).all())
        _close(a, r)


def test_frozen_weight_gets_no_gradient_computed():
    h, W, b, ids = _inputs()
    W = W.detach()
    lp, _ = linear_logprobs(h, W, ids, b.detach(), 1.0, 4)
    (gh,) = torch.autograd.grad(lp.sum(), [h])
    (ref,) = torch.autograd.grad(token_logprobs(F.linear(h, W, b.detach()), ids).sum(), [h])
    _close(gh, ref)


@pytest.mark.parametrize("kind", ["reverse", "forward", "jsd"])
@pytest.mark.parametrize("teacher_as", ["projection", "logits"])
def test_divergences_equal_materialised_float64(kind, teacher_as):
    h, W, b, _ = _inputs()
    g = torch.Generator().manual_seed(2)
    ht = torch.randn(B, T, 6, generator=g, dtype=torch.float64)
    Wt = torch.randn(V, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    gout = torch.randn(B, T, generator=g, dtype=torch.float64)
    t_logits = F.linear(ht, Wt)
    teacher = Projection(ht, Wt) if teacher_as == "projection" else t_logits
    d = linear_divergence(kind, Projection(h, W, b), teacher, mask, 0.8, beta=0.3, chunk_size=4)
    got = torch.autograd.grad((d * gout).sum(), [h, W, b])
    z = F.linear(h, W, b)
    if kind == "jsd":
        d0 = generalized_jsd(z, t_logits, 0.3, mask, None, 0.8)
    else:
        d0 = kl_from_logits(z, t_logits, mask, kind, None, 0.8)
    ref = torch.autograd.grad((d0 * gout).sum(), [h, W, b])
    _close(d, d0)
    assert bool((d[~mask] == 0).all())
    for a, r in zip(got, ref):
        _close(a, r)


def test_masked_rows_get_exactly_zero_gradient():
    h, W, b, _ = _inputs()
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 0] = True
    d = linear_divergence(
        "reverse", Projection(h, W, b), torch.randn(B, T, V, dtype=torch.float64), mask, 1.0, chunk_size=2
    )
    (gh,) = torch.autograd.grad(d.sum(), [h])
    assert bool((gh[0, 1:] == 0).all()) and bool((gh[1:] == 0).all()) and float(gh[0, 0].abs().sum()) > 0


def test_topk_reverse_kl_linear_equals_materialised():
    h, W, b, _ = _inputs()
    t_logits = torch.randn(B, T, V, dtype=torch.float64)
    vals, ids, tail = teacher_topk(t_logits, 5, 0.9)
    mask = torch.rand(B, T) > 0.2
    gout = torch.randn(B, T, dtype=torch.float64)
    d = topk_reverse_kl_linear(Projection(h, W, b), vals, ids, tail, mask, 0.9, chunk_size=3)
    got = torch.autograd.grad((d * gout).sum(), [h, W, b])
    d0 = topk_reverse_kl(F.linear(h, W, b), vals, ids, tail, mask, 0.9)
    ref = torch.autograd.grad((d0 * gout).sum(), [h, W, b])
    _close(d, d0)
    for a, r in zip(got, ref):
        _close(a, r)


def test_errors_name_the_problem():
    h, W, b, ids = _inputs()
    with pytest.raises(ValueError, match=r"weight must be \(V, H=8\)"):
        linear_logprobs(h, W[:, :3], ids)
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 37\)"):
        linear_logprobs(h, W, ids + V)
    with pytest.raises(ValueError, match="token_ids shape"):
        linear_logprobs(h, W, ids[:, :2])
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        linear_logprobs(h, W, ids, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs(h, W, ids, temperature=0.0)
    with pytest.raises(ValueError, match="kind='sideways'"):
        linear_divergence(
            "sideways", Projection(h, W), torch.zeros(B, T, V), torch.ones(B, T, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="identical vocabularies"):
        linear_divergence(
            "reverse", Projection(h, W), Projection(h, W[:5]), torch.ones(B, T, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="non-finite"):
        bad = b.detach().clone()
        bad[ids[0, 0]] = float("nan")
        linear_logprobs(h, W, ids, bad)


def test_default_chunk_rows_fits_the_budget():
    assert linear_chunk_rows(151936) == LINEAR_CHUNK_BYTES // (4 * 151936) == 220
    assert linear_chunk_rows(10**12) == 1
    assert linear_chunk_rows(100, 7) == 7


def test_teacher_topk_from_projection_equals_materialised():
    h, W, b, _ = _inputs()
    got = teacher_topk(Projection(h.detach(), W.detach(), b.detach()), 4, 0.9)
    ref = teacher_topk(F.linear(h, W, b).detach(), 4, 0.9)
    assert torch.equal(got[1], ref[1])
    _close(got[0], ref[0])
    _close(got[2], ref[2])


@pytest.mark.parametrize("chunk", [2, None])
def test_masked_positions_only_float64(chunk):
    """``mask``: the masked positions equal the unmasked call's (values and gradients), the others are exactly 0
    and contribute no gradient: the same as the materialised path with the loss masked; an id out of range at a
    skipped position is never read."""
    h, W, b, ids = _inputs()
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    g = torch.Generator().manual_seed(2)
    g_lp, g_ent = (
        torch.randn(B, T, generator=g, dtype=torch.float64),
        torch.randn(B, T, generator=g, dtype=torch.float64),
    )
    lp, ent = linear_logprobs(h, W, ids.masked_fill(~mask, V + 5), b, 0.7, chunk, mask=mask)
    got = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), _params(h, W, b))
    z = F.linear(h, W, b)
    lp0, ent0 = token_logprobs(z, ids, None, 0.7), entropy_from_logits(z, None, 0.7)
    ref = torch.autograd.grad(((lp0 * g_lp + ent0 * g_ent) * mask).sum(), _params(h, W, b))
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    _close(lp[mask], lp0[mask])
    _close(ent[mask], ent0[mask])
    for a, r in zip(got, ref):
        _close(a, r)
    assert float(got[0][~mask].abs().max()) == 0.0  # no gradient reaches a skipped position's hidden state
    with pytest.raises(ValueError, match="mask shape"):
        linear_logprobs(h, W, ids, b, mask=mask[:, :3])
