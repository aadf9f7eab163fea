"""``core.processed``: the sampler's distribution π^s computed by the trainer, in float64 against a step-by-step
reference written independently of ``LogitProcessing`` (top-p as "keep a token while the mass of the more likely
ones is below p", ties highest id first, not the ascending cumulative sum), its chunked LM-head form against the
materialised one, and its gradient against the hand formula (onehot − π^s) / T on the kept set."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.fused_sampler import linear_sampler_logprobs
from lit_rl.core.processed import History, LogitProcessing, sampler_logprobs
from lit_rl.rollout.sampling import SamplingConfig

SETTINGS = {
    "top_k": LogitProcessing(temperature=0.8, top_k=3),
    "top_p": LogitProcessing(temperature=1.0, top_p=0.6),
    "min_p": LogitProcessing(temperature=1.2, min_p=0.15),
    "repetition_penalty": LogitProcessing(temperature=0.7, repetition_penalty=1.8),
    "greedy_penalty": LogitProcessing(temperature=0.0, repetition_penalty=1.5),
    "all": LogitProcessing(temperature=0.9, top_p=0.9, top_k=6, min_p=0.05, repetition_penalty=1.3),
}


def _reference(z: torch.Tensor, seen: set[int], tok: int, pr: LogitProcessing) -> float:
    """log π^s(tok) at one position (z (V,) float64), each step written out; the sampled token always kept."""
    x = z.clone()
    for t in seen:
        x[t] = x[t] / pr.repetition_penalty if x[t] > 0 else x[t] * pr.repetition_penalty
    if pr.temperature == 0:
        return float(torch.log_softmax(x, -1)[tok])
    x = x / pr.temperature
    keep = torch.ones_like(x, dtype=torch.bool)
    if pr.min_p > 0:
        p = torch.softmax(x, -1)
        keep &= p >= pr.min_p * p.max()
    if pr.top_k > 0:
        kth = sorted(x[keep].tolist(), reverse=True)[min(pr.top_k, int(keep.sum())) - 1]
        keep &= x >= kth
    if pr.top_p < 1:
        p = torch.softmax(torch.where(keep, x, -math.inf), -1).tolist()
        above = 0.0
        for t in sorted(range(len(p)), key=lambda t: (-p[t], -t)):
            if above >= pr.top_p:
                keep[t] = False
            above += p[t]
    keep[tok] = True
    return float(torch.log_softmax(torch.where(keep, x, -math.inf), -1)[tok])


def _batch(seed=0, B=3, P=4, C=5, V=11, H=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, P + C), generator=g)
    att = torch.ones(B, P + C, dtype=torch.long)
    att[0, :2] = 0  # left padding
    att[1, P + 3 :] = 0  # a short completion
    hidden = torch.randn(B, C, H, generator=g, dtype=torch.float64) * 2
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    bias = torch.randn(V, generator=g, dtype=torch.float64)
    return ids, att, P, hidden, weight, bias


def test_history_seen_by_hand():
    ids = torch.tensor([[9, 1, 2, 3, 2, 4, 0]])  # P = 3: prompt (pad 9), 1, 2 | completion 3, 2, 4, 0
    att = torch.tensor([[0, 1, 1, 1, 1, 1, 1]])
    hist = History.of(ids, att, 3)
    seen = hist.seen(torch.tensor([0, 0, 0, 0]), torch.tensor([0, 1, 2, 3]), 10)  # (4, V) at t = 0..3
    expect = {0: {1, 2}, 1: {1, 2, 3}, 2: {1, 2, 3}, 3: {1, 2, 3, 4}}  # 9 is padding: never seen
    for t, toks in expect.items():
        assert set(seen[t].nonzero()[:, 0].tolist()) == toks, t
    # the sparse form: every entry (padding included) flags its token's first real occurrence, so entries agree
    idx, on = hist.sparse(torch.tensor([0, 0]), torch.tensor([0, 2]))
    assert idx[0].tolist() == [9, 1, 2, 3, 2, 4, 0]
    assert on.tolist() == [
        [False, True, True, False, True, False, False],
        [False, True, True, True, True, False, False],
    ]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampler_logprobs_match_the_step_by_step_reference(name):
    pr = SETTINGS[name]
    ids, att, P, hidden, weight, bias = _batch()
    logits = hidden @ weight.T + bias  # (B, C, V)
    comp = ids[:, P:]
    mask = att[:, P:].bool()
    fs = History.of(ids, att, P) if pr.repetition_penalty != 1 else None
    got = sampler_logprobs(logits, comp, pr, mask, fs, chunk_rows=4)
    changed = 0
    for b in range(ids.shape[0]):
        prompt = {int(t) for t, a in zip(ids[b, :P], att[b, :P]) if a}
        for t in range(comp.shape[1]):
            if not mask[b, t]:
                assert got[b, t] == 0
                continue
            seen = prompt | {int(x) for x in comp[b, :t]}
            ref = _reference(logits[b, t], seen, int(comp[b, t]), pr)
            assert got[b, t].item() == pytest.approx(ref, abs=1e-12), (name, b, t)
            plain = torch.log_softmax(logits[b, t] / pr.logprob_temperature, -1)[comp[b, t]]
            changed += abs(float(plain) - ref) > 1e-3
    assert changed > 0  # the setting changed the distribution: a no-op processing would pass the above


@pytest.mark.parametrize("name", ["top_k", "top_p", "all"])
def test_fused_equals_materialised_values_and_gradients(name):
    pr = SETTINGS[name]
    ids, att, P, hidden, weight, bias = _batch(seed=1)
    comp, mask = ids[:, P:], att[:, P:].bool()
    fs = History.of(ids, att, P) if pr.repetition_penalty != 1 else None
    g = torch.randn(comp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    outs = []
    for fused in (False, True):
        h, w, b = (x.clone().requires_grad_(True) for x in (hidden, weight, bias))
        if fused:
            lp = linear_sampler_logprobs(h, w, comp, pr, mask, b, fs, chunk_size=4)
        else:
            lp = sampler_logprobs(h @ w.T + b, comp, pr, mask, fs)
        (lp * g).sum().backward()
        outs.append((lp.detach(), h.grad, w.grad, b.grad))
    for a, c in zip(*outs):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)
    assert float(outs[1][1][~mask].abs().max()) == 0.0  # padding positions get no gradient


def test_gradient_is_onehot_minus_kept_distribution_over_temperature():
    pr = LogitProcessing(temperature=0.5, top_k=3)
    z = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.2]], dtype=torch.float64, requires_grad=True)  # kept: 0, 1, 2
    lp = sampler_logprobs(z[None], torch.tensor([[1]]), pr, torch.tensor([[True]]))
    lp.sum().backward()
    x = torch.tensor([2.0, 1.0, 0.5]) / 0.5
    p = torch.softmax(x.double(), -1)
    assert lp.item() == pytest.approx(float(torch.log(p[1])), abs=1e-14)
    expect = torch.zeros(5, dtype=torch.float64)
    expect[:3] = -p / 0.5
    expect[1] += 1 / 0.5
    torch.testing.assert_close(z.grad[0], expect, rtol=0, atol=1e-14)  # removed tokens: exactly 0


def test_sampled_token_outside_the_kept_set_stays_finite():
    pr = LogitProcessing(top_k=1)
    z = torch.tensor([[[3.0, 1.0, 0.0]]], dtype=torch.float64)
    lp = sampler_logprobs(z, torch.tensor([[1]]), pr, torch.tensor([[True]]))
    # K = {0} ∪ {sampled 1}: log(e^1 / (e^3 + e^1))
    assert lp.item() == pytest.approx(1.0 - math.log(math.exp(3) + math.exp(1)), abs=1e-14)


def test_active_only_when_the_distribution_changes():
    assert not LogitProcessing().active
    assert not LogitProcessing(temperature=0.3).active
    assert not LogitProcessing(temperature=0.0, top_k=3).active  # greedy removes nothing
    for name, pr in SETTINGS.items():
        assert pr.active, name
    sp = SamplingConfig(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2)
    assert sp.processing == LogitProcessing(0.7, 0.9, 5, 0.1, 1.2)
    assert sp.processed


@pytest.mark.parametrize(
    "spread", [0.05, 4.0]
)  # near-uniform: top-p sorts whole rows; peaked: 256 candidates
def test_fused_top_p_on_a_wide_vocabulary(spread):
    """V = 600 > the 256 candidates the fused top-p reads first: a flat row (the candidates hold < p of the mass)
    takes the full sort, a peaked one does not; both give the materialised values and gradients."""
    pr = LogitProcessing(temperature=1.0, top_p=0.9)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 4, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(600, 8, generator=g, dtype=torch.float64) * spread
    ids = torch.randint(0, 600, (2, 4), generator=g)
    mask = torch.ones(2, 4, dtype=torch.bool)
    outs = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        lp = (
            linear_sampler_logprobs(h, w, ids, pr, mask, chunk_size=3)
            if fused
            else sampler_logprobs(h @ w.T, ids, pr, mask)
        )
        lp.sum().backward()
        outs.append((lp.detach(), h.grad, w.grad))
    for a, c in zip(*outs):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)
    logp = torch.log_softmax(hidden @ weight.T, -1)
    plain = logp.gather(-1, ids[..., None])[..., 0]
    assert float((outs[0][0] - plain).abs().mean()) > 1e-3  # top-p removed mass
    top256 = logp.exp().topk(256, -1).values.sum(-1)  # which path the fused top-p took
    assert bool((top256 < 0.9).all()) if spread < 1 else bool((top256 > 0.9).all())


@pytest.mark.parametrize("name", ["top_k", "all", "greedy_penalty"])
def test_one_pass_gives_the_full_logprobs_entropy_and_sampler_with_their_gradients(name):
    """``linear_logprobs_and_sampler``: its first two outputs equal ``linear_logprobs`` (the model's full softmax and
    entropy), its third ``sampler_logprobs``; a loss through all three gets the sum of the three gradients."""
    from lit_rl.core.fused_logprobs import linear_logprobs
    from lit_rl.core.fused_sampler import linear_logprobs_and_sampler
    from lit_rl.core.logprobs import entropy_from_logits, token_logprobs

    pr = SETTINGS[name]
    ids, att, P, hidden, weight, bias = _batch(seed=2)
    comp, mask = ids[:, P:], att[:, P:].bool()
    hist = History.of(ids, att, P) if pr.repetition_penalty != 1 else None
    gen = torch.Generator().manual_seed(4)
    c1, c2, c3 = (torch.randn(comp.shape, dtype=torch.float64, generator=gen) for _ in range(3))
    outs = []
    for fused in (False, True):
        h, w, b = (x.clone().requires_grad_(True) for x in (hidden, weight, bias))
        if fused:
            lp, ent, lps = linear_logprobs_and_sampler(h, w, comp, pr, mask, b, hist, chunk_size=3)
        else:
            z = h @ w.T + b
            t = pr.logprob_temperature
            lp = token_logprobs(z, comp, temperature=t).masked_fill(~mask, 0)
            ent = entropy_from_logits(z, temperature=t).masked_fill(~mask, 0)
            lps = sampler_logprobs(z, comp, pr, mask, hist)
        ((lp * c1).sum() + (ent * c2).sum() + (lps * c3).sum()).backward()
        outs.append((lp.detach(), ent.detach(), lps.detach(), h.grad, w.grad, b.grad))
    for a, c in zip(*outs):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-11)
    base = linear_logprobs(hidden, weight, comp, bias, pr.logprob_temperature, mask=mask)
    torch.testing.assert_close(outs[1][0], base[0], rtol=0, atol=1e-12)
