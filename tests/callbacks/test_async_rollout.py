"""Asynchronous rollouts (``RolloutCallback(mode="async")``): staleness bound, sync equivalence at k=0,
producer failures, construction errors, and learning with max_staleness=2 + TIS."""

from __future__ import annotations

import random
import threading
import time

import lightning as L
import pytest
import torch
from _learning import record, seed

from lit_rl.callbacks import HeldoutEval, RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.learners import PolicyModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.async_producer import AsyncProducer, ProducerError, Slot, split_fresh, staleness
from lit_rl.rollout.engine import HFEngine, SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9, "unary": True}


# ------------------------------------------------------------------ helpers
class Recorder(L.Callback):
    """Place after the RolloutCallback: records every trained Experience's staleness and the logged metrics."""

    def __init__(self):
        self.staleness: list[torch.Tensor] = []
        self.metrics: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rc = next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))
        learner = rc._producer.learner_version if rc._producer is not None else rc.engine.policy_version
        self.staleness.append(learner - batch.experience.policy_version)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def _lr(p):
    return torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0)


def _fit(
    model_dir,
    steps,
    mode="sync",
    k=1,
    engine=None,
    group_size=8,
    batch_size=8,
    extra=(),
    rc_kw=None,
    task=TASK,
    **policy_kw,
):
    L.seed_everything(seed(0))
    module = PolicyModule(model=str(model_dir), optimizer=_lr, **policy_kw)
    rc = RolloutCallback(
        engine=engine,
        rewards={"exact": ExactAnswerReward()},
        group_size=group_size,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=1),
        mode=mode,
        max_staleness=k,
        **(rc_kw or {}),
    )
    rec = Recorder()
    dm = PromptDataModule(task="addition", task_args=task, batch_size=batch_size)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, rec, *extra],
    )
    trainer.fit(module, datamodule=dm)
    return module, rc, rec


# ------------------------------------------------------------ pure queue logic
def test_staleness_arithmetic_and_split():
    slots = [Slot(i, v, None, 0.0) for i, v in enumerate([5, 4, 3, 2, 7])]
    fresh, stale = split_fresh(slots, learner_version=5, max_staleness=2)
    assert staleness(5, 3) == 2 and staleness(7, 7) == 0
    assert [s.version for s in fresh] == [5, 4, 3, 7]  # staleness 0, 1, 2, -2 (a newer item is fine)
    assert [s.version for s in stale] == [2]  # staleness 3 > 2


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_producer_thread_never_hands_out_too_stale_items_over_thousands(k):
    """Real producer thread and queue, thousands of items, random production times, random push schedules
    (weights pushed after some iterations, not others) and random drops: every item taken is within k pushes
    of the learner."""
    rng = random.Random(k)
    applied: list[int] = []

    def produce(n):
        if rng.random() < 0.05:
            time.sleep(0.0005)  # jitter the interleaving
        return n

    prod = AsyncProducer(produce, lambda w, v: applied.append(v), max_staleness=k, capacity=k + 1)
    prod.start()
    worst, taken = 0, []
    try:
        for _ in range(3000):
            slot, _ = prod.get()
            taken.append(slot.payload)
            s = staleness(prod.learner_version, slot.version)
            worst = max(worst, s)
            assert s <= k, (slot, prod.learner_version)
            if (
                rng.random() < 0.1
            ):  # the trainer drops it (takes no iteration): the gate lets one more run ahead
                prod.skip()
                continue
            if rng.random() < 0.7:  # like sync_every > 1: not every iteration pushes
                prod.push_weights([("w", torch.zeros(1))])
            prod.end_iteration()
    finally:
        prod.stop()
    assert taken == list(range(3000))  # in production order, nothing lost or duplicated
    assert applied == sorted(applied)  # snapshots load in version order
    if k > 0:
        assert worst == k  # the bound is reached (the producer really runs ahead), never exceeded


def test_producer_k0_waits_for_each_push():
    log = []
    prod = AsyncProducer(
        lambda n: log.append(("produce", n)) or n,
        lambda w, v: log.append(("load", v)),
        max_staleness=0,
        capacity=1,
    )
    prod.start()
    try:
        for i in range(5):
            slot, _ = prod.get()
            assert slot.version == i == slot.payload
            time.sleep(0.01)  # the producer must not start item i+1 meanwhile
            assert prod.produced == i + 1
            prod.push_weights([("w", torch.zeros(1))])
            prod.end_iteration()
    finally:
        prod.stop()
    assert log[:6] == [("produce", 0), ("load", 1), ("produce", 1), ("load", 2), ("produce", 2), ("load", 3)]


