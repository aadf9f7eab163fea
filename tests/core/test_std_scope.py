"""``std_scope`` of the grpo estimator (TRL's ``scale_rewards``): ``batch`` divides the group-centred rewards
by the unbiased std of every valid row of the (global) batch. Float64, hand-computed; one test per branch."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.advantages import AdvantageInputs, compute_advantages

F64 = torch.float64
EPS = 1e-6
T_, F_ = True, False
# group 0: rewards 1, 0, 0.5 (mean 0.5); group 7: rewards 2, 4 (mean 3). Batch: mean 1.5, squared deviations
# 0.25 + 2.25 + 1 + 0.25 + 6.25 = 10, unbiased variance 10 / 4 = 2.5.
REWARDS = [1.0, 0.0, 0.5, 2.0, 4.0]
GROUPS = torch.tensor([0, 0, 0, 7, 7])
MASK = torch.tensor([[T_, T_, T_], [T_, F_, F_], [T_, T_, F_], [T_, T_, T_], [T_, F_, F_]])
CENTRED = [0.5, -0.5, 0.0, -1.0, 1.0]


def _rows(row_adv):
    return torch.where(MASK, torch.tensor(row_adv, dtype=F64)[:, None], torch.zeros((), dtype=F64))


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_batch_scope_divides_by_the_batch_std():
    out = compute_advantages(
        "grpo", AdvantageInputs(torch.tensor(REWARDS, dtype=F64), MASK, GROUPS, std_scope="batch")
    )
    _close(out.advantages, _rows([a / (math.sqrt(2.5) + EPS) for a in CENTRED]))
    assert out.metrics["adv/batch_std"] == pytest.approx(math.sqrt(2.5), rel=1e-12)


def test_group_scope_is_the_default_and_divides_by_each_groups_std():
    out = compute_advantages("grpo", AdvantageInputs(torch.tensor(REWARDS, dtype=F64), MASK, GROUPS))
    stds = [0.5, 0.5, 0.5, math.sqrt(2), math.sqrt(2)]  # group 0: sqrt(0.5 / 2); group 7: sqrt(2 / 1)
    _close(out.advantages, _rows([a / (s + EPS) for a, s in zip(CENTRED, stds)]))
    assert "adv/batch_std" not in out.metrics


def test_batch_scope_without_std_normalize_is_only_centred():
    out = compute_advantages(
        "grpo", AdvantageInputs(torch.tensor(REWARDS, dtype=F64), MASK, GROUPS, std_normalize=False)
    )
    _close(out.advantages, _rows(CENTRED))


def test_batch_std_is_over_all_ranks_through_reduce():
    """Another rank holds rewards 3 and 5: reduce adds its (n, Σr, Σr²) = (2, 8, 34). Global batch: n = 7,
    Σr = 15.5, Σr² = 55.25, unbiased variance (55.25 − 15.5² / 7) / 6 = 146.5 / 42. The group means stay
    local."""
    seen = []

    def reduce(t):
        seen.append(t.clone())
        return t + torch.tensor([2.0, 8.0, 34.0], dtype=t.dtype)

    out = compute_advantages(
        "grpo",
        AdvantageInputs(torch.tensor(REWARDS, dtype=F64), MASK, GROUPS, std_scope="batch", reduce=reduce),
    )
    _close(
        seen[0], torch.tensor([5.0, 7.5, 21.25], dtype=F64)
    )  # this rank's n, Σr, Σr² = 1 + 0 + 0.25 + 4 + 16
    std = math.sqrt(146.5 / 42)
    _close(out.advantages, _rows([a / (std + EPS) for a in CENTRED]))


def test_invalid_rows_stay_out_of_the_batch_std():
    """Row 1 invalid (NaN reward): group 0 is then {1, 0.5} (mean 0.75), the batch {1, 0.5, 2, 4}: mean 1.875,
    squared deviations 0.765625 + 1.890625 + 0.015625 + 4.515625 = 7.1875, variance 7.1875 / 3."""
    r = torch.tensor([1.0, math.nan, 0.5, 2.0, 4.0], dtype=F64)
    valid = torch.tensor([T_, F_, T_, T_, T_])
    out = compute_advantages("grpo", AdvantageInputs(r, MASK, GROUPS, valid=valid, std_scope="batch"))
    std = math.sqrt(7.1875 / 3)
    _close(
        out.advantages,
        _rows([0.25 / (std + EPS), 0.0, -0.25 / (std + EPS), -1 / (std + EPS), 1 / (std + EPS)]),
    )


def test_unknown_scope_names_the_field_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"std_scope='global'; valid values: group, batch"):
        AdvantageInputs(torch.tensor(REWARDS, dtype=F64), MASK, GROUPS, std_scope="global")


def test_policy_config_refuses_batch_scope_without_std_normalize():
    from lit_rl.learners.config import PolicyConfig

    with pytest.raises(ValueError, match="std_scope='batch'.*std_normalize is false"):
        PolicyConfig.of("m", tiny_if_missing={}, std_scope="batch", std_normalize=False).validate()
    with pytest.raises(ValueError, match=r"std_scope='per_group'; valid values: group, batch"):
        PolicyConfig.of("m", tiny_if_missing={}, std_scope="per_group").validate()
