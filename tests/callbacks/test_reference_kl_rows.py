"""``ReferenceKL(where="reward")`` penalises every valid row that enters the group statistics (issue 28 §6b).

Group estimators score a row as r_i = reward_i + Σ_t token_rewards_{i,t} over every *valid* row, including rows
the overlong filter made untrainable. The KL penalty must then be in all of them (TRL / veRL: KL-in-reward on
every response token), not only in the trainable ones, or a filtered row looks better to its group than its
penalised groupmates. Invalid rows (no reward) stay untouched. Float64, hand-computed.
"""

import math

import pytest
import torch

from lit_rl.callbacks.reference_kl import ReferenceKL
from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule


def _experience() -> Experience:
    """4 rows of one group: row 0 trainable, row 1 valid but filtered (trainable False), row 2 invalid, row 3
    trainable with 2 of 4 tokens generated."""
    B, P, C = 4, 3, 4
    ids = torch.randint(5, 40, (B, P + C), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.ones(B, C, dtype=torch.bool)
    loss_mask[3, 2:] = False
    att = torch.ones(B, P + C, dtype=torch.long)
    att[3, P + 2 :] = 0
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss_mask,
        prompt_len=P,
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.tensor([1.0, 1.0, float("nan"), 0.0], dtype=torch.float64),
        valid=torch.tensor([True, True, False, True]),
        policy_version=torch.zeros(B, dtype=torch.long),
        trainable=torch.tensor([True, False, True, True]),
    )


@pytest.mark.parametrize("kind, k", [("k1", 0.25), ("k3", math.exp(-0.25) - 1 + 0.25)])
def test_reward_kl_applies_to_every_valid_row_of_the_group(tiny_model_dir, kind, k):
    mod = PolicyModule(model=str(tiny_model_dir))
    mod.model.double()  # the reference follows the policy's dtype: float64 throughout
    cb = ReferenceKL(kind=kind, where="reward", beta=0.1)
    exp = _experience()
    cb.ref = cb.build_reference(mod)
    ref = cb.reference_logprobs(mod, exp).double()
    exp.rollout_logprobs = ref + 0.25  # log r = -0.25 on every token
    cb.on_experience(None, mod, exp)
    pen = -0.1 * k
    expected = torch.tensor([[pen] * 4, [pen] * 4, [0.0] * 4, [pen, pen, 0.0, 0.0]], dtype=torch.float64)
    assert exp.token_rewards.dtype == torch.float64
    torch.testing.assert_close(exp.token_rewards, expected, rtol=1e-12, atol=1e-15)
    # kl/mean's statistic: the 10 penalised tokens (rows 0, 1, 3), the filtered row's four included
    assert cb._kl_count == 10 and cb._kl_sum == pytest.approx(10 * k, rel=1e-12)
    # the group statistics see the penalty of the filtered row as of its groupmates: r_i = reward_i + Σ_t pen
    out = compute_advantages(
        "rloo",
        AdvantageInputs(
            rewards=exp.rewards,
            mask=exp.loss_mask,
            group_ids=exp.group_ids,
            token_rewards=exp.token_rewards,
            valid=exp.valid,
        ),
    )
    r = {0: 1.0 + 4 * pen, 1: 1.0 + 4 * pen, 3: 0.0 + 2 * pen}  # valid rows' scores
    # RLOO: A_i = r_i − mean of the other valid rows' r (arXiv 2402.14740)
    for i in (0, 3):
        others = [v for j, v in r.items() if j != i]
        assert float(out.advantages[i, 0]) == pytest.approx(r[i] - sum(others) / len(others), rel=1e-12)