def test_push_weights_is_a_snapshot():
    got = {}
    prod = AsyncProducer(lambda n: n, lambda w, v: got.update(w), max_staleness=0, capacity=1)
    w = torch.ones(3)
    prod.push_weights([("w", w)])
    w.add_(5.0)  # the learner keeps training in place
    prod.apply_pending()
    assert torch.equal(got["w"], torch.ones(3))


def test_collective_load_waits_for_the_item_in_flight_and_labels_the_next_with_its_version():
    """``load_weights_now`` (the trainer thread's load for engines shared across ranks): the load happens only
    after the item being generated finished (no request runs while the servers reload), no new item starts
    before it, and the item after it carries the new version; the producer itself never loads anything."""
    in_item0, release = threading.Event(), threading.Event()
    loads, box = [], []

    def produce(n):
        if n == 0:
            in_item0.set()
            assert release.wait(30)
        return n

    prod = AsyncProducer(
        produce,
        lambda w, v: loads.append((v, prod.produced, threading.current_thread().name)),
        max_staleness=1,
        capacity=4,
    )
    prod.start()
    try:
        assert in_item0.wait(30)
        t = threading.Thread(
            target=lambda: box.append(prod.load_weights_now([("w", torch.ones(1))])), name="trainer"
        )
        t.start()
        t.join(0.3)
        assert (
            t.is_alive() and loads == []
        )  # item 0 is still generating: the load must wait (cannot pass early)
        release.set()
        t.join(30)
        assert box == [1] and prod.learner_version == prod.engine_version == 1
        # loaded by the trainer thread, after item 0 and before item 1 (which the gate admits at once: k=1)
        assert loads == [(1, 1, "trainer")]
        slots = [prod.get()[0] for _ in range(2)]
        assert [(s.index, s.version) for s in slots] == [(0, 0), (1, 1)]
    finally:
        release.set()
        prod.stop()


def test_producer_exception_is_raised_in_get():
    def produce(n):
        if n == 2:
            raise KeyError("boom")
        return n

    prod = AsyncProducer(produce, lambda w, v: None, max_staleness=5, capacity=5)
    prod.start()
    got = []
    with pytest.raises(ProducerError, match="boom") as e:
        for _ in range(4):
            got.append(prod.get()[0].payload)
    assert isinstance(e.value.__cause__, KeyError)
    assert got == [0, 1][: len(got)]  # items before the failure may be handed out first; never a stall
    assert not prod.alive


# ------------------------------------------------------------ real training
def _comparable(ms: list[dict[str, float]]) -> list[dict[str, float]]:
    """Everything but wall-clock timings and the async-only bookkeeping."""
    skip = ("perf/", "async/")
    return [{k: v for k, v in m.items() if not k.startswith(skip)} for m in ms]


def test_max_staleness_0_reproduces_sync_exactly(tiny_model_dir):
    """Same seed: every logged metric of every step (rewards, losses, grad norms, entropy, IS weights, ...) and
    the final parameters are bit-identical between sync and async with max_staleness=0.

    Both use the same engine configuration (a private weight copy, ``share_weights=False``, which async
    requires). Sync with ``share_weights=True`` differs from either in the last float bits of the rollout
    log-probs (~1e-7), an HFEngine property unrelated to async."""
    kw = {"steps": 5, "rollout_correction": "tis", "correction_cap": 2.0}
    m_sync, _, r_sync = _fit(tiny_model_dir, mode="sync", engine=HFEngine(share_weights=False), **kw)
    m_async, rc, r_async = _fit(tiny_model_dir, mode="async", k=0, **kw)
    a, b = _comparable(r_sync.metrics), _comparable(r_async.metrics)
    assert len(a) == len(b) == 5
    assert a == b
    # over the run: a step whose rows all have zero advantage forwards none of them (skip_zero_advantage_rows),
    # so it computes no importance weights; the steps that train log them
    assert {"reward/mean", "actor/grad_norm", "is/max_weight", "is/clipped_frac"} <= set().union(*a)
    for (n, p), (_, q) in zip(m_sync.model.named_parameters(), m_async.model.named_parameters()):
        assert torch.equal(p, q), n
    assert all(int(s.max()) == 0 for s in r_async.staleness)
    last = r_async.metrics[-1]
    assert last["async/staleness_max"] == 0.0 and last["async/dropped"] == 0.0
    assert rc._producer is None  # stopped at train end


def test_async_run_never_trains_a_row_beyond_max_staleness(tiny_model_dir):
    """Thousands of trained rows (30 iterations x 128 rows) with k=2: every row's staleness <= 2, the bound is
    reached, every async metric is logged, and the engine trained on snapshots, not the live weights."""
    module, rc, rec = _fit(
        tiny_model_dir, steps=30, mode="async", k=2, group_size=16, batch_size=8, rollout_correction="tis"
    )
    stale = torch.cat(rec.staleness)
    assert stale.numel() == 30 * 128
    assert int(stale.max()) <= 2 and int(stale.min()) >= 0
    assert int(stale.max()) == 2  # the producer really ran ahead
    keys = {
        "async/staleness_mean",
        "async/staleness_max",
        "async/dropped",
        "async/trainer_wait_s",
        "async/producer_wait_s",
    }
    assert keys <= set(rec.metrics[-1])
    assert rc.engine.model is not module.model
    assert rc.state_dict()["async"]["version"] == 30  # one push per iteration (sync_every=1)


