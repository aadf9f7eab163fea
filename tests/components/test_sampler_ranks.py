"""The prompt sampler cuts one global stream across ranks: W ranks × b prompts == 1 rank × W·b prompts."""

import itertools

from torch.utils.data import DistributedSampler

from lit_rl.data.datamodule import _InfiniteShuffle


def _take(sampler, k):
    return list(itertools.islice(iter(sampler), k))


def test_two_ranks_partition_the_single_rank_stream_batch_by_batch():
    n, b, steps = 13, 4, 7  # 13 prompts: global batches straddle pass boundaries (reshuffles)
    single = _take(_InfiniteShuffle(n, seed=3, batch_size=2 * b), 2 * b * steps)
    r0 = _take(_InfiniteShuffle(n, seed=3, batch_size=b, rank=0, world_size=2), b * steps)
    r1 = _take(_InfiniteShuffle(n, seed=3, batch_size=b, rank=1, world_size=2), b * steps)
    for s in range(steps):
        assert single[2 * b * s : 2 * b * (s + 1)] == r0[b * s : b * (s + 1)] + r1[b * s : b * (s + 1)]


def test_each_pass_is_a_permutation_and_position_resumes():
    s = _InfiniteShuffle(10, seed=0, batch_size=5)
    first = _take(s, 10)
    assert sorted(first) == list(range(10))
    nxt = _take(s, 5)  # iter() continues from pos (the checkpointed state)
    fresh = _InfiniteShuffle(10, seed=0, batch_size=5)
    fresh.pos = 10
    assert _take(fresh, 5) == nxt
    assert isinstance(s, DistributedSampler)  # so Lightning never wraps (and materialises) it
