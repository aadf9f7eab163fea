"""Unit tests of the health-check triggers (pure logic, hand-built metric sequences) and of the
per-Experience health metrics."""

import math
import warnings

import pytest
import torch

from lit_rl.callbacks._health import (
    HealthChecks,
    Latch,
    LengthBlowupCheck,
    RewardHackingCheck,
    ThresholdCheck,
)


def _fired(check, seq, key):
    """Steps at which ``check`` fired for the readings ``seq`` of ``key`` (None = metric absent)."""
    steps = []
    for i, v in enumerate(seq):
        ev = check.update(i, {} if v is None else {key: v})
        steps += [(i, e.check) for e in ev]
    return steps


def test_latch_fires_on_rising_edge_only_and_rearms():
    latch = Latch()
    got = [latch.update(c) for c in (False, True, True, None, True, False, True)]
    assert got == [False, True, False, False, False, False, True]


def test_entropy_collapse_fires_once_per_episode_and_rearms():
    c = ThresholdCheck("entropy", "actor/entropy", low=0.1, high=5.0)
    seq = [1.0, 0.05, 0.01, 0.02, 0.5, 0.09, 0.2]
    assert _fired(c, seq, "actor/entropy") == [(1, "entropy_low"), (5, "entropy_low")]


def test_entropy_explosion_is_its_own_episode():
    c = ThresholdCheck("entropy", "actor/entropy", low=0.1, high=5.0)
    seq = [1.0, 6.0, 7.0, 0.05, 6.5, 2.0, 5.5]
    # 3: a collapse reading also ends the explosion episode (0.05 <= high), so 6.5 at step 4 fires again
    assert _fired(c, seq, "actor/entropy") == [
        (1, "entropy_high"),
        (3, "entropy_low"),
        (4, "entropy_high"),
        (6, "entropy_high"),
    ]


def test_threshold_boundary_is_not_trouble_and_missing_or_nan_keeps_state():
    c = ThresholdCheck("is_weight", "is/max_weight", high=100.0)
    # exactly at the threshold is fine; None / NaN neither fire nor re-arm; inf is a spike
    seq = [100.0, 150.0, None, float("nan"), 200.0, 3.0, math.inf]
    assert _fired(c, seq, "is/max_weight") == [(1, "is_weight_high"), (6, "is_weight_high")]


def test_threshold_message_names_value_bound_and_step():
    c = ThresholdCheck("is_weight", "is/max_weight", high=100.0, what="max importance weight")
    (e,) = c.update(7, {"is/max_weight": 1400.0})
    assert (e.check, e.step, e.value) == ("is_weight_high", 7, 1400.0)
    assert "1400" in e.message and "100" in e.message and "step 7" in e.message


def test_threshold_config_errors():
    with pytest.raises(ValueError, match="at least one"):
        ThresholdCheck("x", "k")
    with pytest.raises(ValueError, match="low=2.0 must be < high=1.0"):
        ThresholdCheck("x", "k", low=2.0, high=1.0)


def test_length_blowup_baseline_is_ema_and_warmup_gates():
    c = LengthBlowupCheck(factor=2.0, warmup=3, decay=0.5)
    # readings 10, 10, 10 -> baseline 10; 19 (not > 20) -> baseline 0.5*10 + 0.5*19 = 14.5
    for i, v in enumerate([10.0, 10.0, 10.0, 19.0]):
        assert c.update(i, {"rollout/response_len_mean": v}) == []
    assert c.baseline == 14.5
    # 29 is exactly 2x14.5: not a blow-up; baseline -> 21.75
    assert c.update(4, {"rollout/response_len_mean": 29.0}) == []
    assert c.baseline == 21.75
    (e,) = c.update(5, {"rollout/response_len_mean": 43.6})
    assert e.check == "length_blowup" and e.step == 5


def test_length_blowup_no_fire_during_warmup():
    c = LengthBlowupCheck(factor=2.0, warmup=3, decay=0.5)
    assert _fired(c, [10.0, 100.0, 1000.0], "rollout/response_len_mean") == []


def test_length_blowup_once_per_episode_baseline_frozen_then_rearms():
    c = LengthBlowupCheck(factor=2.0, warmup=2, decay=0.5)
    seq = [10.0, 10.0, 25.0, 40.0, 60.0, 12.0, 21.0]
    # 25 > 20 fires; 40, 60 stay in the episode with the baseline frozen at 10 (an unfrozen EMA would have
    # reached 17.5 then 28.75 and ended the episode); 12 ends it (baseline -> 11); 21 > 2*11=22? no
    assert _fired(c, seq, "rollout/response_len_mean") == [(2, "length_blowup")]
    assert c.baseline == 0.5 * 11.0 + 0.5 * 21.0
    (e,) = c.update(7, {"rollout/response_len_mean": 40.0})
    assert e.check == "length_blowup"