class FailingEngine(HFEngine):
    """A real HFEngine whose third generation raises (a crashed inference server, an OOM, ...)."""

    def __init__(self):
        super().__init__(share_weights=False)
        self.calls = 0

    def generate(self, prompt_ids, n, sampling):
        self.calls += 1
        if self.calls == 3:
            raise MemoryError("engine fell over")
        return super().generate(prompt_ids, n, sampling)


def test_producer_failure_surfaces_in_the_trainer_within_one_step(tiny_model_dir):
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="engine fell over") as e:
        _fit(tiny_model_dir, steps=50, mode="async", k=1, engine=FailingEngine(), rollout_correction="tis")
    assert isinstance(e.value.__cause__, MemoryError)
    assert time.perf_counter() - t0 < 60  # never a silent stall
    assert not any(t.name == "lit_rl-rollout-producer" for t in threading.enumerate())


def _rc(**kw):
    return RolloutCallback(rewards=ExactAnswerReward(), group_size=4, **kw)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"mode": "asynch"}, "mode"),
        ({"mode": "async", "max_staleness": -1}, "max_staleness"),
        ({"mode": "async", "queue_size": 3}, "queue_size"),  # < one group (4 rows), so < one iteration
        ({"mode": "async", "stale_policy": "keep"}, "stale_policy"),
        ({"mode": "async", "engine": HFEngine(share_weights=True)}, "share_weights"),
    ],
)
def test_bad_async_config_fails_at_construction(kw, field):
    with pytest.raises(ValueError, match=field) as e:
        _rc(**kw)
    if field not in ("max_staleness", "queue_size", "share_weights"):
        assert "valid values" in str(e.value)


def test_async_defaults_to_a_snapshot_engine_and_sync_to_shared_weights():
    assert _rc(mode="async").engine.share_weights is False
    assert _rc().engine.share_weights is True


def test_queue_smaller_than_one_iteration_fails_before_training(tiny_model_dir):
    with pytest.raises(ValueError, match=r"queue_size=12 rows is smaller than one iteration \(32 rows"):
        _fit(tiny_model_dir, steps=1, mode="async", group_size=4, batch_size=8, rc_kw={"queue_size": 12})


def test_async_with_curriculum_is_rejected(tiny_model_dir):
    from lit_rl.callbacks import Curriculum

    with pytest.raises(ValueError, match="Curriculum"):
        _fit(tiny_model_dir, steps=1, mode="async", extra=[Curriculum()])


def test_async_state_dict_round_trip():
    rc = _rc(mode="async")
    rc._async_state.update(version=7, prompt_pos=112, dropped=32, regenerated=0)
    state = rc.state_dict()
    other = _rc(mode="async")
    other.load_state_dict(state)
    assert other._async_state == {"version": 7, "prompt_pos": 112, "dropped": 32, "regenerated": 0}


class ExtraPush(L.Callback):
    """Before the RolloutCallback: once the producer has started the next item, push the weights one extra
    time (a version change outside the admission gate), which makes that item 2 pushes stale at k=1."""

    def __init__(self, at_steps):
        self.at_steps = set(at_steps)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rc = next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))
        prod = rc._producer
        if batch_idx not in self.at_steps:
            return
        while (
            prod.produced - prod.skipped < prod.finished + 2
        ):  # item `finished + 1` has started, with the current weights
            time.sleep(0.005)
        from lit_rl.models.loading import merged_state_items

        rc._async_state["version"] = prod.push_weights(merged_state_items(pl_module.model))


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_too_stale_experiences_are_dropped_or_regenerated_and_counted(tiny_model_dir, policy):
    L.seed_everything(0)
    module = PolicyModule(model=str(tiny_model_dir), optimizer=_lr, rollout_correction="tis")
    rc = RolloutCallback(
        rewards=ExactAnswerReward(),
        group_size=4,
        mode="async",
        max_staleness=1,
        stale_policy=policy,
        sampling=SamplingConfig(max_new_tokens=1),
    )
    rec = Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ExtraPush(at_steps=[1, 3]), rc, rec],
    )
    trainer.fit(module, datamodule=PromptDataModule(task="addition", task_args=TASK, batch_size=4))
    assert all(int(s.max()) <= 1 for s in rec.staleness)  # nothing beyond the bound was trained on
    last = rec.metrics[-1]
    done, other = ("dropped", "regenerated") if policy == "drop" else ("regenerated", "dropped")
    assert last[f"async/{done}"] == 2 * 16  # two Experiences of 4 prompts x 4 samples
    assert last[f"async/{other}"] == 0
    assert len(rec.staleness) == 6 and all(len(s) == 16 for s in rec.staleness)


