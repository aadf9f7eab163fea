"""Held-out explained variance accumulated over validation batches equals the global value (not a mean of
per-batch values, which is biased low for small batches)."""

import torch

from lit_rl.callbacks.eval import _ev_from_sums
from lit_rl.core.value import explained_variance


def _sums(r, v):
    e = r - v
    return torch.stack(
        [torch.tensor(float(len(r)), dtype=torch.float64), r.sum(), (r * r).sum(), e.sum(), (e * e).sum()]
    )


def test_ev_from_sums_equals_the_global_explained_variance():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(40, generator=g, dtype=torch.float64)
    v = r + 0.3 * torch.randn(40, generator=g, dtype=torch.float64)
    mask = torch.ones(1, 40, dtype=torch.bool)
    whole = explained_variance(v[None], r[None], mask)
    split = _ev_from_sums(_sums(r[:7], v[:7]) + _sums(r[7:], v[7:]))
    assert abs(split - whole) <= 1e-12
    per_batch_mean = (
        7 * explained_variance(v[None, :7], r[None, :7], mask[:, :7])
        + 33 * explained_variance(v[None, 7:], r[None, 7:], mask[:, 7:])
    ) / 40
    assert abs(per_batch_mean - whole) > 1e-3  # the estimator this replaces is a different number
    assert (
        _ev_from_sums(_sums(torch.ones(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64))) == 0.0
    )
