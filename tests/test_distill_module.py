"""DistillModule loss terms against hand-computed float64 values (one per loss branch), RL mixing, and config
errors. The teacher is a stub returning fixed logits, so each term is checked in isolation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lit_rl.core.distill import teacher_topk
from lit_rl.data.experience import Experience
from lit_rl.learners.distill import STUDENT_DISTILLATION, DistillModule
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling

D = torch.float64
P1, Q1 = [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]  # position 0: student, teacher
P2, Q2 = [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]  # position 1
TOK = [2, 0]  # sampled tokens


def _kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b))


def _micro(mask=(True, True)):
    return Experience(
        input_ids=torch.tensor([[7, *TOK]]),
        attention_mask=torch.ones(1, 3, dtype=torch.long),
        loss_mask=torch.tensor([list(mask)]),
        prompt_len=1,
        group_ids=torch.zeros(1, dtype=torch.long),
        rewards=torch.zeros(1),
        valid=torch.ones(1, dtype=torch.bool),
        policy_version=torch.zeros(1, dtype=torch.long),
        domains=["d"],
    )


def _fwd(micro):
    logits = torch.tensor([[P1, P2]], dtype=D).log().requires_grad_(True)  # (1, 2, V)
    lp = torch.log_softmax(logits, -1).gather(-1, micro.completion_ids.unsqueeze(-1)).squeeze(-1)
    m = micro.loss_mask
    return {
        "logits": logits,
        "logprobs": lp,
        "mask": m,
        "num_tokens": int(m.sum()),
        "num_seqs": 1,
        "hidden": None,
    }


class _StubRouter:
    def teacher_logits(self, module, micro, loss):
        return torch.tensor([[Q1, Q2]], dtype=D).log()


def _module(tiny_model_dir, **kw):
    m = DistillModule(model=str(tiny_model_dir), **kw)
    m.router = _StubRouter  # instance attribute: no trainer needed
    return m


@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_reverse_kl_sampled_term(tiny_model_dir, coef):
    m = _module(tiny_model_dir, losses={"reverse_kl_sampled": coef})
    micro = _micro()
    lq = [math.log(Q1[TOK[0]]), math.log(Q2[TOK[1]])]
    lp = [math.log(P1[TOK[0]]), math.log(P2[TOK[1]])]
    micro.extras["opd_advantages"] = torch.tensor([[-(lp[0] - lq[0]), -(lp[1] - lq[1])]], dtype=D)
    out = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))
    # ratio = 1 on-policy: ppo_clip per-token loss is −A; token_mean over 2 tokens
    want = coef * ((lp[0] - lq[0]) + (lp[1] - lq[1])) / 2
    assert out["reverse_kl_sampled"].item() == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("a1,clip_low", [(-1.0, 0.5), (1.0, 0.0)])
def test_reverse_kl_sampled_reports_its_own_clipping(tiny_model_dir, a1, clip_low):
    """Off-policy (ratios 1.5 and 0.5), ppo_clip with eps 0.2: token 0 (A = +1) is clipped above; token 1 is
    clipped below only when A < 0. The term reports it as distill/clipfrac* (the policy objective's actor/clipfrac
    reads the reward advantages, all 0 at rl_coef 0)."""
    m = _module(tiny_model_dir, losses={"reverse_kl_sampled": 1.0})
    micro = _micro()
    lp = [math.log(P1[TOK[0]]), math.log(P2[TOK[1]])]
    micro.old_logprobs = torch.tensor([[lp[0] - math.log(1.5), lp[1] - math.log(0.5)]], dtype=D)
    micro.extras["opd_advantages"] = torch.tensor([[1.0, a1]], dtype=D)
    out = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))
    assert out.metrics == pytest.approx(
        {"distill/clipfrac": 0.5 + clip_low, "distill/clipfrac_low": clip_low, "distill/clipfrac_high": 0.5},
        rel=1e-12,
    )
    # −min(r·A, clip(r)·A) per token, token_mean: token 0 −1.2; token 1 −min(−0.5, −0.8) = 0.8 or −min(0.5, 0.8)
    want = (-1.2 + (0.8 if a1 < 0 else -0.5)) / 2
    assert out["reverse_kl_sampled"].item() == pytest.approx(want, rel=1e-12)


def test_reverse_kl_full_term_and_masking(tiny_model_dir):
    m = _module(tiny_model_dir, losses={"reverse_kl_full": 2.0})
    micro = _micro()
    assert STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))["reverse_kl_full"].item() == pytest.approx(
        2.0 * (_kl(P1, Q1) + _kl(P2, Q2)) / 2, rel=1e-12
    )
    micro = _micro(mask=(True, False))  # a masked position contributes nothing
    assert STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))["reverse_kl_full"].item() == pytest.approx(
        2.0 * _kl(P1, Q1), rel=1e-12
    )


def test_forward_kl_term(tiny_model_dir):
    m = _module(tiny_model_dir, losses={"forward_kl": 1.0})
    micro = _micro()
    got = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))["forward_kl"].item()
    assert got == pytest.approx((_kl(Q1, P1) + _kl(Q2, P2)) / 2, rel=1e-12)


def test_jsd_term(tiny_model_dir):
    beta = 0.3
    m = _module(tiny_model_dir, losses={"jsd": 1.0}, jsd_beta=beta)
    micro = _micro()

    def jsd(p, q):
        mix = [beta * b + (1 - beta) * a for a, b in zip(p, q)]
        return beta * _kl(q, mix) + (1 - beta) * _kl(p, mix)

    got = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))["jsd"].item()
    assert got == pytest.approx((jsd(P1, Q1) + jsd(P2, Q2)) / 2, rel=1e-12)


def test_topk_reverse_kl_term(tiny_model_dir):
    m = _module(tiny_model_dir, losses={"topk_reverse_kl": 1.0}, topk=1)
    assert m.teacher_topk_k == 1
    micro = _micro()
    v, i, t = teacher_topk(torch.tensor([[Q1, Q2]], dtype=D).log(), 1)
    micro.extras.update(teacher_topk_logprobs=v, teacher_topk_ids=i, teacher_tail_logprob=t)
    # position 0: teacher top-1 = token 0 (0.4); position 1: token 0 (0.7)
    k0 = 0.1 * math.log(0.1 / 0.4) + 0.9 * math.log(0.9 / 0.6)
    k1 = 0.25 * math.log(0.25 / 0.7) + 0.75 * math.log(0.75 / 0.3)
    got = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))["topk_reverse_kl"].item()
    assert got == pytest.approx((k0 + k1) / 2, rel=1e-12)


def test_combined_terms_each_present(tiny_model_dir):
    m = _module(tiny_model_dir, losses={"reverse_kl_full": 1.0, "forward_kl": 0.5, "jsd": 0.25})
    micro = _micro()
    out = STUDENT_DISTILLATION.loss_terms(m, micro, _fwd(micro))
    assert set(out) == {"reverse_kl_full", "forward_kl", "jsd"}
    assert out["forward_kl"].item() == pytest.approx(0.5 * (_kl(Q1, P1) + _kl(Q2, P2)) / 2, rel=1e-12)


def test_rl_mixing_scales_reward_advantages_and_adds_opd(tiny_model_dir):
    m = _module(
        tiny_model_dir, losses={"reverse_kl_sampled": 1.0}, rl_coef=0.5, advantage="grpo", std_normalize=False
    )
    exp = Experience(
        input_ids=torch.tensor([[7, 2], [7, 0]]),
        attention_mask=torch.ones(2, 2, dtype=torch.long),
        loss_mask=torch.ones(2, 1, dtype=torch.bool),
        prompt_len=1,
        group_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0]),
        valid=torch.ones(2, dtype=torch.bool),
        policy_version=torch.zeros(2, dtype=torch.long),
        rollout_logprobs=torch.tensor([[-1.0], [-2.0]]),
        teacher_logprobs=torch.tensor([[-0.5], [-3.0]]),
    )
    metrics = m.compute_advantages(exp)
    torch.testing.assert_close(exp.advantages, torch.tensor([[0.25], [-0.25]]))  # 0.5 · (r − mean)
    torch.testing.assert_close(
        exp.extras["opd_advantages"], torch.tensor([[0.5], [-1.0]])
    )  # −(log π − log π_T)
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.5 + 1.0) / 2)
    m0 = _module(tiny_model_dir, losses={"reverse_kl_sampled": 1.0})  # rl_coef 0: reward term off
    m0.compute_advantages(exp)
    assert torch.all(exp.advantages == 0)
    mb = _module(
        tiny_model_dir, losses={"reverse_kl_sampled": 1.0}, opd_baseline=True
    )  # leave-one-out, same group
    mb.compute_advantages(exp)
    torch.testing.assert_close(exp.extras["opd_advantages"], torch.tensor([[0.5 - (-1.0)], [-1.0 - 0.5]]))


def test_config_errors(tiny_model_dir):
    with pytest.raises(ValueError, match="unknown loss 'rkl'"):
        DistillModule(model=str(tiny_model_dir), losses={"rkl": 1.0})
    with pytest.raises(ValueError, match="jsd_beta"):
        DistillModule(model=str(tiny_model_dir), losses={"jsd": 1.0}, jsd_beta=1.0)
    with pytest.raises(ValueError, match="kd_on"):
        DistillModule(model=str(tiny_model_dir), losses={"jsd": 1.0}, kd_on="both_ways")
    with pytest.raises(ValueError, match="rl_coef"):
        DistillModule(model=str(tiny_model_dir), rl_coef=-1.0)
    with pytest.raises(ValueError, match="opd_baseline only affects reverse_kl_sampled"):
        DistillModule(model=str(tiny_model_dir), losses={"forward_kl": 1.0}, opd_baseline=True)
    with pytest.raises(TypeError, match="opd_baseline must be true or false"):
        DistillModule(model=str(tiny_model_dir), opd_baseline="yes")
    m = DistillModule(model=str(tiny_model_dir), losses={"forward_kl": 1.0})
    assert m.hparams.losses == {"forward_kl": 1.0} and m.hparams.model == str(tiny_model_dir)


def test_reverse_kl_sampled_under_a_truncating_sampler_warns_at_setup(tiny_model_dir):
    """Its expected gradient is then ∇KL(π^s‖π_T) over the kept set (tests/core/test_kl_truncated.py), not the
    full-vocabulary KL(π‖π_T) of reverse_kl_full: said once at setup, the user's choice kept."""
    from lit_rl.core.processed import LogitProcessing

    class Router:
        def check_teachers(self, module, loss):
            pass

    m = DistillModule(model=str(tiny_model_dir), losses={"reverse_kl_sampled": 1.0})
    bind_sampling(m, teacher_router=Router())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.setup("fit")  # plain sampling: nothing to say
    bind_sampling(m, SamplingConfig(top_p=0.9), teacher_router=Router())
    assert m.processing == LogitProcessing(temperature=1.0, top_p=0.9)
    with pytest.warns(UserWarning, match=r"reverse_kl_sampled.*top_p=0.9.*KL\(π\^s‖π_T\).*reverse_kl_full"):
        m.setup("fit")
