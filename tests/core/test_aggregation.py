"""Hand-computed tests for lit_rl.core.aggregation (float64, rtol 1e-12 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.aggregation import (
    AGG_MODES,
    aggregate,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

F64 = torch.float64
T_, F_ = True, False


def close(actual, expected, rtol=1e-12, atol=1e-12):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=rtol, atol=atol
    )


@pytest.fixture
def batch():
    # row 0: 2 tokens, row 1: empty, row 2: 3 tokens. NaN sits in masked slots and must never leak.
    v = torch.tensor(
        [[1.0, 2.0, 3.0, math.nan], [math.nan, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]], dtype=F64
    )
    m = torch.tensor([[T_, T_, F_, F_], [F_, F_, F_, F_], [T_, T_, T_, F_]])
    return v, m


# ------------------------------------------------------------------------------------------ helpers


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
    m = torch.tensor([[T_, T_, F_], [T_, F_, F_], [F_, F_, F_]])
    close(masked_sum(x, m), 7.0)
    close(masked_sum(x, m, dim=1), [3.0, 4.0, 0.0])
    close(masked_sum(x, m, dim=0), [5.0, 2.0, 0.0])
    close(masked_mean(x, m), 7.0 / 3.0)
    close(masked_mean(x, m, dim=1), [1.5, 4.0, 0.0])  # empty row -> 0, not NaN


def test_masked_var_population_and_unbiased():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64)
    m = torch.tensor([[T_, T_, F_], [T_, F_, F_]])
    # values 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9
    close(masked_var(x, m), 42.0 / 9.0 / 3.0)
    close(masked_var(x, m, unbiased=True), 42.0 / 9.0 / 2.0)
    close(masked_var(x, m, dim=1), [0.25, 0.0])
    close(masked_var(x, m, dim=1, unbiased=True), [0.5, 0.0])  # single element -> 0, not NaN


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, math.nan], [4.0, 5.0, 6.0]], dtype=F64)
    m = torch.tensor([[T_, T_, F_], [T_, F_, F_]])
    mu, var = 7.0 / 3.0, 14.0 / 9.0
    s = math.sqrt(var + 1e-8)
    exp = torch.tensor([[(1 - mu) / s, (2 - mu) / s, 0.0], [(4 - mu) / s, 0.0, 0.0]], dtype=F64)
    close(masked_whiten(x, m), exp)
    exp_keep = torch.where(m, exp + mu, torch.zeros((), dtype=F64))
    close(masked_whiten(x, m, shift_mean=False), exp_keep)


# ---------------------------------------------------------------------------------------- aggregate


def test_token_mean(batch):
    v, m = batch
    close(aggregate(v, m, "token_mean"), (1 + 2 + 9 + 10 + 11) / 5)


def test_seq_mean_token_mean_skips_empty_rows(batch):
    v, m = batch
    close(aggregate(v, m, "seq_mean_token_mean"), (1.5 + 10.0) / 2)  # 2 non-empty rows, not 3


def test_seq_mean_token_sum(batch):
    v, m = batch
    close(aggregate(v, m, "seq_mean_token_sum"), (3.0 + 30.0) / 2)


def test_seq_mean_token_sum_norm_default_and_explicit_horizon(batch):
    v, m = batch
    close(aggregate(v, m, "seq_mean_token_sum_norm"), (3.0 / 4 + 30.0 / 4) / 2)
    close(aggregate(v, m, "seq_mean_token_sum_norm", horizon=10), (0.3 + 3.0) / 2)


def test_gradients_are_finite_and_exact(batch):
    v, m = batch
    v = v.clone().requires_grad_(True)
    aggregate(v, m, "token_mean").backward()
    close(v.grad, m.to(F64) / 5)
    v.grad = None
    aggregate(v, m, "seq_mean_token_mean").backward()
    exp = torch.tensor([[0.25, 0.25, 0, 0], [0, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]], dtype=F64)
    close(v.grad, exp)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_masked_returns_zero_with_grad_path(mode):
    v = torch.tensor([[1.0, math.nan], [3.0, 4.0]], dtype=F64, requires_grad=True)
    m = torch.zeros(2, 2, dtype=torch.bool)
    out = aggregate(v, m, mode)
    assert out.shape == ()
    close(out.detach(), 0.0)
    out.backward()  # must not raise: the zero still depends on v
    close(v.grad, torch.zeros(2, 2, dtype=F64))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_counts_sum_to_full_batch(batch, mode):
    v, m = batch
    full = aggregate(v, m, mode, horizon=4)
    n_tok, n_seq = int(m.sum()), int(m.any(dim=1).sum())
    # micro-batch 1: rows 0-1 trimmed to 2 columns; micro-batch 2: row 2 with its 4 columns
    p1 = aggregate(v[:2, :2], m[:2, :2], mode, horizon=4, num_tokens=n_tok, num_seqs=n_seq)
    p2 = aggregate(v[2:], m[2:], mode, horizon=4, num_tokens=n_tok, num_seqs=n_seq)
    close(p1 + p2, full)
    # without the global counts the mean of local results is wrong for token_mean (2 vs 3 tokens)
    if mode == "token_mean":
        local = (aggregate(v[:2, :2], m[:2, :2], mode) + aggregate(v[2:], m[2:], mode)) / 2
        assert not torch.isclose(local, full)


def test_num_tokens_accepts_tensor(batch):
    v, m = batch
    close(aggregate(v, m, "token_mean", num_tokens=torch.tensor(10)), 33 / 10)
    close(aggregate(v, m, "seq_mean_token_sum", num_seqs=torch.tensor(4.0)), 33 / 4)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_padding_invariance(batch, mode):
    v, m = batch
    pad_v = torch.cat([v, torch.full((3, 5), math.nan, dtype=F64)], dim=1)  # (B, T + 5)
    pad_m = torch.cat([m, torch.zeros(3, 5, dtype=torch.bool)], dim=1)
    close(aggregate(pad_v, pad_m, mode, horizon=4), aggregate(v, m, mode, horizon=4))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_vectorised_matches_python_loop(mode):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(7, 9, generator=g, dtype=F64)
    m = torch.rand(7, 9, generator=g) < 0.5
    m[3] = False  # one empty row
    rows = []
    for i in range(7):
        toks = [float(v[i, t]) for t in range(9) if m[i, t]]
        if not toks:
            continue
        if mode == "token_mean":
            rows.append(toks)
        elif mode == "seq_mean_token_mean":
            rows.append(sum(toks) / len(toks))
        elif mode == "seq_mean_token_sum":
            rows.append(sum(toks))
        else:
            rows.append(sum(toks) / 9)
    if mode == "token_mean":
        flat = [x for r in rows for x in r]
        expected = sum(flat) / len(flat)
    else:
        expected = sum(rows) / len(rows)
    close(aggregate(v, m, mode), expected)


# ------------------------------------------------------------------------------------------- errors


def test_unknown_mode_lists_valid_modes(batch):
    v, m = batch
    with pytest.raises(ValueError) as e:
        aggregate(v, m, "seq_sum")
    for mode in AGG_MODES:
        assert mode in str(e.value)


def test_non_bool_mask_rejected(batch):
    v, m = batch
    with pytest.raises(TypeError, match="mask"):
        aggregate(v, m.to(F64), "token_mean")
    with pytest.raises(TypeError, match="mask"):
        masked_mean(v, m.long())


def test_shape_mismatch_names_both_shapes(batch):
    v, m = batch
    with pytest.raises(ValueError, match=r"\(3, 3\).*\(3, 4\)"):
        aggregate(v, m[:, :3], "token_mean")


@pytest.mark.parametrize("kw", [{"num_tokens": 0}, {"num_seqs": -2}, {"horizon": 0}])
def test_bad_denominators_rejected(batch, kw):
    v, m = batch
    with pytest.raises(ValueError):
        aggregate(v, m, "seq_mean_token_sum_norm" if "horizon" in kw else "token_mean", **kw)
    if "num_seqs" in kw:
        with pytest.raises(ValueError, match="num_seqs"):
            aggregate(v, m, "seq_mean_token_mean", **kw)
