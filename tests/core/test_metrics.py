"""``core.metrics``: each metric's reduction is declared, not guessed from its name."""

from __future__ import annotations

import pytest

from lit_rl.core.metrics import METRICS, Metric, MetricRegistry


@pytest.mark.parametrize("reduce, expect", [("mean", 2.5), ("max", 4.5), ("min", 1.0), ("sum", 7.5)])
def test_declared_reduction_folds_values(reduce, expect):
    reg = MetricRegistry([Metric("x/y", reduce)])
    assert reg.reduce_fx("x/y") == reduce
    assert reg.reduce("x/y", [1.0, 2.0, 4.5]) == expect


def test_undeclared_metric_is_averaged_even_when_its_name_contains_max_or_min():
    # a reward component named "maximal_format" or "admin" is no extreme
    for name in ("reward/maximal_format", "reward/admin", "actor/entropy"):
        assert METRICS.reduce_fx(name) == "mean"
        assert METRICS.reduce(name, [1.0, 2.0, 6.0]) == 3.0


def test_policy_module_extremes_are_declared():
    assert METRICS.reduce("is/max_weight", [1.0, 7.5, 2.0]) == 7.5
    assert METRICS.reduce("actor/ratio_min", [0.9, 0.4]) == 0.4
    assert METRICS.reduce("actor/ratio_max", [0.9, 1.4]) == 1.4
    declared = METRICS.declared()
    assert {k for k, v in declared.items() if v == "max"} >= {
        "adv/max",
        "async/staleness_max",
        "rollout/response_len_max",
        "response_length/max",
    }
    assert declared["adv/min"] == "min"


def test_bad_declarations_name_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"reduce='median'; valid values: mean, max, min, sum"):
        Metric("x/y", "median")
    reg = MetricRegistry([Metric("x/y", "max")])
    reg.declare(Metric("x/y", "max"))  # the same declaration again is fine
    with pytest.raises(ValueError, match="already declared with reduce='max'"):
        reg.declare(Metric("x/y", "min"))
    with pytest.raises(ValueError, match="no values"):
        reg.reduce("x/y", [])
