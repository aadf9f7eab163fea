"""``WarmupLinearDecay`` (lit_rl/learners/schedules.py), TRL's default schedule: the closed form per branch
(warmup by steps, by ratio, none; decay to 0 and to a floor), transformers'
``get_linear_schedule_with_warmup`` as a second reference, the input errors, and a restored state taking T and
W from the loading run."""

from __future__ import annotations

import pytest
import torch

from lit_rl.learners import WarmupLinearDecay


def _lrs(factory, steps: int, base: float = 1.0) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=base)
    sched = factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_steps_then_linear_decay_to_zero_then_flat():
    # T = 6, W = 2: t/2 for t < 2, then (6 - t) / 4: 0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0
    got = _lrs(lambda o: WarmupLinearDecay(o, total_steps=6, warmup_steps=2), 8)
    assert got == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0], abs=1e-15)


def test_warmup_ratio_rounds_up_like_transformers():
    # T = 10, ratio 0.15: W = ceil(1.5) = 2; then (10 - t) / 8
    got = _lrs(lambda o: WarmupLinearDecay(o, total_steps=10, warmup_ratio=0.15), 5, base=2e-3)
    assert got == pytest.approx([0.0, 1e-3, 2e-3, 2e-3 * 7 / 8, 2e-3 * 6 / 8], abs=1e-18)


def test_no_warmup_starts_at_the_base_and_min_ratio_floors_it():
    # T = 4, m = 0.2: 0.2 + 0.8 (4 - t) / 4 = 1, 0.8, 0.6, 0.4, 0.2, 0.2
    got = _lrs(lambda o: WarmupLinearDecay(o, total_steps=4, min_ratio=0.2), 6)
    assert got == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2], abs=1e-15)


def test_ratio_near_one_warms_up_over_all_steps():
    # T = 2, ratio 0.9: W = ceil(1.8) = 2 = T, so 0, 0.5, then the end value 0 (no division by T - W = 0)
    assert _lrs(lambda o: WarmupLinearDecay(o, total_steps=2, warmup_ratio=0.9), 3) == [0.0, 0.5, 0.0]


def test_equals_transformers_linear_schedule_with_warmup():
    from transformers import get_linear_schedule_with_warmup

    ours = _lrs(lambda o: WarmupLinearDecay(o, total_steps=13, warmup_steps=3), 15, base=1e-6)
    theirs = _lrs(lambda o: get_linear_schedule_with_warmup(o, 3, 13), 15, base=1e-6)
    assert ours == pytest.approx(theirs, abs=1e-21)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"total_steps": 0}, "total_steps"),
        ({"total_steps": 3.0}, "total_steps"),
        ({"total_steps": 4, "warmup_ratio": 1.0}, "warmup_ratio"),
        ({"total_steps": 4, "warmup_ratio": -0.1}, "warmup_ratio"),
        ({"total_steps": 4, "warmup_steps": 4}, "warmup_steps"),
        ({"total_steps": 4, "warmup_steps": 0.5}, "warmup_steps"),
        ({"total_steps": 4, "warmup_steps": 1, "warmup_ratio": 0.1}, "warmup_ratio"),
        ({"total_steps": 4, "min_ratio": 2.0}, "min_ratio"),
    ],
)
def test_bad_settings_name_the_field(kw, field):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=f"WarmupLinearDecay {field}="):
        WarmupLinearDecay(opt, **kw)


def test_state_is_the_step_count_and_a_longer_run_continues_from_it():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    first = WarmupLinearDecay(opt, total_steps=4, warmup_steps=1)
    for _ in range(4):
        opt.step()
        first.step()
    state = first.state_dict()
    assert opt.param_groups[0]["lr"] == 0.0 and not {"total_steps", "warmup", "min_ratio"} & set(state)
    opt2 = torch.optim.SGD([p], lr=1.0)
    opt2.load_state_dict(opt.state_dict())  # the restored lr is the old run's 0.0
    longer = WarmupLinearDecay(opt2, total_steps=8, warmup_steps=1)
    longer.load_state_dict(state)
    assert longer.last_epoch == 4
    assert opt2.param_groups[0]["lr"] == pytest.approx(4 / 7, abs=1e-15)  # (8 - 4) / (8 - 1), not 0.0
    same = WarmupLinearDecay(torch.optim.SGD([p], lr=1.0), total_steps=4, warmup_steps=1)
    same.load_state_dict(state)
    assert same.optimizer.param_groups[0]["lr"] == 0.0  # bitwise the saved run's value when T agrees
