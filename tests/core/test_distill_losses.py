"""Hand-computed float64 checks of the distillation losses (core.distill) and of the sampled/full reverse-KL
equivalence in expectation (exact enumeration over a small vocabulary, no Monte Carlo)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.core.distill import check_losses, masked_cross_entropy, teacher_topk, topk_reverse_kl
from lit_rl.core.kl import kl_from_logits
from lit_rl.core.policy_losses import PolicyLossInputs, compute_policy_loss

D = torch.float64
P = [0.1, 0.2, 0.3, 0.4]  # student
Q = [0.4, 0.3, 0.2, 0.1]  # teacher


def _logits(probs):
    return torch.tensor(probs, dtype=D).log().view(1, 1, -1)  # (1, 1, V)


def test_teacher_topk_values_ids_and_tail():
    vals, ids, tail = teacher_topk(_logits(Q), 2)
    assert ids.tolist() == [[[0, 1]]]
    torch.testing.assert_close(
        vals, torch.tensor([[[math.log(0.4), math.log(0.3)]]], dtype=D), rtol=1e-12, atol=0
    )
    torch.testing.assert_close(tail, torch.tensor([[math.log(0.3)]], dtype=D), rtol=1e-12, atol=0)


def test_topk_reverse_kl_with_tail_bucket():
    vals, ids, tail = teacher_topk(_logits(Q), 2)
    got = topk_reverse_kl(_logits(P), vals, ids, tail, torch.tensor([[True]]))
    want = 0.1 * math.log(0.1 / 0.4) + 0.2 * math.log(0.2 / 0.3) + 0.7 * math.log(0.7 / 0.3)
    assert got.dtype == D
    assert got.item() == pytest.approx(want, rel=1e-12)


def test_topk_reverse_kl_k_equals_v_is_the_full_reverse_kl():
    # tail mass is exactly 0 for both: the 0·log 0 branch must give 0, not NaN
    vals, ids, tail = teacher_topk(_logits(Q), 4)
    assert tail.item() == float("-inf")
    got = topk_reverse_kl(_logits(P), vals, ids, tail, torch.tensor([[True]]))
    want = sum(p * math.log(p / q) for p, q in zip(P, Q))
    assert got.item() == pytest.approx(want, rel=1e-12)
    full = kl_from_logits(_logits(P), _logits(Q), torch.tensor([[True]]), "reverse")
    assert got.item() == pytest.approx(full.item(), rel=1e-12)


def test_topk_reverse_kl_temperature():
    t = 2.0
    vals, ids, tail = teacher_topk(_logits(Q), 1, temperature=t)
    ps = [p**0.5 for p in P]
    ps = [x / sum(ps) for x in ps]
    qs = [q**0.5 for q in Q]
    qs = [x / sum(qs) for x in qs]
    got = topk_reverse_kl(_logits(P), vals, ids, tail, torch.tensor([[True]]), temperature=t)
    want = ps[0] * math.log(ps[0] / qs[0]) + (1 - ps[0]) * math.log((1 - ps[0]) / (1 - qs[0]))
    assert got.item() == pytest.approx(want, rel=1e-12)


def test_topk_reverse_kl_masked_positions_zero_value_and_gradient():
    s = torch.cat([_logits(P), _logits(Q)], dim=1).clone().requires_grad_(True)  # (1, 2, 4)
    t = torch.cat([_logits(Q), _logits(P)], dim=1)
    vals, ids, tail = teacher_topk(t, 2)
    kl = topk_reverse_kl(s, vals, ids, tail, torch.tensor([[True, False]]), chunk_size=1)
    assert kl[0, 1].item() == 0.0
    kl.sum().backward()
    assert torch.all(s.grad[0, 1] == 0) and s.grad[0, 0].abs().sum() > 0


def test_topk_reverse_kl_shape_errors():
    vals, ids, tail = teacher_topk(_logits(Q), 2)
    with pytest.raises(ValueError, match="tail_logprob"):
        topk_reverse_kl(_logits(P), vals, ids, tail.view(1, 1, 1), torch.tensor([[True]]))
    with pytest.raises(ValueError, match=r"topk k=5"):
        teacher_topk(_logits(Q), 5)


def test_masked_cross_entropy():
    lp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=D)
    got = masked_cross_entropy(lp, torch.tensor([[True, False]]))
    torch.testing.assert_close(got, torch.tensor([[math.log(2.0), 0.0]], dtype=D), rtol=1e-12, atol=0)


def test_check_losses_errors():
    assert check_losses({"jsd": 1, "sft_on_success": 0.5}) == {"jsd": 1.0, "sft_on_success": 0.5}
    with pytest.raises(ValueError, match="unknown loss 'kl'.*reverse_kl_sampled"):
        check_losses({"kl": 1.0})
    with pytest.raises(ValueError, match="losses.jsd"):
        check_losses({"jsd": -1.0})
    with pytest.raises(ValueError, match="non-empty"):
        check_losses({})


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("student,teacher", [(P, Q), ([0.7, 0.2, 0.1], [0.2, 0.5, 0.3])])
def test_sampled_reverse_kl_matches_full_in_expectation(policy_loss, student, teacher):
    """E_{y~p}[opd policy-gradient loss] has the value KL(p‖q) (as −A) and exactly its gradient.

    Enumerate every token y of the vocabulary as one row (T = 1), weight row y by p(y) (no grad): the
    weighted sum is the exact expectation over on-policy samples of the sampled term's value/gradient.
    """
    V = len(student)
    theta = torch.tensor(student, dtype=D).log().requires_grad_(True)  # student logits (V,)
    q_logits = torch.tensor(teacher, dtype=D).log()
    full = kl_from_logits(
        theta.view(1, 1, V), q_logits.view(1, 1, V), torch.tensor([[True]]), "reverse"
    ).sum()
    (g_full,) = torch.autograd.grad(full, theta)

    logp = torch.log_softmax(theta, -1)  # (V,)
    y = torch.arange(V)
    lp = logp[y].view(V, 1)  # (B=V, T=1): row y sampled token y
    tlp = torch.log_softmax(q_logits, -1)[y].view(V, 1)
    mask = torch.ones(V, 1, dtype=torch.bool)
    adv = compute_advantages(
        "opd",
        AdvantageInputs(
            rewards=torch.zeros(V, dtype=D), mask=mask, logprobs=lp.detach(), teacher_logprobs=tlp
        ),
    ).advantages
    per_tok, _ = compute_policy_loss(
        policy_loss, PolicyLossInputs(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask)
    )
    w = logp.exp().detach()  # p(y)
    expected_loss = (w * per_tok[:, 0]).sum()
    (g_sampled,) = torch.autograd.grad(expected_loss, theta)
    torch.testing.assert_close(g_sampled, g_full, rtol=1e-10, atol=1e-14)
    # value: E_p[−A] = E_p[log p − log q] = KL(p‖q)
    assert (w * -adv[:, 0]).sum().item() == pytest.approx(full.item(), rel=1e-12)
    want = sum(p * math.log(p / q) for p, q in zip(student, teacher))
    assert full.item() == pytest.approx(want, rel=1e-12)
