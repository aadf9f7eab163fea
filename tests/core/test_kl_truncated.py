"""KL terms when the tokens come from a truncated sampler π^s ≠ π, by exact enumeration in float64 (issue 53).

π = softmax(θ) over V = 8 tokens, π^s = π renormalised over its top-3 (the kept set K held fixed in every
gradient, as the trainer's ratio holds it). Every expectation over a ~ π^s is the finite sum Σ_{a∈K} π^s(a)·f(a).

* The sampled estimators' means are Σ π^s·k, not KL(π‖π_ref); ``kl_from_logits`` (what ``ReferenceKL``'s
  ``exact`` computes, chunked) is KL(π‖π_ref) with the gradient ∇KL, whatever the sampler.
* Reward form with the exact KL (``ReferenceKL(where="reward", kind="exact")``) on a two-step tree: the policy
  gradient of the return under −β·KL_t rewards (core ``reinforce``) plus the direct β·Σ_t KL_t loss is exactly
  β∇J, J = E_{τ~π^s}[Σ_t KL_t(π‖π_ref)(s_t)], where the sampled k1 reward is not.
* On-policy distillation (``opd``): its expected policy gradient is exactly ∇KL(π^s‖π_T) (K fixed), the
  reverse KL of the sampling distribution to the teacher, not ∇KL(π‖π_T) (``reverse_kl_full``'s).
"""

from __future__ import annotations

import torch

from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.core.kl import kl_estimate, kl_from_logits
from lit_rl.core.policy_losses import PolicyLossInputs, compute_policy_loss

F64 = torch.float64
THETA = [1.5, 1.1, 0.9, 0.2, -0.3, -0.8, 0.4, -1.2]
REF = [0.3, 1.6, -0.2, 1.1, 0.0, -0.5, 0.9, 0.1]
TOP_K = 3


def _theta(values=THETA):
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _kept(z: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    keep = torch.zeros(z.shape, dtype=torch.bool)
    keep[torch.topk(z.detach(), k).indices] = True
    return keep


def _sampler_logp(z: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """log π^s over the kept set (−inf outside), differentiable with K fixed."""
    return torch.where(keep, z - torch.logsumexp(z[keep], 0), torch.full_like(z, -torch.inf))


def _kl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    p = lp.exp()
    return (torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))).sum(-1)


def test_sampled_estimators_are_biased_under_top_k_and_the_exact_kl_is_not():
    theta, ref = _theta(), torch.tensor(REF, dtype=F64)
    logp, logq = torch.log_softmax(theta, -1), torch.log_softmax(ref, -1)
    keep = _kept(theta)
    ps = _sampler_logp(theta, keep).exp().detach()
    kl = _kl(logp, logq)
    means = {
        kind: float((ps * kl_estimate(logp[None], logq[None], kind, log_ratio_clamp=None)[0]).sum())
        for kind in ("k1", "k2", "k3")
    }
    # the defect: E_π^s[k1] 0.7397, E_π^s[k2] 0.5665, E_π^s[k3] 0.4021 where KL(π‖π_ref) is 0.3598
    assert means["k1"] - float(kl) > 0.35 and means["k3"] - float(kl) > 0.04, (means, float(kl))
    # exact: chunked kl_from_logits is the KL and its gradient the analytic ∇_θ KL = π ⊙ (log π − log q − KL)
    exact = kl_from_logits(
        theta[None, None], ref[None, None], torch.ones(1, 1, dtype=torch.bool), chunk_size=1
    )
    assert float(exact) == float(kl) or abs(float(exact) / float(kl) - 1) < 1e-13
    (g,) = torch.autograd.grad(exact.sum(), theta)
    analytic = logp.exp() * (logp - logq - kl)
    torch.testing.assert_close(g, analytic.detach(), rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------ reward form on a two-step tree
V2, K2, BETA = 5, 2, 0.3
G = torch.Generator().manual_seed(0)
Z1, ZR1 = torch.randn(V2, generator=G, dtype=F64), torch.randn(V2, generator=G, dtype=F64)
Z2, ZR2 = torch.randn(V2, V2, generator=G, dtype=F64), torch.randn(V2, V2, generator=G, dtype=F64)


def _tree(z1: torch.Tensor, z2: torch.Tensor):
    """Every trajectory (a1, a2) the top-2 sampler can draw: (probability π^s(τ), log π^s(a1), log π^s(a2|a1),
    logits (2, V) of the policy and of the reference at its two positions)."""
    k1 = _kept(z1, K2)
    lps1 = _sampler_logp(z1, k1)
    out = []
    for a1 in k1.nonzero()[:, 0].tolist():
        k2 = _kept(z2[a1], K2)
        lps2 = _sampler_logp(z2[a1], k2)
        for a2 in k2.nonzero()[:, 0].tolist():
            prob = (lps1[a1] + lps2[a2]).exp()
            out.append((prob, lps1[a1], lps2[a2], torch.stack([z1, z2[a1]]), torch.stack([ZR1, ZR2[a1]])))
    return out


def _objective(z1, z2) -> torch.Tensor:
    """J = E_{τ~π^s}[KL_1 + KL_2(s_2)], differentiated through π^s(τ) (the states) and the KLs."""
    return sum(
        p * _kl(torch.log_softmax(zp, -1), torch.log_softmax(zr, -1)).sum()
        for p, _, _, zp, zr in _tree(z1, z2)
    )


def _reward_form_gradient(kind: str):
    """E_{τ~π^s}[−Σ_t ∇log π^s(a_t) A_t] + (exact only) β∇E[Σ_t KL_t(θ)], with A from core ``reinforce`` (γ = 1)
    on token rewards −β·KL_t (exact, from ``kl_from_logits``) or −β·k1_t (the sampled estimator)."""
    z1, z2 = Z1.clone().requires_grad_(True), Z2.clone().requires_grad_(True)
    tree = _tree(z1, z2)
    logits = torch.stack([t[3] for t in tree])  # (B, 2, V)
    ref = torch.stack([t[4] for t in tree])
    mask = torch.ones(len(tree), 2, dtype=torch.bool)
    probs = torch.stack([t[0] for t in tree]).detach()  # (B,)
    lps = torch.stack([torch.stack([t[1], t[2]]) for t in tree])  # (B, 2) log π^s(a_t), differentiable
    kl = kl_from_logits(logits, ref, mask)  # (B, 2) exact per-position KL, differentiable
    if kind == "exact":
        penalty = kl.detach()
    else:
        ids = _trajectories()  # the same order as _tree's
        lp = torch.log_softmax(logits.detach(), -1)
        lr = torch.log_softmax(ref, -1)
        lp_tok = torch.stack([torch.stack([lp[i, 0, a1], lp[i, 1, a2]]) for i, (a1, a2) in enumerate(ids)])
        lr_tok = torch.stack([torch.stack([lr[i, 0, a1], lr[i, 1, a2]]) for i, (a1, a2) in enumerate(ids)])
        penalty = kl_estimate(lp_tok, lr_tok, kind, log_ratio_clamp=None)
    adv = compute_advantages(
        "reinforce",
        AdvantageInputs(rewards=torch.zeros(len(tree), dtype=F64), mask=mask, token_rewards=-BETA * penalty),
    ).advantages  # (B, 2) reward-to-go
    surrogate = -(probs[:, None] * lps * adv).sum()
    if kind == "exact":
        surrogate = surrogate + BETA * (probs[:, None] * kl).sum()
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(surrogate, (z1, z2))])