@pytest.mark.vllm
def test_async_with_vllm_engine(tiny_model_dir):
    """VLLMEngine holds its own weights, so it serves async mode directly: generation and weight loads run in
    the producer thread; rows stay within the bound and the importance weights are sane."""
    from lit_rl.rollout.vllm import VLLMEngine

    engine = VLLMEngine(
        max_model_len=96, kv_cache_memory_bytes=32 << 20, sync_timeout_s=60, llm_kwargs={"block_size": 32}
    )
    try:
        module, _, rec = _fit(
            tiny_model_dir,
            steps=4,
            mode="async",
            k=1,
            engine=engine,
            group_size=4,
            batch_size=4,
            rollout_correction="tis",
            correction_cap=2.0,
        )
    finally:
        engine.close()
    assert module.iteration == 4
    assert all(int(s.max()) <= 1 for s in rec.staleness)
    last = rec.metrics[-1]
    assert 0.0 <= last["rollout/logprob_mismatch_kl"] < 0.1  # policy drift of <= 1 update, not garbage
    assert 0.0 < last["is/max_weight"] < float("inf")


@pytest.mark.slow  # 200 iterations: minutes on 2 cores
def test_async_staleness_2_with_tis_learns_the_quickstart_task(tiny_model_dir):
    """The quickstart task (three tally-mark operands, GRPO, 16 prompts x 16 samples, lr 1e-3) in async mode with
    max_staleness=2 and token-level TIS (cap 2): held-out greedy accuracy rises by >= 30 points and the
    training reward clearly rises, while rows really are up to 2 versions old. Async runs are not bit-
    reproducible for k > 0 (which snapshot generates which batch depends on thread timing); observed peaks:
    0.36-0.82 held-out accuracy at 200 steps."""
    ev = HeldoutEval(every_n_steps=25)
    _, _, rec = _fit(
        tiny_model_dir,
        steps=200,
        mode="async",
        k=2,
        group_size=16,
        batch_size=16,
        extra=[ev],
        task={**TASK, "num_operands": 3},
        rollout_correction="tis",
        correction_level="token",
        correction_cap=2.0,
    )
    acc = [h["eval/accuracy"] for h in ev.history]
    reward = [m["reward/mean"] for m in rec.metrics]
    record(
        "async/staleness2_tis",
        acc_first=acc[0],
        acc_best=max(acc[1:]),
        reward_first20=sum(reward[:20]) / 20,
        reward_last20=sum(reward[-20:]) / 20,
    )
    assert acc[0] <= 0.15, acc  # a random-init model cannot do the task
    assert max(acc[1:]) >= acc[0] + 0.30, acc
    assert sum(reward[-20:]) / 20 >= sum(reward[:20]) / 20 + 0.3, reward
    assert max(int(s.max()) for s in rec.staleness) == 2
    assert "is/max_weight" in rec.metrics[-1] and "is/clipped_frac" in rec.metrics[-1]


def test_prompt_stream_matches_the_training_loader_and_resumes_mid_stream():
    from lit_rl.rollout.async_producer import PromptStream

    def dm():
        d = PromptDataModule(task="addition", task_args=TASK, batch_size=8)
        d.setup()
        return d, d.train_dataloader()

    _d1, loader = dm()
    it = iter(loader)
    want = [[p.uid for p in next(it).prompts] for _ in range(12)]  # spans several passes over 44 prompts
    d2, _ = dm()
    ps = PromptStream(d2.train_prompts, 8, d2.seed, template=d2._sampler)
    assert [[p.uid for p in ps.next_batch()] for _ in range(12)] == want
    assert ps.pos == 96 and d2._sampler.pos == 0  # its own copy: the loader's sampler is untouched
    resumed = PromptStream(d2.train_prompts, 8, d2.seed, pos=40, template=d2._sampler)
    assert [p.uid for p in resumed.next_batch()] == want[5]


def test_async_without_rollout_correction_is_refused_at_setup(tiny_model_dir):
    """Stale rows with rollout_correction='none' and one update per batch would train with ratio 1 (as if
    on-policy): setup refuses it, naming the setting, before any generation. k=0 is synchronous: allowed."""
    with pytest.raises(ValueError, match="rollout_correction is 'none'.*tis"):
        _fit(tiny_model_dir, steps=1, mode="async", k=1)
    _fit(tiny_model_dir, steps=1, mode="async", k=0)
