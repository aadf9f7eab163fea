"""The weight-sync schedule's contract (``callbacks/_weight_sync.py``): which iteration ends push, the first push
of a fit, the route (engine, async snapshot, collective load now) and the checkpointed ``last_sync_step``.

A real engine with its own copy of the weights (the conformance suite's ``FakeEngine``) and a real
``AsyncProducer``; the trainer and module are reduced to what the schedule reads (``global_step``,
``world_size``; ``model``, ``log``). The full fits (sync, async, resume) are in ``test_async_rollout.py`` and
``tests/test_resume.py``."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from lit_rl.callbacks._async_rollouts import AsyncRollouts
from lit_rl.callbacks._weight_sync import WeightSync
from lit_rl.rollout.async_producer import AsyncProducer
from lit_rl.rollout.settings import RolloutSettings, SyncSettings
from tests.conformance._fake_engine import FakeEngine


class _Module:
    """The learner as the schedule sees it: a model to read weights from and Lightning's ``log``."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 2).double()
        self.logged: list[str] = []

    def log(self, name, value, **kw):
        self.logged.append(name)

    def step(self):  # an optimizer step: every weight moves by +1
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(1.0)


def _engine(module) -> FakeEngine:
    e = FakeEngine()
    e.bind(SimpleNamespace(model=module.model, tokenizer=None))  # its own deep copy
    return e


def _trainer(step: int):
    return SimpleNamespace(global_step=step, world_size=1)


def _same(engine, module) -> bool:
    return all(
        torch.equal(a, b)
        for a, b in zip(engine.model.state_dict().values(), module.model.state_dict().values())
    )


def test_pushes_at_the_first_iteration_end_at_or_past_each_boundary():
    # sync_every=4 with 2 optimizer steps per iteration: iteration ends at global steps 2, 4, ..., 12;
    # 2 - 0 < 4, 4 - 0 >= 4 push, 6 - 4 < 4, 8 - 4 >= 4 push, 10 - 8 < 4, 12 - 8 >= 4 push
    m = _Module()
    eng = _engine(m)
    ws = WeightSync(eng, sync_every=4, lock=threading.RLock())
    pushed = []
    for step in (2, 4, 6, 8, 10, 12):
        m.step()
        ws.after_iteration(_trainer(step), m)
        if ws.last_sync_step == step:
            pushed.append(step)
        assert _same(eng, m) == (step in (4, 8, 12))  # between pushes the engine keeps the older weights
    assert pushed == [4, 8, 12]
    assert eng.policy_version == 3 and m.logged == ["perf/weight_sync_s"] * 3


def test_state_dict_round_trip_continues_the_schedule():
    m = _Module()
    ws = WeightSync(_engine(m), sync_every=3, lock=threading.RLock())
    ws.after_iteration(_trainer(4), m)
    assert ws.state_dict() == {"last_sync_step": 4}
    other = WeightSync(_engine(m), sync_every=3, lock=threading.RLock())
    other.load_state_dict(ws.state_dict())
    assert (other.due(6), other.due(7)) == (False, True)


def test_first_push_only_on_resume_in_sync_mode_and_always_in_async_mode():
    m = _Module()
    eng = _engine(m)
    ws = WeightSync(eng, sync_every=1, lock=threading.RLock())
    m.step()
    ws.first_push(
        _trainer(0), m.model, async_version=None
    )  # fresh run: the engine was bound to these weights
    assert not _same(eng, m) and eng.policy_version == 0
    eng.policy_version = 7  # the checkpointed version
    ws.first_push(_trainer(5), m.model, async_version=None)  # resumed: the restored weights, version kept
    assert _same(eng, m) and eng.policy_version == 7

    m.step()
    eng.share_weights = True  # an engine reading the learner's own weights gets no push
    ws.first_push(_trainer(5), m.model, async_version=None)
    assert not _same(eng, m) and eng.policy_version == 7

    ws.first_push(_trainer(0), m.model, async_version=4)  # async: always, labelled with the learner's version
    assert _same(eng, m) and eng.policy_version == 4


def test_async_pushes_snapshot_for_the_producer_or_load_now_when_collective():
    m = _Module()
    eng = _engine(m)
    lock = threading.RLock()
    ws = WeightSync(eng, sync_every=1, lock=lock)
    rollouts = AsyncRollouts(RolloutSettings(group_size=2), SyncSettings(max_staleness=1), lock=lock)
    rollouts.producer = AsyncProducer(lambda n: None, ws.load, max_staleness=1, capacity=1, engine_lock=lock)

    m.step()
    ws.after_iteration(_trainer(1), m, rollouts)
    assert rollouts.state["version"] == 1 and not _same(eng, m)  # a snapshot: loaded by the producer, later
    m.step()  # the learner moves on; the snapshot does not
    rollouts.producer.apply_pending()
    assert eng.policy_version == 1 and not _same(eng, m)
    assert torch.equal(eng.model.weight, m.model.weight - 1.0)

    eng.collective_sync = True  # a load that is a collective over ranks happens now, in the trainer thread
    ws.after_iteration(_trainer(2), m, rollouts)
    assert rollouts.state["version"] == 2 and eng.policy_version == 2 and _same(eng, m)
