"""The one seam between the rollout side and the learner (issue 55, item 1; lit_rl/learners/binding.py).

Each callback's ``setup`` leaves the module as it found it except for the one frozen ``RolloutBinding`` handed
over by ``bind_rollout``; the learner reads the sampling temperature and processing from it (held nowhere
else), the evaluator and the teacher router are the trainer's callbacks of those types, and a second, different
binding while one is held is refused. Before the binding the callbacks wrote ``rollout_source``,
``heldout_eval``, ``temperature`` and ``processing`` onto the module at setup (``teacher_router`` too).
"""

from __future__ import annotations

import dataclasses
import threading

import lightning as L
import pytest
from _scripted_engine import ScriptedEngine

from lit_rl.callbacks import HeldoutEval, RolloutCallback
from lit_rl.callbacks.agent_rollout import AgentEval, AgentRolloutCallback
from lit_rl.callbacks.teachers import Teacher, TeacherRouter
from lit_rl.core.processed import LogitProcessing
from lit_rl.learners import PolicyModule
from lit_rl.learners.binding import RolloutBinding
from lit_rl.learners.distill import DistillModule
from lit_rl.rollout.agent_envs import CalculatorEnv
from lit_rl.rollout.agent_loop import AgentLoop
from lit_rl.rollout.engine import SamplingConfig

SAMPLING = SamplingConfig(temperature=0.7, top_k=5, max_new_tokens=4)


def _trainer(*callbacks) -> L.Trainer:
    return L.Trainer(
        callbacks=list(callbacks),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _setup_all(trainer: L.Trainer, module, callbacks, stage: str = "fit") -> set[str]:
    """Run each callback's setup as Lightning does; the names of module attributes it added or rebound."""
    before = dict(vars(module))
    for cb in callbacks:
        cb.setup(trainer, module, stage)
    after = vars(module)
    return {k for k in after if k not in before or after[k] is not before[k]}


def test_setup_writes_nothing_onto_the_module_but_the_one_binding(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    assert module.temperature == 1.0 and module.processing == LogitProcessing()  # unbound: the defaults
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2, sampling=SAMPLING)
    ev = HeldoutEval(baseline=False)
    trainer = _trainer(ev, rc)  # the evaluator's setup first: the order does not matter any more

    changed = _setup_all(trainer, module, [ev, rc])

    assert changed == {"_rollout", "_rollout_held"}  # before: also rollout_source, heldout_eval, temperature,
    b = module.rollout  # processing (and steps_per_iteration with a datamodule)
    assert isinstance(b, RolloutBinding)
    assert (b.engine, b.settings, b.rewards, b.lock, b.evaluator) == (
        rc.engine,
        rc.settings,
        rc.rewards,
        rc.engine_lock,
        ev,
    )
    assert b.teacher_router is None and b.agent is None
    # the learner's log-prob temperature and processing are the sampler's, read from the binding
    assert module.temperature == 0.7
    assert module.processing == LogitProcessing(temperature=0.7, top_k=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.evaluator = HeldoutEval()  # type: ignore[misc]


def test_greedy_sampling_gives_logprobs_at_temperature_one(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2, sampling=SamplingConfig(0.0))
    _setup_all(_trainer(rc), module, [rc])
    assert module.temperature == 1.0 and module.processing.greedy


def test_default_evaluator_and_a_second_binding(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2)
    trainer = _trainer(rc)
    _setup_all(trainer, module, [rc])
    default = module.rollout.evaluator
    assert type(default) is HeldoutEval  # no HeldoutEval callback: the rollout callback's own
    _setup_all(trainer, module, [rc], stage="validate")  # the same callback again (fit, then validate)
    assert module.rollout.evaluator is default

    other = RolloutCallback(rewards=lambda prompt, completion: 1.0, group_size=2)
    with pytest.raises(RuntimeError, match="already bound to a rollout.*one RolloutCallback per trainer"):
        other.setup(_trainer(other), module, "fit")
    rc.teardown(trainer, module, "fit")  # released: the next fit binds its own
    other.setup(_trainer(other), module, "fit")
    assert module.rollout.rewards is other.rewards
    assert rc.binding().lock is rc.engine_lock
    with pytest.raises(TypeError, match="bind_rollout takes a RolloutBinding, got dict"):
        module.bind_rollout({"engine": rc.engine})  # type: ignore[arg-type]


def test_two_evaluators_are_refused(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2)
    trainer = _trainer(rc, HeldoutEval(), AgentEval())  # (two HeldoutEvals Lightning refuses itself)
    with pytest.raises(ValueError, match="trainer.callbacks has 2 HeldoutEval callbacks"):
        rc.setup(trainer, module, "fit")


def test_a_module_that_is_no_lit_rl_learner_is_refused():
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2)
    with pytest.raises(TypeError, match="RolloutCallback trains a lit_rl learner.*got LightningModule"):
        rc.setup(_trainer(rc), L.LightningModule(), "fit")


def test_the_teacher_router_comes_in_the_binding(tiny_model_dir):
    module = DistillModule(model=str(tiny_model_dir), losses={"forward_kl": 1.0})
    with pytest.raises(RuntimeError, match="needs a TeacherRouter and a RolloutCallback"):
        module.router()
    router = TeacherRouter({"default": Teacher(source="self_frozen")})
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, group_size=2)
    changed = _setup_all(_trainer(router, rc), module, [router, rc])
    assert changed == {"_rollout", "_rollout_held"}  # before: teacher_router too
    assert module.router() is router and module.rollout.teacher_router is router


def test_the_agent_callback_binds_through_the_same_seam(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    loop = AgentLoop(CalculatorEnv, ScriptedEngine(module.tokenizer, []), max_turns=2)
    rc = AgentRolloutCallback(loop, group_size=2, sampling=SAMPLING)
    changed = _setup_all(_trainer(rc), module, [rc])
    assert changed == {"_rollout", "_rollout_held"}  # before: heldout_eval (an AgentEval) and the four above
    b = module.rollout
    assert isinstance(b.evaluator, AgentEval) and b.agent is loop and b.rewards is None
    assert b.engine is loop.engine and isinstance(b.lock, type(threading.RLock()))
    assert module.temperature == 0.7