def test_length_config_errors():
    with pytest.raises(ValueError, match="factor"):
        LengthBlowupCheck(factor=1.0)
    with pytest.raises(ValueError, match="warmup"):
        LengthBlowupCheck(warmup=0)
    with pytest.raises(ValueError, match="decay"):
        LengthBlowupCheck(decay=1.0)


def _hack(train, heldout_at, window=4, hw=2, rise=0.05, drop=0.05):
    """Run the reward-hacking check; ``heldout_at`` maps step -> held-out value added before that step."""
    c = RewardHackingCheck(window, hw, rise, drop)
    fired = []
    for i, r in enumerate(train):
        if i in heldout_at:
            c.add_heldout(heldout_at[i])
        fired += [(i, e.check) for e in c.update(i, {"reward/mean": r})]
    return c, fired


def test_reward_hacking_trends_hand_computed():
    c, _ = _hack([0.1, 0.2, 0.4, 0.5], {0: 0.8, 3: 0.6})
    rise, drop = c.trends()
    # rise = (0.4 + 0.5)/2 - (0.1 + 0.2)/2 = 0.3 ; drop = 0.8 - 0.6 = 0.2
    assert rise == pytest.approx(0.3, rel=1e-12) and drop == pytest.approx(0.2, rel=1e-12)


def test_reward_hacking_odd_window_skips_middle():
    c, _ = _hack([0.0, 0.1, 9.0, 0.3, 0.4], {0: 0.5, 1: 0.5}, window=5)
    assert c.trends()[0] == pytest.approx((0.3 + 0.4) / 2 - (0.0 + 0.1) / 2, rel=1e-12)


def test_reward_hacking_fires_once_and_rearms():
    train = [0.1, 0.2, 0.4, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.8, 0.9, 1.0]
    heldout = {0: 0.8, 3: 0.6, 8: 0.7, 10: 0.5}
    _, fired = _hack(train, heldout)
    # step 3: windows full, rise 0.3, drop 0.2 -> fire; 4..7 still rising and held-out still falling: quiet;
    # step 8: held-out recovers (0.6 -> 0.7, drop -0.1): the episode has ended; step 10: held-out falls
    # again (0.7 -> 0.5, drop 0.2) while train rises (window [0.7, 0.7, 0.8, 0.9]: rise 0.15) -> fire
    assert fired == [(3, "reward_hacking"), (10, "reward_hacking")]


def test_reward_hacking_needs_both_signals():
    # train rises but held-out rises too: no warning; held-out falls but train flat: no warning
    assert _hack([0.1, 0.2, 0.4, 0.5], {0: 0.5, 2: 0.7})[1] == []
    assert _hack([0.5, 0.5, 0.5, 0.5], {0: 0.9, 2: 0.1})[1] == []
    # windows not full (only one held-out point): silent
    assert _hack([0.1, 0.2, 0.4, 0.5], {0: 0.9})[1] == []


def test_reward_hacking_config_errors():
    with pytest.raises(ValueError, match="window"):
        RewardHackingCheck(window=1)
    with pytest.raises(ValueError, match="heldout_window"):
        RewardHackingCheck(heldout_window=1)
    with pytest.raises(ValueError, match="min_rise"):
        RewardHackingCheck(min_rise=-1.0)


def _suite():
    return HealthChecks(
        {
            "entropy": ThresholdCheck("entropy", "actor/entropy", low=0.1),
            "length": LengthBlowupCheck(2.0, 1, 0.5),
            "hack": RewardHackingCheck(2, 2, 0.0, 0.0),
        }
    )


def test_health_checks_state_round_trip_continues_exactly():
    seq = [
        {"actor/entropy": 1.0, "rollout/response_len_mean": 10.0, "reward/mean": 0.1},
        {"actor/entropy": 0.05, "rollout/response_len_mean": 30.0, "reward/mean": 0.2},
        {"actor/entropy": 0.04, "rollout/response_len_mean": 31.0, "reward/mean": 0.3},
        {"actor/entropy": 0.5, "rollout/response_len_mean": 10.0, "reward/mean": 0.4},
        {"actor/entropy": 0.05, "rollout/response_len_mean": 50.0, "reward/mean": 0.5},
    ]
    full = _suite()
    full.checks["hack"].add_heldout(0.9)
    full.checks["hack"].add_heldout(0.5)
    ref = [[e.check for e in full.update(i, m)] for i, m in enumerate(seq)]
    assert ref == [
        [],
        ["entropy_low", "length_blowup", "reward_hacking"],
        [],
        [],
        ["entropy_low", "length_blowup"],
    ]
    a = _suite()
    a.checks["hack"].add_heldout(0.9)
    a.checks["hack"].add_heldout(0.5)
    first = [[e.check for e in a.update(i, m)] for i, m in enumerate(seq[:2])]
    b = _suite()
    b.load_state_dict(a.state_dict())
    rest = [[e.check for e in b.update(i + 2, m)] for i, m in enumerate(seq[2:])]
    assert first + rest == ref
    assert [e.check for e in b.events] == [e.check for e in full.events]


