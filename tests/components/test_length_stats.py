"""Completion-length statistics (TRL's completions/min_length, mean_length, max_length, mean_terminated_length),
hand-computed in float64."""

import math

import pytest
import torch

from lit_rl.rollout.stats import completion_length_stats


def test_min_mean_max_and_stopped_only():
    lens = torch.tensor(
        [3, 5, 0, 7, 2]
    )  # a row of length 0: EOS as the first token stops with no token trained
    reasons = ["stop", "length", "stop", "length", "stop"]
    m = completion_length_stats(lens, reasons)
    assert (m["rollout/response_len_min"], m["rollout/response_len_max"]) == (0.0, 7.0)
    assert m["rollout/response_len_mean"] == pytest.approx(17 / 5, rel=1e-15, abs=0)
    # stopped rows only: 3, 0, 2 (the two cut at the budget are left out)
    assert (m["rollout/response_len_stopped_min"], m["rollout/response_len_stopped_max"]) == (0.0, 3.0)
    assert m["rollout/response_len_stopped_mean"] == pytest.approx(5 / 3, rel=1e-15, abs=0)
    assert [m[f"response_length/{k}"] for k in ("min", "mean", "max")] == [
        m[f"rollout/response_len_{k}"] for k in ("min", "mean", "max")
    ]


def test_mean_is_float64_for_long_batches():
    # 2**24 + 1 is not a float32: a float32 mean of [2**24 + 1, 2**24 + 2] would be 2**24 + 2
    m = completion_length_stats(torch.tensor([2**24 + 1, 2**24 + 2]), ["stop", "stop"])
    assert m["rollout/response_len_mean"] == 2**24 + 1.5


def test_no_stopped_row_is_nan_not_zero():
    m = completion_length_stats(torch.tensor([4.0, 4.0]), ["length", "length"])
    assert all(math.isnan(m[f"rollout/response_len_stopped_{k}"]) for k in ("min", "mean", "max"))
    assert m["rollout/response_len_mean"] == 4.0


def test_lengths_and_reasons_must_match():
    with pytest.raises(ValueError, match="3 lengths but 2 finish reasons"):
        completion_length_stats(torch.tensor([1, 2, 3]), ["stop", "stop"])
