"""``std_scope: batch`` through ``PolicyAssembly.compute_advantages``: the batch std is taken over every
rank's valid rows (the assembly hands the estimator its all-reduce), so two ranks divide by the same global
std. A stub trainer stands in for a second rank (its reduce adds that rank's (n, Σr, Σr²)); float64,
hand-computed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from lit_rl.data.experience import Experience
from lit_rl.learners.assembly import PolicyAssembly
from lit_rl.learners.config import PolicyConfig

F64 = torch.float64


class _Module(PolicyAssembly):
    device = torch.device("cpu")

    def active_loss_terms(self) -> list:  # no loss term: nothing adds advantage metrics or bootstrap rows
        return []

    def __init__(self, world_size: int, other_rank=(0.0, 0.0, 0.0)):
        self.config = PolicyConfig.of("m", std_scope="batch")
        self.reduced = []

        def reduce(t, reduce_op):
            self.reduced.append(reduce_op)
            return t + torch.tensor(other_rank, dtype=t.dtype)

        self._trainer = SimpleNamespace(world_size=world_size, strategy=SimpleNamespace(reduce=reduce))


def _exp():
    # rank 0: one group, rewards 1, 3 (mean 2); one completion token each
    return Experience(
        input_ids=torch.ones((2, 3), dtype=torch.long),
        attention_mask=torch.ones((2, 3)),
        loss_mask=torch.ones((2, 1), dtype=torch.bool),
        prompt_len=2,
        group_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.tensor([1.0, 3.0], dtype=F64),
        valid=torch.ones(2, dtype=torch.bool),
        policy_version=torch.zeros(2, dtype=torch.long),
    )


def test_one_process_divides_by_its_own_batch_std():
    m, e = _Module(world_size=1), _exp()
    m.compute_advantages(e)
    std = math.sqrt(2.0)  # rewards 1, 3: unbiased variance 2
    torch.testing.assert_close(
        e.advantages,
        torch.tensor([[-1 / (std + 1e-6)], [1 / (std + 1e-6)]], dtype=F64),
        rtol=1e-12,
        atol=1e-12,
    )
    assert m.reduced == []


def test_two_ranks_divide_by_the_global_batch_std():
    """Rank 1 holds rewards 5, 7 (n 2, Σr 12, Σr² 74). Global: n 4, Σr 16, Σr² 84, unbiased variance
    (84 − 64) / 3 = 20 / 3; rank 0's group mean stays 2."""
    m, e = _Module(world_size=2, other_rank=(2.0, 12.0, 74.0)), _exp()
    m.compute_advantages(e)
    std = math.sqrt(20 / 3)
    torch.testing.assert_close(
        e.advantages,
        torch.tensor([[-1 / (std + 1e-6)], [1 / (std + 1e-6)]], dtype=F64),
        rtol=1e-12,
        atol=1e-12,
    )
    assert m.reduced == ["sum"]