def test_experience_health_metrics_hand_computed():
    from lit_rl.callbacks.monitoring import experience_health_metrics
    from lit_rl.data.experience import Experience

    B, P, C = 6, 2, 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor(
        [
            [0.5, 0.5, 0.0],
            [0.0, 9.0, 9.0],  # row 1: nonzero only on padding -> zero-adv
            [1e-9, -1e-9, 0.0],
            [-0.3, -0.3, 0.0],
            [0.0] * 3,
            [2.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    exp = Experience(
        input_ids=torch.zeros(B, P + C, dtype=torch.long),
        attention_mask=torch.ones(B, P + C, dtype=torch.long),
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0, float("nan"), 0.5], dtype=torch.float64),
        valid=torch.tensor([True, True, True, True, False, True]),
        policy_version=torch.zeros(B, dtype=torch.long),
        advantages=adv,
        domains=["math", "math", "code", "code", "math", "code"],
    )
    m = experience_health_metrics(exp)
    assert m["health/zero_adv_frac"] == pytest.approx(3 / 6, rel=1e-12)  # rows 1, 2, 4
    # group 0 rewards {1, 0} informative; group 1 {1, 1} flat; group 2 one valid row -> zero variance
    assert m["health/zero_var_group_frac"] == pytest.approx(2 / 3, rel=1e-12)
    assert m["health/invalid_frac"] == pytest.approx(1 / 6, rel=1e-6)
    assert m["reward/domain/math"] == pytest.approx(0.5, rel=1e-12)  # rows 0, 1 (row 4 invalid)
    assert m["reward/domain/code"] == pytest.approx(2.5 / 3, rel=1e-12)
    # loop reference of the zero-advantage rule
    ref = sum(all(abs(float(adv[b, t])) <= 1e-8 for t in range(C) if mask[b, t]) for b in range(B)) / B
    assert m["health/zero_adv_frac"] == pytest.approx(ref, rel=1e-12)


def test_group_without_valid_rows_counts_as_zero_variance():
    from lit_rl.callbacks.monitoring import experience_health_metrics
    from lit_rl.data.experience import Experience

    exp = Experience(
        input_ids=torch.zeros(4, 3, dtype=torch.long),
        attention_mask=torch.ones(4, 3, dtype=torch.long),
        loss_mask=torch.ones(4, 1, dtype=torch.bool),
        prompt_len=2,
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor([float("nan"), float("nan"), 0.0, 1.0]),
        valid=torch.tensor([False, False, True, True]),
        policy_version=torch.zeros(4, dtype=torch.long),
    )
    m = experience_health_metrics(exp)
    assert m["health/zero_var_group_frac"] == 0.5 and m["health/invalid_frac"] == 0.5
    assert "health/zero_adv_frac" not in m  # no advantages yet: not reported


def test_monitor_warns_through_rank_zero_warn_once_per_episode():
    from lit_rl.callbacks.monitoring import RLHealthMonitor, RLHealthWarning

    mon = RLHealthMonitor(entropy_min=0.1, entropy_max=5.0, max_is_weight=100.0)

    class T:  # the trainer attributes the monitor reads
        def __init__(self):
            self.callbacks, self.global_step, self.callback_metrics = [], 0, {}

    class Mod:
        def __init__(self):
            self.logged = {}

        def log(self, k, v, **kw):
            self.logged[k] = v

    class Batch:
        experience = None

    t, mod, b = T(), Mod(), Batch()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for i, (ent, w) in enumerate([(1.0, 2.0), (0.05, 1400.0), (0.04, 1500.0), (1.0, 1.0), (0.01, 1.0)]):
            t.callback_metrics = {"actor/entropy": torch.tensor(ent), "is/max_weight": torch.tensor(w)}
            b.metrics = {"reward/mean": 0.5}
            # not a lit_rl learner (callbacks/_learner.py: rl_iteration): the step is the trainer's global step
            t.global_step = i
            mon.on_train_batch_end(t, mod, None, b, i)
    health = [str(r.message) for r in rec if issubclass(r.category, RLHealthWarning)]
    assert len(health) == 3
    assert "entropy" in health[0] and "step 1" in health[0]
    assert "importance" in health[1] and "1400" in health[1]
    assert "entropy" in health[2] and "step 4" in health[2]
    assert mod.logged["health/warnings"] == 3.0
