"""Hand-computed tests for lit_rl.core.advantages (float64, rtol <= 1e-12), plus a plain-Python reference."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.advantages import ADVANTAGES, AdvantageInputs, compute_advantages

F64 = torch.float64
T_, F_ = True, False
EPS = 1e-6
NAN = math.nan


def close(actual, expected, rtol=1e-12, atol=1e-12):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=rtol, atol=atol
    )


def t64(x):
    return torch.tensor(x, dtype=F64)


def rows_to_tokens(row_adv, mask):
    """Broadcast hand-computed per-row values onto the mask (the expected layout of group estimators)."""
    return torch.where(mask, t64(row_adv)[:, None], t64(0.0))


# Two groups of unequal size; rows padded to different lengths.
#   group 0: rewards 1, 0, 0.5 -> mean 0.5, unbiased std sqrt(0.5 / 2) = 0.5
#   group 1: rewards 2, 4      -> mean 3,   unbiased std sqrt(2 / 1) = sqrt(2)
REWARDS = [1.0, 0.0, 0.5, 2.0, 4.0]
GROUPS = [0, 0, 0, 7, 7]
MASK = torch.tensor([[T_, T_, T_], [T_, F_, F_], [T_, T_, F_], [T_, T_, T_], [T_, F_, F_]])


def two_groups(**kw):
    return AdvantageInputs(t64(REWARDS), MASK, group_ids=torch.tensor(GROUPS), **kw)


# --------------------------------------------------------------------------------------- group family


def test_grpo_std_normalized():
    out = compute_advantages("grpo", two_groups())
    exp = [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.0, -1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)]
    close(out.advantages, rows_to_tokens(exp, MASK))
    assert out.returns is None
    assert out.metrics["adv/num_groups"] == 2.0
    assert out.metrics["adv/zero_std_groups"] == 0.0 and out.metrics["adv/singleton_groups"] == 0.0


def test_grpo_without_std_normalize():
    out = compute_advantages("grpo", two_groups(std_normalize=False))
    close(out.advantages, rows_to_tokens([0.5, -0.5, 0.0, -1.0, 1.0], MASK))


def test_dr_grpo_never_divides_by_std():
    out = compute_advantages("dr_grpo", two_groups(std_normalize=True))
    close(out.advantages, rows_to_tokens([0.5, -0.5, 0.0, -1.0, 1.0], MASK))


def test_rloo_leave_one_out_baseline():
    out = compute_advantages("rloo", two_groups())
    # 1 - (0 + .5)/2, 0 - (1 + .5)/2, .5 - (1 + 0)/2, 2 - 4, 4 - 2
    close(out.advantages, rows_to_tokens([0.75, -0.75, 0.0, -2.0, 2.0], MASK))


def test_metrics_over_valid_action_tokens():
    out = compute_advantages("dr_grpo", two_groups())
    toks = [0.5] * 3 + [-0.5] + [0.0] * 2 + [-1.0] * 3 + [1.0]  # 10 action tokens
    mean = sum(toks) / 10
    std = math.sqrt(sum((a - mean) ** 2 for a in toks) / 10)
    for k, v in {"adv/mean": mean, "adv/std": std, "adv/max": 1.0, "adv/min": -1.0}.items():
        assert out.metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_of_one_gets_zero(name):
    inp = AdvantageInputs(
        t64([1.0, 0.0, 5.0]), torch.ones(3, 2, dtype=torch.bool), group_ids=torch.tensor([0, 0, 1])
    )
    out = compute_advantages(name, inp)
    close(out.advantages[2], [0.0, 0.0])
    assert out.metrics["adv/singleton_groups"] == 1.0
    assert out.metrics["adv/num_groups"] == 2.0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_invalid_row_with_nan_is_excluded(name):
    # group 0 gains an invalid NaN row; it must neither change group 0's statistics nor emit NaN
    rewards = t64([1.0, 0.0, NAN, 0.5, 2.0, 4.0])
    mask = torch.cat([MASK[:2], torch.ones(1, 3, dtype=torch.bool), MASK[2:]])
    valid = torch.tensor([T_, T_, F_, T_, T_, T_])
    inp = AdvantageInputs(
        rewards,
        mask,
        group_ids=torch.tensor([0, 0, 0, 0, 7, 7]),
        valid=valid,
        token_rewards=torch.full((6, 3), NAN, dtype=F64).masked_fill(valid[:, None], 0.0),
    )
    ref = compute_advantages(name, two_groups()).advantages
    out = compute_advantages(name, inp)
    close(out.advantages[valid], ref)
    close(out.advantages[2], [0.0, 0.0, 0.0])
    assert out.metrics["adv/invalid_rows"] == 1.0
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_zero_std_group_gets_exact_zero(name):
    # 0.1 * 3 / 3 != 0.1 in floating point: equality must be detected exactly, not via a tiny std
    inp = AdvantageInputs(
        t64([0.1, 0.1, 0.1, 1.0, 0.0]),
        torch.ones(5, 2, dtype=torch.bool),
        group_ids=torch.tensor([3, 3, 3, 4, 4]),
    )
    out = compute_advantages(name, inp)
    assert torch.equal(out.advantages[:3], torch.zeros(3, 2, dtype=F64))
    assert out.metrics["adv/zero_std_groups"] == 1.0
    assert out.metrics["adv/zero_std_frac"] == 0.5


def test_no_group_ids_means_one_group():
    inp = AdvantageInputs(t64(REWARDS), MASK)
    out = compute_advantages("dr_grpo", inp)
    close(out.advantages, rows_to_tokens([r - 1.5 for r in REWARDS], MASK))
    assert out.metrics["adv/num_groups"] == 1.0


def test_group_scores_add_token_rewards_on_action_tokens_only():
    mask = torch.tensor([[T_, T_, F_], [T_, F_, F_]])
    tok = t64([[-0.1, -0.2, 100.0], [0.3, 100.0, 100.0]])  # 100s sit on non-action tokens
    out = compute_advantages("dr_grpo", AdvantageInputs(t64([1.0, 0.0]), mask, token_rewards=tok))
    # scores 0.7 and 0.3, mean 0.5
    close(out.advantages, rows_to_tokens([0.2, -0.2], mask))


# ------------------------------------------------------------------------------------------ reinforce


def reinforce_inputs(**kw):
    # row 0: action, action, observation, observation, action, padding; row 1: three actions then padding
    mask = torch.tensor([[T_, T_, F_, F_, T_, F_], [T_, T_, T_, F_, F_, F_]])
    tok = t64([[0.1, 0.2, 9.0, 9.0, 0.3, 9.0], [0.0] * 6])
    return AdvantageInputs(t64([1.0, 2.0]), mask, token_rewards=tok, **kw)


def test_reinforce_discounts_per_action_token_skipping_observations():
    out = compute_advantages("reinforce", reinforce_inputs(gamma=0.5))
    # row 0: r = .1, .2, (obs), (obs), .3 + 1 -> G = .1 + .5 * .85, .2 + .5 * 1.3, 1.3
    exp = t64([[0.525, 0.85, 0, 0, 1.3, 0], [0.5, 1.0, 2.0, 0, 0, 0]])
    close(out.advantages, exp)
    close(out.returns, exp)


def test_reinforce_batch_mean_baseline():
    out = compute_advantages("reinforce", reinforce_inputs(gamma=0.5, baseline=True))
    b = (0.525 + 0.85 + 1.3 + 0.5 + 1.0 + 2.0) / 6
    exp = t64([[0.525 - b, 0.85 - b, 0, 0, 1.3 - b, 0], [0.5 - b, 1.0 - b, 2.0 - b, 0, 0, 0]])
    close(out.advantages, exp)
    close(out.returns, t64([[0.525, 0.85, 0, 0, 1.3, 0], [0.5, 1.0, 2.0, 0, 0, 0]]))


def test_reinforce_gamma_one_is_undiscounted_sum():
    out = compute_advantages("reinforce", reinforce_inputs(gamma=1.0))
    close(out.advantages, t64([[1.6, 1.5, 0, 0, 1.3, 0], [2.0, 2.0, 2.0, 0, 0, 0]]))


# ------------------------------------------------------------------------------------------------ gae


def gae_inputs(**kw):
    # one row: action, action, observation, action, padding (non-action fields hold junk)
    mask = torch.tensor([[T_, T_, F_, T_, F_]])
    return AdvantageInputs(
        t64([1.0]),
        mask,
        values=t64([[0.5, 0.4, 7.0, 0.2, NAN]]),
        token_rewards=t64([[0.0, 0.1, 5.0, 0.0, NAN]]),
        **kw,
    )


def test_gae_hand_worked_gamma_lambda_below_one():
    out = compute_advantages("gae", gae_inputs(gamma=0.9, lam=0.8))
    # t3: d = 1 - .2 = .8 ;  t1: d = .1 + .9*.2 - .4 = -.12, A = -.12 + .72*.8 = .456
    # t0: d = .9*.4 - .5 = -.14, A = -.14 + .72*.456 = .18832
    close(out.advantages, t64([[0.18832, 0.456, 0.0, 0.8, 0.0]]))
    close(out.returns, t64([[0.68832, 0.856, 0.0, 1.0, 0.0]]))


def test_gae_lambda_zero_is_one_step_td():
    out = compute_advantages("gae", gae_inputs(gamma=0.9, lam=0.0))
    close(out.advantages, t64([[-0.14, -0.12, 0.0, 0.8, 0.0]]))


def test_gae_lambda_one_gamma_one_equals_reward_to_go_minus_values():
    g = torch.Generator().manual_seed(1)
    B, T = 6, 10
    mask = torch.rand(B, T, generator=g) < 0.7
    kw = {
        "rewards": torch.randn(B, generator=g, dtype=F64),
        "mask": mask,
        "token_rewards": torch.randn(B, T, generator=g, dtype=F64),
    }
    values = torch.randn(B, T, generator=g, dtype=F64)
    rtg = compute_advantages("reinforce", AdvantageInputs(**kw, gamma=1.0)).returns
    out = compute_advantages("gae", AdvantageInputs(**kw, values=values, gamma=1.0, lam=1.0))
    close(out.advantages, torch.where(mask, rtg - values, t64(0.0)))
    close(out.returns, rtg)


def test_gae_requires_values():
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", AdvantageInputs(t64([1.0]), torch.ones(1, 2, dtype=torch.bool)))


# ------------------------------------------------------------------------------------------------ opd


def test_opd_negative_log_ratio_on_action_tokens():
    mask = torch.tensor([[T_, T_, F_]])
    inp = AdvantageInputs(
        t64([0.0]), mask, logprobs=t64([[-1.0, -2.0, NAN]]), teacher_logprobs=t64([[-1.5, -1.0, -math.inf]])
    )
    out = compute_advantages("opd", inp)
    close(out.advantages, t64([[-0.5, 1.0, 0.0]]))
    assert out.returns is None
    assert out.metrics["opd/reverse_kl"] == pytest.approx(-0.25, rel=1e-12)


def test_opd_leave_one_out_baseline_per_position():
    # a = teacher − student log-prob; rows 0-2 and the invalid row 4 share group 0, row 3 is alone in group 1
    a = t64([[1.0, 2.0], [3.0, -1.0], [-2.0, 4.0], [5.0, 0.5], [7.0, 7.0]])
    mask = torch.tensor([[T_, T_], [T_, F_], [T_, T_], [T_, T_], [T_, T_]])
    inp = AdvantageInputs(
        torch.zeros(5, dtype=F64),
        mask,
        group_ids=torch.tensor([0, 0, 0, 1, 0]),
        valid=torch.tensor([T_, T_, T_, T_, F_]),
        logprobs=torch.full((5, 2), -1.0, dtype=F64),
        teacher_logprobs=a - 1.0,
        baseline=True,
    )
    out = compute_advantages("opd", inp)
    # t=0: others of row 0 are {3, -2} -> 1 - 0.5; row 1: {1, -2} -> 3 + 0.5; row 2: {1, 3} -> -2 - 2.
    # t=1: row 1 is masked, so row 0's only other is row 2 (4) and vice versa. Row 3 has no other: unchanged.
    close(out.advantages, t64([[0.5, -2.0], [3.5, 0.0], [-4.0, 2.0], [5.0, 0.5], [0.0, 0.0]]))
    one_group = AdvantageInputs(
        torch.zeros(2, dtype=F64),
        torch.ones(2, 1, dtype=torch.bool),
        logprobs=torch.zeros(2, 1, dtype=F64),
        teacher_logprobs=t64([[1.0], [3.0]]),
        baseline=True,
    )
    close(compute_advantages("opd", one_group).advantages, t64([[-2.0], [2.0]]))  # group_ids=None: one group


def test_opd_baseline_keeps_the_expected_gradient():
    """Exact enumeration over every group of G=3 one-token samples from a V=3 student: the policy gradient
    Σ_i A_i ∇log p(y_i) has the same expectation with and without the leave-one-out baseline, and it equals
    −G ∇KL(p ‖ q) (the reverse-KL gradient the sampled loss targets)."""
    import itertools

    z = torch.tensor([0.3, -0.8, 1.1], dtype=F64, requires_grad=True)
    q = torch.log_softmax(t64([1.5, 0.2, -1.0]), -1)
    G = 3

    def expected_grad(baseline: bool) -> torch.Tensor:
        lp = torch.log_softmax(z, -1)
        total = torch.zeros((), dtype=F64)
        for ys in itertools.product(range(3), repeat=G):
            y = torch.tensor(ys)
            inp = AdvantageInputs(
                torch.zeros(G, dtype=F64),
                torch.ones(G, 1, dtype=torch.bool),
                group_ids=torch.zeros(G, dtype=torch.long),
                logprobs=lp.detach()[y][:, None],
                teacher_logprobs=q[y][:, None],
                baseline=baseline,
            )
            adv = compute_advantages("opd", inp).advantages[:, 0]
            total = total + lp.detach()[y].sum().exp() * (adv * lp[y]).sum()
        return torch.autograd.grad(total, z)[0]

    lp = torch.log_softmax(z, -1)
    kl_grad = torch.autograd.grad((lp.exp() * (lp - q)).sum(), z)[0]
    close(expected_grad(False), -G * kl_grad)
    close(expected_grad(True), -G * kl_grad)
    assert not torch.allclose(expected_grad(True), torch.zeros(3, dtype=F64))


def test_opd_requires_both_logprobs():
    inp = AdvantageInputs(
        t64([0.0]), torch.ones(1, 2, dtype=torch.bool), logprobs=torch.zeros(1, 2, dtype=F64)
    )
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_advantages("opd", inp)


# ------------------------------------------------------------------------- reference loop & invariance


def reference(name, rewards, mask, groups, valid, tok, values, gamma, lam, std_normalize, baseline):
    """Plain Python, one row and one group at a time."""
    B, T = len(rewards), len(mask[0])
    adv = [[0.0] * T for _ in range(B)]
    if name in ("grpo", "dr_grpo", "rloo"):
        score = [rewards[i] + sum(tok[i][t] for t in range(T) if mask[i][t]) for i in range(B)]
        for gid in set(groups):
            members = [i for i in range(B) if groups[i] == gid and valid[i]]
            xs = [score[i] for i in members]
            n = len(xs)
            if n < 2 or max(xs) == min(xs):
                continue
            mean = sum(xs) / n
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
            for i in members:
                if name == "grpo":
                    a = (score[i] - mean) / (std + EPS) if std_normalize else score[i] - mean
                elif name == "dr_grpo":
                    a = score[i] - mean
                else:
                    a = score[i] - (sum(xs) - score[i]) / (n - 1)
                adv[i] = [a if mask[i][t] else 0.0 for t in range(T)]
        return adv, None
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        steps = [t for t in range(T) if mask[i][t]]
        if not valid[i] or not steps:
            continue
        r = {t: tok[i][t] for t in steps}
        r[steps[-1]] += rewards[i]
        v = {t: (values[i][t] if values is not None else 0.0) for t in steps}
        a_next, v_next = 0.0, 0.0
        for t in reversed(steps):
            a_next = r[t] + gamma * v_next - v[t] + gamma * (lam if name == "gae" else 1.0) * a_next
            v_next = v[t]
            adv[i][t], ret[i][t] = a_next, a_next + v[t]
    if name == "reinforce" and baseline:
        toks = [ret[i][t] for i in range(B) for t in range(T) if mask[i][t] and valid[i]]
        b = sum(toks) / len(toks)
        adv = [[ret[i][t] - b if mask[i][t] and valid[i] else 0.0 for t in range(T)] for i in range(B)]
    return adv, ret


CASES = [
    ("grpo", {}),
    ("grpo", {"std_normalize": False}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce", {"gamma": 0.9}),
    ("reinforce", {"gamma": 0.9, "baseline": True}),
    ("gae", {"gamma": 0.95, "lam": 0.9}),
]


def random_inputs(seed, discrete):
    g = torch.Generator().manual_seed(seed)
    B, T = 14, 8
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 9])  # sizes 4, 3, 1, 3, 2, 1
    rewards = (
        torch.randint(0, 2, (B,), generator=g).to(F64) if discrete else torch.randn(B, generator=g, dtype=F64)
    )
    valid = torch.rand(B, generator=g) > 0.2
    valid[0] = True
    rewards = torch.where(valid, rewards, t64(NAN))  # invalid rows carry NaN
    mask = torch.rand(B, T, generator=g) < 0.75
    mask[:, 0] = True
    tok = torch.randn(B, T, generator=g, dtype=F64) * 0.1
    if discrete:  # 0/1 scores so that zero-std groups occur (token rewards would break the ties)
        tok = torch.zeros(B, T, dtype=F64)
    values = torch.randn(B, T, generator=g, dtype=F64)
    return rewards, mask, groups, valid, tok, values


@pytest.mark.parametrize("seed,discrete", [(0, True), (1, False), (2, True)])
@pytest.mark.parametrize("name,kw", CASES)
def test_vectorised_matches_python_loop(name, kw, seed, discrete):
    rewards, mask, groups, valid, tok, values = random_inputs(seed, discrete)
    inp = AdvantageInputs(
        rewards, mask, group_ids=groups, valid=valid, token_rewards=tok, values=values, **kw
    )
    out = compute_advantages(name, inp)
    full = {"gamma": 1.0, "lam": 1.0, "std_normalize": True, "baseline": False} | kw
    exp_adv, exp_ret = reference(
        name,
        rewards.tolist(),
        mask.tolist(),
        groups.tolist(),
        valid.tolist(),
        tok.tolist(),
        values.tolist() if name == "gae" else None,
        **full,
    )
    close(out.advantages, exp_adv)
    if exp_ret is not None:
        close(out.returns, exp_ret)
    assert out.metrics["adv/invalid_rows"] == float((~valid).sum())
    if name in ("grpo", "dr_grpo", "rloo"):
        members = [
            [float(rewards[i]) for i in range(14) if groups[i] == g and valid[i]] for g in (0, 1, 2, 3, 4, 9)
        ]
        zero_std = sum(1 for xs in members if len(xs) >= 2 and max(xs) == min(xs))
        assert out.metrics["adv/singleton_groups"] == float(sum(len(xs) == 1 for xs in members))
        assert out.metrics["adv/zero_std_groups"] == float(zero_std)
        assert out.metrics["adv/zero_std_frac"] == pytest.approx(zero_std / 6, rel=1e-12)
        if discrete:
            assert zero_std > 0  # the branch is actually exercised


@pytest.mark.parametrize("name,kw", CASES + [("opd", {})])
def test_padding_invariance(name, kw):
    rewards, mask, groups, valid, tok, values = random_inputs(5, False)
    lp = torch.randn(mask.shape, dtype=F64, generator=torch.Generator().manual_seed(6))
    base = AdvantageInputs(
        rewards,
        mask,
        group_ids=groups,
        valid=valid,
        token_rewards=tok,
        values=values,
        logprobs=lp,
        teacher_logprobs=lp * 0.5,
        **kw,
    )
    pad = 3
    junk = torch.full((14, pad), NAN, dtype=F64)

    def widen(x):
        return torch.cat([x, junk], dim=1)  # (B, T + pad)

    padded = AdvantageInputs(
        rewards,
        torch.cat([mask, torch.zeros(14, pad, dtype=torch.bool)], dim=1),
        group_ids=groups,
        valid=valid,
        token_rewards=widen(tok),
        values=widen(values),
        logprobs=widen(lp),
        teacher_logprobs=widen(lp * 0.5),
        **kw,
    )
    a, b = compute_advantages(name, base), compute_advantages(name, padded)
    close(b.advantages[:, :-pad], a.advantages)
    assert torch.equal(b.advantages[:, -pad:], torch.zeros(14, pad, dtype=F64))
    if a.returns is not None:
        close(b.returns[:, :-pad], a.returns)
    assert b.metrics == pytest.approx(a.metrics, rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------------------- validation


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as e:
        compute_advantages("ppo", two_groups())
    for name in ("dr_grpo", "gae", "grpo", "opd", "reinforce", "rloo"):
        assert name in str(e.value)
    assert set(ADVANTAGES.names()) == {"dr_grpo", "gae", "grpo", "opd", "reinforce", "rloo"}


def test_mask_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(2,\)"):
        AdvantageInputs(t64([1.0, 2.0]), torch.ones(3, 4, dtype=torch.bool))


@pytest.mark.parametrize("field", ["token_rewards", "values", "logprobs", "teacher_logprobs"])
def test_token_field_shape_mismatch_names_both_shapes(field):
    with pytest.raises(ValueError, match=rf"{field}.*\(2, 3\).*\(2, 4\)"):
        AdvantageInputs(
            t64([1.0, 2.0]), torch.ones(2, 4, dtype=torch.bool), **{field: torch.zeros(2, 3, dtype=F64)}
        )


def test_group_ids_and_valid_shape_mismatch():
    with pytest.raises(ValueError, match=r"group_ids.*\(3,\).*\(2,\)"):
        AdvantageInputs(
            t64([1.0, 2.0]), torch.ones(2, 4, dtype=torch.bool), group_ids=torch.zeros(3, dtype=torch.long)
        )
    with pytest.raises(ValueError, match=r"valid.*\(1,\).*\(2,\)"):
        AdvantageInputs(
            t64([1.0, 2.0]), torch.ones(2, 4, dtype=torch.bool), valid=torch.ones(1, dtype=torch.bool)
        )


def test_dtype_errors():
    ones = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(TypeError, match="mask"):
        AdvantageInputs(t64([1.0, 2.0]), ones.long())
    with pytest.raises(TypeError, match="group_ids"):
        AdvantageInputs(t64([1.0, 2.0]), ones, group_ids=t64([0.0, 1.0]))
    with pytest.raises(TypeError, match="valid"):
        AdvantageInputs(t64([1.0, 2.0]), ones, valid=torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="rewards"):
        AdvantageInputs(torch.tensor([1, 0]), ones)


def test_non_finite_on_valid_rows_rejected():
    ones = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"rewards.*\[1\]"):
        AdvantageInputs(t64([1.0, NAN]), ones)
    with pytest.raises(ValueError, match="token_rewards"):
        AdvantageInputs(t64([1.0, 0.0]), ones, token_rewards=t64([[0.0, math.inf], [0.0, 0.0]]))
    # the same NaN is fine once the row is marked invalid
    AdvantageInputs(
        t64([1.0, NAN]), ones, valid=torch.tensor([T_, F_]), token_rewards=t64([[0.0, 0.0], [NAN, math.inf]])
    )


@pytest.mark.parametrize("kw", [{"gamma": 1.5}, {"gamma": -0.1}, {"lam": 2.0}, {"eps": -1.0}])
def test_hyperparameter_ranges(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        AdvantageInputs(t64([1.0]), torch.ones(1, 2, dtype=torch.bool), **kw)
