"""``MetricRegistry.reduce_ranks``: every rank's logged dict folded into one, NaN / missing values skipped.

PolicyModule gathers each rank's metrics once per iteration and reduces them here, instead of one Lightning
all-reduce per logged name: a name NaN on one rank only (no stopped row there) was skipped by that rank alone,
so the ranks' all-reduces paired up wrongly (gloo aborted with a size mismatch; tests/test_distributed.py).
"""

import math

from lit_rl.core.metrics import METRICS


def test_reduce_ranks_skips_nan_and_missing_values_with_declared_reductions():
    r0 = {
        "loss/policy": 0.5,
        "rollout/response_len_stopped_max": math.nan,
        "actor/ratio_max": 1.25,
        "only_rank0": 3.0,
    }
    r1 = {"loss/policy": 0.25, "rollout/response_len_stopped_max": 7.0, "actor/ratio_max": 1.5}
    r2 = {"loss/policy": 1.0, "rollout/response_len_stopped_max": 5.0, "actor/ratio_max": 1.0}
    got = METRICS.reduce_ranks([r0, r1, r2])
    assert list(got) == ["loss/policy", "rollout/response_len_stopped_max", "actor/ratio_max", "only_rank0"]
    assert got["loss/policy"] == (0.5 + 0.25 + 1.0) / 3  # undeclared: mean
    assert got["rollout/response_len_stopped_max"] == 7.0  # declared max, over the ranks that have one
    assert got["actor/ratio_max"] == 1.5
    assert got["only_rank0"] == 3.0
    assert math.isnan(METRICS.reduce_ranks([{"x": math.nan}, {"x": math.nan}])["x"])  # no rank has it
