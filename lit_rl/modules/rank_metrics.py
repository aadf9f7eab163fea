"""One iteration's metrics reduced over ranks in one pass, NaN-aware.

Logging each metric with Lightning's ``sync_dist`` runs one barrier + all-reduce per metric *that a rank logs*.
A rank whose value is NaN (e.g. ``rollout/response_len_stopped_mean`` when none of its rows stopped) cannot log
it, so the ranks then ran different numbers of collectives: values paired with other metrics' values (silently
wrong numbers), and the next collective that is not a scalar all-reduce (the agreement of
``callbacks/_agree.py``, a gradient all-reduce) waited forever. Here every rank reduces the same sorted keys in
four collectives (the union of the ranks' keys, then sums, maxima, minima), and a NaN or a missing key is "no
value on this rank": a mean is over the ranks that have one, max / min ignore it, a sum counts it as 0; a metric
no rank has stays unlogged.
"""
from __future__ import annotations

import math

import torch

from lit_rl.core.metrics import METRICS


def reduce_over_ranks(strategy, metrics: dict[str, float], device) -> dict[str, float]:
    """``metrics`` of every rank reduced with each key's declared reduction (``core.metrics``); a key a rank lacks
    counts as NaN there. A collective: every rank calls it once per iteration. Returns the keys with a value."""
    import torch.distributed as dist

    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(metrics))  # the union: rows of the tensors below mean the same key
    keys = sorted(set().union(*names))
    v = torch.tensor([float(metrics.get(k, math.nan)) for k in keys], dtype=torch.float64, device=device)  # (K,)
    ok = ~torch.isnan(v)
    sums = strategy.reduce(torch.stack([torch.where(ok, v, 0.0), ok.double()]), reduce_op="sum")  # (2, K)
    hi = strategy.reduce(torch.where(ok, v, -math.inf), reduce_op="max")  # (K,)
    lo = -strategy.reduce(torch.where(ok, -v, -math.inf), reduce_op="max")  # min as max of negatives (K,)
    out = {}
    for i, k in enumerate(keys):
        n = float(sums[1, i])
        if n == 0:
            continue
        fx = METRICS.reduce_fx(k)
        out[k] = (float(hi[i]) if fx == "max" else float(lo[i]) if fx == "min" else
                  float(sums[0, i]) if fx == "sum" else float(sums[0, i]) / n)
    return out
