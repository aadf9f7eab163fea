"""Hand-computed tests of the adaptive KL (Ziegler et al. 2019) and adaptive entropy controllers."""

import math

import pytest

from lit_rl.core.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    FixedController,
    adaptive_entropy_update,
    adaptive_kl_update,
)

TOL = {"rel": 1e-12, "abs": 0.0}


# ------------------------------------------------------------------ adaptive KL, one test per branch
def test_kl_above_target_raises_beta():
    # e = 0.11/0.1 - 1 = 0.1 (inside the clip); beta = 0.1 * (1 + 0.1 * 2 / 10) = 0.102
    assert adaptive_kl_update(0.1, 0.11, 0.1, horizon=10, n_steps=2) == pytest.approx(0.102, **TOL)


def test_kl_far_above_target_is_clipped():
    # e = 0.5/0.1 - 1 = 4 -> clipped to 0.2; beta = 0.1 * (1 + 0.2 * 2 / 10) = 0.104
    assert adaptive_kl_update(0.1, 0.5, 0.1, horizon=10, n_steps=2) == pytest.approx(0.104, **TOL)


def test_kl_below_target_lowers_beta():
    # e = 0.095/0.1 - 1 = -0.05; beta = 0.1 * (1 - 0.05 * 2 / 10) = 0.099
    assert adaptive_kl_update(0.1, 0.095, 0.1, horizon=10, n_steps=2) == pytest.approx(0.099, **TOL)


def test_kl_far_below_target_is_clipped():
    # e = 0/0.1 - 1 = -1 -> clipped to -0.2; beta = 0.1 * (1 - 0.2 * 2 / 10) = 0.096
    assert adaptive_kl_update(0.1, 0.0, 0.1, horizon=10, n_steps=2) == pytest.approx(0.096, **TOL)


def test_kl_on_target_keeps_beta():
    assert adaptive_kl_update(0.3, 0.25, 0.25, horizon=7, n_steps=5) == 0.3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kl": math.nan}, "kl must be finite"),
        ({"beta": -1.0}, "beta must be >= 0"),
        ({"target": 0.0}, "target KL must be > 0"),
        ({"horizon": 0.0}, "horizon must be > 0"),
        ({"clip": -0.1}, "clip must be >= 0"),
    ],
)
def test_kl_update_rejects_bad_input(kwargs, match):
    args = {"beta": 0.1, "kl": 0.1, "target": 0.1, "horizon": 10.0, "n_steps": 1, "clip": 0.2} | kwargs
    with pytest.raises(ValueError, match=match):
        adaptive_kl_update(**args)


def test_kl_controller_state_round_trip():
    c = AdaptiveKLController(0.1, target=0.1, horizon=10)
    c.update(0.11, n_steps=2)
    assert c.value == pytest.approx(0.102, **TOL)
    c.update(0.0, n_steps=2)  # 0.102 * 0.96
    assert c.value == pytest.approx(0.09792, **TOL)
    d = AdaptiveKLController(0.5, target=0.1, horizon=10)
    d.load_state_dict(c.state_dict())
    assert d.value == c.value
    assert d.update(0.11, 2) == c.update(0.11, 2)


# ------------------------------------------------------------- adaptive entropy, one test per branch
BAND = {"low": 1.0, "high": 2.0, "step": 0.01, "coef_min": 0.0, "coef_max": 0.1}


def test_entropy_below_band_raises_coef():
    assert adaptive_entropy_update(0.05, 0.5, **BAND) == pytest.approx(0.06, **TOL)


def test_entropy_above_band_lowers_coef():
    assert adaptive_entropy_update(0.05, 2.5, **BAND) == pytest.approx(0.04, **TOL)


@pytest.mark.parametrize("h", [1.0, 1.5, 2.0])  # band edges included: no change
def test_entropy_inside_band_keeps_coef(h):
    assert adaptive_entropy_update(0.05, h, **BAND) == 0.05


def test_entropy_coef_bounded_above_and_below():
    assert adaptive_entropy_update(0.095, 0.5, **BAND) == 0.1
    assert adaptive_entropy_update(0.005, 2.5, **BAND) == 0.0


def test_negative_coef_min_turns_bonus_into_penalty():
    assert adaptive_entropy_update(0.0, 3.0, **(BAND | {"coef_min": -0.1})) == pytest.approx(-0.01, **TOL)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"entropy": math.inf}, "entropy must be finite"),
        ({"low": 3.0}, "low <= high"),
        ({"step": -1.0}, "step must be >= 0"),
        ({"coef_min": 0.2}, "coef_min=0.2 must be <= coef_max"),
    ],
)
def test_entropy_update_rejects_bad_input(kwargs, match):
    args = {"coef": 0.05, "entropy": 1.5} | BAND | kwargs
    with pytest.raises(ValueError, match=match):
        adaptive_entropy_update(**args)


def test_entropy_controller_sequence_and_state():
    c = AdaptiveEntropyController(0.05, **BAND)
    seq = [c.update(h) for h in (0.5, 0.5, 1.5, 2.5, 2.5, 2.5)]
    assert seq == pytest.approx([0.06, 0.07, 0.07, 0.06, 0.05, 0.04], **TOL)
    d = AdaptiveEntropyController(0.0, **BAND)
    d.load_state_dict(c.state_dict())
    assert d.value == c.value
    with pytest.raises(ValueError, match="init_coef=0.5 must lie in"):
        AdaptiveEntropyController(0.5, **BAND)


def test_fixed_controller_never_moves():
    c = FixedController(0.2)
    assert c.update(123.0, 9) == 0.2 and c.state_dict() == {"value": 0.2}
