"""Hand-computed and equivalence tests for lit_rl.core.logprobs (all float64 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.logprobs import default_chunk_rows, entropy_from_logits, token_logprobs

F64 = torch.float64
RTOL = 1e-12  # float64 hand values are exact to rounding


def _close(actual, expected, rtol=RTOL, atol=1e-14):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol)


# p = (1/6, 1/3, 1/2) from logits (ln 1, ln 2, ln 3); a uniform V=4 row; a V=4 row with one -inf.
P3 = [1 / 6, 1 / 3, 1 / 2]
LOGITS3 = [math.log(1), math.log(2), math.log(3)]


def _reference_logprobs(logits, ids, temperature=1.0):
    return torch.log_softmax(logits / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _reference_entropy(logits, temperature=1.0):
    lp = torch.log_softmax(logits / temperature, -1)
    return -(lp.exp() * lp).sum(-1)


# ---------------------------------------------------------------------------------------------
# hand values
# ---------------------------------------------------------------------------------------------
def test_token_logprobs_hand_values():
    logits = torch.tensor([[LOGITS3, [0.0, 1.0, 2.0]]], dtype=F64)  # (1, 2, 3)
    ids = torch.tensor([[1, 2]])
    out = token_logprobs(logits, ids)
    assert out.shape == (1, 2) and out.dtype == F64
    _close(out, [[math.log(1 / 3), 2.0 - math.log(1 + math.e + math.e**2)]])


def test_token_logprobs_gradient_hand_values():
    # d log p_y / d z = onehot(y) - p
    logits = torch.tensor([[LOGITS3]], dtype=F64, requires_grad=True)
    token_logprobs(logits, torch.tensor([[1]])).sum().backward()
    _close(logits.grad, [[[-1 / 6, 1 - 1 / 3, -1 / 2]]])


def test_token_logprobs_temperature_hand_values():
    # z = ln(k) / 2  ->  p_k ∝ sqrt(k)
    logits = torch.tensor([[LOGITS3]], dtype=F64, requires_grad=True)
    s = 1 + math.sqrt(2) + math.sqrt(3)
    p = [1 / s, math.sqrt(2) / s, math.sqrt(3) / s]
    out = token_logprobs(logits, torch.tensor([[2]]), temperature=2.0)
    _close(out, [[math.log(p[2])]])
    out.sum().backward()
    _close(logits.grad, [[[-p[0] / 2, -p[1] / 2, (1 - p[2]) / 2]]])  # chain rule: 1/temperature


def test_entropy_hand_values():
    logits = torch.tensor(
        [[LOGITS3 + [-math.inf], [0.0] * 4, [0.0, 0.0, -math.inf, 0.0]]], dtype=F64
    )  # (1, 3, 4): the first row's 4th entry has p = 0
    out = entropy_from_logits(logits)
    h3 = -sum(p * math.log(p) for p in P3)
    _close(out, [[h3, math.log(4), math.log(3)]])


def test_entropy_gradient_hand_values():
    # dH/dz_v = -p_v (log p_v + H); zero for a uniform row
    logits = torch.tensor([[LOGITS3, [0.5, 0.5, 0.5]]], dtype=F64, requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    h3 = -sum(p * math.log(p) for p in P3)
    _close(logits.grad, [[[-p * (math.log(p) + h3) for p in P3], [0.0, 0.0, 0.0]]])


def test_entropy_temperature_hand_values():
    logits = torch.tensor([[LOGITS3]], dtype=F64, requires_grad=True)
    s = 1 + math.sqrt(2) + math.sqrt(3)
    p = [1 / s, math.sqrt(2) / s, math.sqrt(3) / s]
    h = -sum(x * math.log(x) for x in p)
    out = entropy_from_logits(logits, temperature=2.0)
    _close(out, [[h]])
    out.sum().backward()
    _close(logits.grad, [[[-x * (math.log(x) + h) / 2 for x in p]]])


def test_vectorised_vs_plain_python_loop():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=g, dtype=F64)
    ids = torch.randint(0, 5, (2, 3), generator=g)
    lp, ent = token_logprobs(logits, ids, chunk_size=2), entropy_from_logits(logits, chunk_size=4)
    for b in range(2):
        for t in range(3):
            row = logits[b, t].tolist()
            lse = math.log(sum(math.exp(z) for z in row))
            assert lp[b, t].item() == pytest.approx(row[ids[b, t]] - lse, rel=1e-12)
            h = -sum(math.exp(z - lse) * (z - lse) for z in row)
            assert ent[b, t].item() == pytest.approx(h, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# chunking: values and gradients identical to the unchunked reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [1, 2, 4, 6, 7, 1000, None])  # B·T = 6 rows
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_unchunked_with_gradients(chunk_size, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g, dtype=F64).requires_grad_(True)
    ids = torch.randint(0, 11, (2, 3), generator=g)
    w = torch.randn(2, 3, generator=g, dtype=F64)  # non-uniform upstream gradient

    out = token_logprobs(logits, ids, chunk_size=chunk_size, temperature=temperature)
    ref = _reference_logprobs(logits, ids, temperature)
    _close(out, ref.detach())
    (ga,) = torch.autograd.grad((out * w).sum(), logits)
    (gb,) = torch.autograd.grad((ref * w).sum(), logits)
    _close(ga, gb)

    ent = entropy_from_logits(logits, chunk_size=chunk_size, temperature=temperature)
    eref = _reference_entropy(logits, temperature)
    _close(ent, eref.detach())
    (ga,) = torch.autograd.grad((ent * w).sum(), logits)
    (gb,) = torch.autograd.grad((eref * w).sum(), logits)
    _close(ga, gb)


def test_non_contiguous_logits_slice():
    # the usual caller passes logits[:, :-1] of a (B, T+1, V) output: not viewable as (B·T, V)
    g = torch.Generator().manual_seed(2)
    full = torch.randn(3, 5, 6, generator=g, dtype=F64).requires_grad_(True)
    ids = torch.randint(0, 6, (3, 4), generator=g)
    logits = full[:, :-1]
    out = token_logprobs(logits, ids, chunk_size=3)
    ref = _reference_logprobs(logits, ids)
    _close(out, ref.detach())
    (ga,) = torch.autograd.grad(out.sum() + entropy_from_logits(logits, chunk_size=3).sum(), full)
    (gb,) = torch.autograd.grad(ref.sum() + _reference_entropy(logits).sum(), full)
    _close(ga, gb)


def test_padding_invariance():
    # appending (masked) positions changes nothing at the original positions
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 4, 7, generator=g, dtype=F64)
    ids = torch.randint(0, 7, (2, 4), generator=g)
    padded = torch.cat([logits, torch.randn(2, 3, 7, generator=g, dtype=F64)], dim=1)
    padded_ids = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    _close(token_logprobs(padded, padded_ids, chunk_size=3)[:, :4], token_logprobs(logits, ids, chunk_size=3))
    _close(entropy_from_logits(padded, chunk_size=3)[:, :4], entropy_from_logits(logits, chunk_size=3))


def test_bf16_logits_fp32_output_and_bf16_grad():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 50, generator=g).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 50, (2, 3), generator=g)
    out = token_logprobs(logits, ids, chunk_size=4)
    assert out.dtype == torch.float32
    ref = _reference_logprobs(logits.float(), ids)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    (gref,) = torch.autograd.grad(ref.sum(), logits)
    # both are fp32 gradients rounded once to bf16: at most one bf16 ulp apart
    diff = (logits.grad.float() - gref.float()).abs()
    assert bool((diff <= torch.finfo(torch.bfloat16).eps * gref.float().abs()).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, F64])
def test_temperature_with_each_dtype_leaves_input_untouched(dtype):
    # fp32/fp64 chunks alias the caller's logits, bf16 chunks are copies: both paths must scale
    # correctly and neither may modify the caller's tensor.
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3, 8, generator=g).to(dtype)
    before = logits.clone()
    ids = torch.randint(0, 8, (2, 3), generator=g)
    cdt = F64 if dtype == F64 else torch.float32
    out = token_logprobs(logits, ids, chunk_size=4, temperature=0.7)
    _close(out, _reference_logprobs(logits.to(cdt), ids, 0.7), rtol=1e-6, atol=1e-6)
    ent = entropy_from_logits(logits, chunk_size=4, temperature=0.7)
    _close(ent, _reference_entropy(logits.to(cdt), 0.7), rtol=1e-6, atol=1e-6)
    assert torch.equal(logits, before)


def test_backward_saves_no_fp32_vocab_copy():
    # what autograd keeps for backward: only the bf16 logits and the ids, never an fp32 (B, T, V)
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    logits = torch.randn(2, 3, 40).to(torch.bfloat16).requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=2)
        ent = entropy_from_logits(logits, chunk_size=2)
    assert (torch.bfloat16, 240) in saved
    assert not [s for s in saved if s[0] != torch.bfloat16 and s[1] >= 40]
    (out.sum() + ent.sum()).backward()
    assert logits.grad.shape == logits.shape


def test_default_chunk_rows():
    assert default_chunk_rows(32000, "cpu") == 16 * 2**20 // (4 * 32000)
    assert default_chunk_rows(10**9, "cpu") == 1
    assert default_chunk_rows(32000, "cuda") == 256 * 2**20 // (4 * 32000)


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def test_rejects_non_3d_logits():
    with pytest.raises(ValueError, match=r"3-D.*\(4, 5\)"):
        token_logprobs(torch.zeros(4, 5), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="3-D"):
        entropy_from_logits(torch.zeros(4, 5))


def test_rejects_token_shape_mismatch_naming_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3, 5\)"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("bad_id", [-1, 5, -100])
def test_rejects_out_of_range_ids(bad_id):
    ids = torch.zeros(2, 3, dtype=torch.long)
    ids[1, 2] = bad_id
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        token_logprobs(torch.zeros(2, 3, 5), ids)


def test_rejects_float_ids():
    with pytest.raises(TypeError, match="token_ids"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), temperature=temperature)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(1, 1, 3), temperature=temperature)


@pytest.mark.parametrize("chunk_size", [0, -2, 1.5])
def test_rejects_bad_chunk_size(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), chunk_size=chunk_size)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_rejects_non_finite_logits(bad):
    logits = torch.zeros(2, 2, 3, dtype=F64)
    logits[1, 0, 2] = bad
    with pytest.raises(ValueError, match=r"non-finite.*\(1, 0\)"):
        token_logprobs(logits, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"non-finite.*\(1, 0\)"):
        entropy_from_logits(logits)


def test_rejects_token_with_zero_probability():
    logits = torch.tensor([[[0.0, -math.inf, 0.0]]], dtype=F64)
    with pytest.raises(ValueError, match="non-finite"):
        token_logprobs(logits, torch.tensor([[1]]))
    _close(token_logprobs(logits, torch.tensor([[2]])), [[-math.log(2)]])
