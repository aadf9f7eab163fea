"""Deferred old log-probs (``lit_rl/learners/old_logprobs.py``): with several optimizer steps per iteration and
nothing reading log π_old at rollout time, the training step forwards only the rows a later step reads (signal
rows, less the first step's when each row trains once), and the iteration is the same as with the full pass in
``on_experience``: every step's gradient and the final weights equal (float64, <= 1e-12), with real SGD steps
in between (step 2's ratios are then off 1, so a denominator taken after step 1 would show). Ranks with fewer
rows pad with zero-weight forwards (a sharded forward is a collective)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from lit_rl.core.signal_rows import old_logprob_rows
from tests._float64 import float64_rmsnorm

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True, scope="module")
def _rmsnorm_float64():
    with float64_rmsnorm():  # the one float32 step of the tiny qwen2: no rounding flips between batch shapes
        yield


def test_old_logprob_rows_by_hand():
    first = [0, 3, 5, 6]
    assert old_logprob_rows(8, None, first, epochs=1) == [1, 2, 4, 7]  # every row trains: all but step 1's
    assert old_logprob_rows(8, None, first, epochs=2) == list(range(8))  # epoch 2 reads step 1's rows too
    assert old_logprob_rows(8, [6, 1, 3], first, epochs=1) == [1]
    assert old_logprob_rows(8, [6, 1, 3], first, epochs=2) == [1, 3, 6]
    assert old_logprob_rows(8, [], first, epochs=1) == []


def _conformance():
    sys.path.insert(0, str(HERE / "conformance"))
    import _conformance
    from signal_rows_runner import no_signal_in_group_1

    return _conformance, no_signal_in_group_1


class Reader(L.Callback):
    """An ExperienceHook (as reference KL or a teacher): with one, log π_old is computed in ``on_experience``."""

    def on_experience(self, trainer, module, exp) -> None:
        assert exp.old_logprobs is not None and exp.old_logprobs.shape == exp.loss_mask.shape


def _sgd(c):
    class SGD(c.NoStep):
        """NoStep's recorded gradients, and a real step: the later steps' weights differ from the rollout's."""

        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-0.5)

    return SGD


def _iteration(tiny_model_dir, hook: bool, **kw):
    c, no_signal_in_group_1 = _conformance()
    module = c.build_module("grpo", str(tiny_model_dir), loss_agg="token_mean", micro_batch_size=2, **kw)
    module.optimizer_factory = _sgd(c)
    rows: list[int] = []
    pair = module.old_logprobs_pair
    module.old_logprobs_pair = lambda micro: rows.append(micro.batch_size) or pair(micro)
    grads = c.run_step(module, no_signal_in_group_1(module), callbacks=[Reader()] if hook else [])
    weights = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return [c.flat(g) for g in grads], weights, rows, module


# the two branches of old_logprob_rows: signal rows less the first step's (1 epoch), every row (2 epochs)
@pytest.mark.parametrize(("skip", "epochs"), [(None, 1), (False, 2)], ids=["skip-1", "every_row-2"])
def test_deferred_pass_gives_the_same_iteration(tiny_model_dir, skip, epochs):
    kw = {"minibatch_size": 4, "ppo_epochs": epochs, "skip_zero_advantage_rows": skip}
    full = _iteration(tiny_model_dir, hook=True, **kw)
    deferred = _iteration(tiny_model_dir, hook=False, **kw)
    c, _ = _conformance()
    assert sum(full[2]) == 8  # every row in on_experience
    first = torch.randperm(8, generator=torch.Generator().manual_seed(deferred[3].seed))[:4].tolist()
    signal = [0, 1, 2, 3] if skip is None else None  # group 1 has no GRPO signal
    want = old_logprob_rows(8, signal, first, epochs)
    assert sum(deferred[2]) == len(want)
    assert (len(want) == 8) == (skip is False and epochs == 2)  # else fewer rows than the full pass
    assert len(full[0]) == len(deferred[0]) == 2 * epochs
    moved = 0
    for step, (a, b) in enumerate(zip(full[0], deferred[0])):  # a minibatch of group 1 alone: no gradient
        assert c.max_rel_diff(b, a) <= 1e-12 if float(a.abs().max()) > 0 else torch.equal(a, b), step
        moved += float(a.abs().max()) > 0 and step > 0
    assert moved  # a step after the first, on moved weights, had a gradient
    start = torch.cat(
        [p.detach().reshape(-1) for p in c.build_module("grpo", str(tiny_model_dir)).parameters()]
    )
    assert c.max_rel_diff(full[1], start.double()) > 1e-6  # the steps moved the weights
    assert c.max_rel_diff(deferred[1], full[1]) <= 1e-12


def test_a_rank_without_rows_pads_the_deferred_pass(tiny_model_dir, tmp_path):
    """2 DDP ranks, 4 rows each, minibatches of 2 (micro-batches of 1): rank 0's group has signal, so its
    deferred pass forwards the 2 signal rows outside its first step; rank 1 has none and runs 2 zero-weight
    forwards to match (under FSDP / ZeRO-3 a missing forward would hang the other rank)."""
    _conformance()  # tests/conformance on sys.path
    from signal_rows_runner import run_ranks

    out = tmp_path / "g.pt"
    run_ranks(out, tiny_model_dir, 2, "null", "2")
    old = [json.loads(Path(f"{out}.old{k}.json").read_text()) for k in range(2)]
    assert old == [[1, 1], [0, 0]]