def _trajectories():
    k1 = _kept(Z1, K2)
    return [
        (a1, a2) for a1 in k1.nonzero()[:, 0].tolist() for a2 in _kept(Z2[a1], K2).nonzero()[:, 0].tolist()
    ]


def test_reward_form_exact_kl_plus_its_loss_part_is_the_gradient_of_the_sampled_states_kl():
    z1, z2 = Z1.clone().requires_grad_(True), Z2.clone().requires_grad_(True)
    target = BETA * torch.cat([g.reshape(-1) for g in torch.autograd.grad(_objective(z1, z2), (z1, z2))])
    torch.testing.assert_close(_reward_form_gradient("exact"), target, rtol=1e-12, atol=1e-14)
    k1 = _reward_form_gradient("k1")  # the sampled k1 reward: cosine 0.73, norm ratio 0.80 to β∇J
    assert float(k1 @ target / (k1.norm() * target.norm())) < 0.9


def test_tree_enumeration_is_complete():
    assert len(_trajectories()) == K2 * K2  # top-2 at each of the two steps
    assert abs(sum(float(t[0]) for t in _tree(Z1, Z2)) - 1) < 1e-14


# ------------------------------------------------------------------ on-policy distillation
def test_opd_advantage_has_the_gradient_of_the_samplers_reverse_kl_to_the_teacher():
    """The opd advantage −(log π − log π_T)(a) (full-softmax log π, as DistillModule passes it) under a ratio of
    sampler log-probs: Σ_a π^s(a) ∇loss(a) = ∇KL(π^s‖π_T) exactly, because log π = log π^s + log π(K) on K and
    E_π^s[∇log π^s] = 0. The tail outside K gets no gradient: KL(π‖π_T) over the whole vocabulary is
    ``reverse_kl_full``'s (the expected gradients differ)."""
    theta, teacher = _theta(), torch.tensor(REF, dtype=F64)
    logq = torch.log_softmax(teacher, -1)
    keep = _kept(theta)
    idx = keep.nonzero()[:, 0]
    lps = _sampler_logp(theta, keep)
    logp = torch.log_softmax(theta, -1)
    n = len(idx)
    mask = torch.ones(n, 1, dtype=torch.bool)
    adv = compute_advantages(
        "opd",
        AdvantageInputs(
            rewards=torch.zeros(n, dtype=F64),
            mask=mask,
            logprobs=logp.detach()[idx][:, None],
            teacher_logprobs=logq[idx][:, None],
            valid=torch.ones(n, dtype=torch.bool),
        ),
    ).advantages
    sampler_lp = lps[idx][:, None]  # the ratio's log-probs (the trainer's π^s)
    per_tok, _ = compute_policy_loss(
        "ppo_clip",
        PolicyLossInputs(logprobs=sampler_lp, old_logprobs=sampler_lp.detach(), advantages=adv, mask=mask),
    )
    expected = (lps.exp().detach()[idx] * per_tok[:, 0]).sum()
    (g,) = torch.autograd.grad(expected, theta)
    (g_sampler,) = torch.autograd.grad(_kl(_sampler_logp(theta, keep), logq), theta)
    (g_full,) = torch.autograd.grad(_kl(torch.log_softmax(theta, -1), logq), theta)
    torch.testing.assert_close(g, g_sampler, rtol=1e-12, atol=1e-14)
    assert float((g - g_full).norm() / g_full.norm()) > 0.3
