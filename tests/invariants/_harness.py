"""One RL iteration of a settings combination through the real loop, with what the invariants read recorded.

``run(settings, model_dir)`` builds the ``PolicyModule`` (the family's settings + the structural ones), a real
``RolloutCallback`` with an ``HFEngine`` (shared weights or its own copy), ``ReferenceKL`` when asked, and
fits one iteration in a real Lightning ``Trainer`` (``precision="64-true"`` by default). The optimizer is the
conformance suite's ``NoStep``: it records every optimizer step's gradient and leaves the weights alone, so
engine = policy = reference = old policy at *every* step (ppo_epochs 2 included): the on-policy point.

Recorded (``Run``): the logged metrics, the Experience as the last ExperienceHook saw it (after ReferenceKL,
before advantages), each optimizer step's minibatch rows and gradient, and every call of the mismatch
correction (its weights and keep-mask), which no metric reports in full (``is/max_weight`` is the largest
only).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))  # the shared references
from _conformance import NoStep

from invariants._grid import FAMILIES

TASK = {"answer_width": 1, "max_sum": 9}
PROMPTS, GROUP, NEW_TOKENS = 2, 2, 6
MICRO_BATCH_TOKENS = 24  # ~ one row (prompt ≈ 6 + 6 new tokens) per micro-batch: the budget really splits
MINIBATCH = 2  # with ppo_epochs 2: 2 minibatches × 2 epochs = 4 optimizer steps
LORA = {"r": 2, "lora_alpha": 4, "target_modules": "all-linear"}
KL_BETA = 0.05


def reward(prompt, completion: str) -> float:
    """A deterministic score in [0, 1) that differs between most completions: groups carry a signal, so the
    gradient checks are not vacuous (a binary task reward is mostly 0 for an untrained tiny model)."""
    return (sum(map(ord, completion)) % 13) / 13


@dataclass
class Run:
    settings: dict
    module: object
    engine: object
    metrics: dict[str, float]
    # the Experience after every ExperienceHook (ReferenceKL's token rewards in), before advantages
    exp: object
    steps: list = field(
        default_factory=list
    )  # (minibatch rows as Experience, gradient list) per optimizer step
    corrections: list = field(default_factory=list)  # (weights, keep, mask) per correction call
    weight_diffs: list = field(default_factory=list)  # engine weights unlike the policy's when it generated


class _Spy(L.Callback):
    """Last ExperienceHook: a copy of the Experience every hook before it has annotated, and the engine
    weights that differ from the policy's right after they generated it (name, engine dtype, policy dtype)."""

    def __init__(self, engine):
        self.engine, self.weight_diffs = engine, []

    def on_experience(self, trainer, module, exp):
        self.exp = copy.deepcopy(exp)
        own = getattr(self.engine, "model", None)
        if (
            not isinstance(own, torch.nn.Module) or own is module.model
        ):  # shared, or weights in another process
            return
        params = dict(own.named_parameters(remove_duplicate=False))
        params.update(dict(own.named_buffers(remove_duplicate=False)))
        for name, t in self.engine.sync_items(module.model):
            e = params.get(name)
            if e is None or e.dtype != t.dtype or not torch.equal(e, t.to(e.device)):
                self.weight_diffs.append((name, None if e is None else e.dtype, t.dtype))


def module_kwargs(s: dict) -> dict:
    kw = dict(FAMILIES[s["family"]])
    mode, _, level = s["correction"].partition("/")
    kw.update(
        rollout_correction=mode,
        correction_level=level or "token",
        padding_free=s["padding_free"],
        micro_batch_tokens=s["micro_batch_tokens"],
        gradient_checkpointing=s["gradient_checkpointing"],
        ppo_epochs=s["ppo_epochs"],
        lora=LORA if s["lora"] else None,
    )
    if s["ppo_epochs"] > 1:
        kw["minibatch_size"] = MINIBATCH
    for k in ("correction_cap", "correction_low"):  # only set by the refused-combination rules
        if k in s:
            kw[k] = s[k]
    return kw


def sampling(s: dict):
    from lit_rl.rollout import SamplingConfig

    return SamplingConfig(
        max_new_tokens=NEW_TOKENS,
        temperature=s["temperature"],
        top_p=s["top_p"],
        top_k=s["top_k"],
        min_p=s["min_p"],
        repetition_penalty=s["repetition_penalty"],
        stop=s["stop"],
    )


def reference_kl(s: dict):
    from lit_rl.callbacks.reference_kl import ReferenceKL

    if s["kl"] == "none":
        return None
    where, kind = s["kl"].split("/")
    return ReferenceKL(kind=kind, where=where, beta=KL_BETA)


@contextlib.contextmanager
def _record_corrections(into: list):
    """Wrap ``core.objective``'s ``rollout_correction``: every call's weights / keep-mask / token mask."""
    from lit_rl.core import objective

    real = objective.rollout_correction

    @functools.wraps(real)
    def spy(logprobs, behavior_logprobs, mask, *a, **kw):
        w, keep, metrics = real(logprobs, behavior_logprobs, mask, *a, **kw)
        into.append((w.detach().clone(), keep.clone(), mask.clone()))
        return w, keep, metrics

    objective.rollout_correction = spy
    try:
        yield
    finally:
        objective.rollout_correction = real


def run(
    settings: dict, model_dir: str, precision: str = "64-true", engine=None, trainer_kw=None, optimizer=None
) -> Run:
    """``optimizer``: None = ``NoStep`` (gradients recorded); a strategy that owns the optimizer step
    (DeepSpeed) gets e.g. SGD with lr 0 instead (weights still never move; ``Run.steps`` then hold None
    gradients)."""
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.core.steps import optimizer_steps_per_iteration
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rollout.engine import HFEngine

    minibatches: list = []

    class Probe(PolicyModule):
        def _optimizer_step(self, opt, sched, mb, micro_loss=None):
            minibatches.append(copy.deepcopy(mb))  # the rows of this optimizer step, as the module has them
            return super()._optimizer_step(opt, sched, mb, micro_loss)

    module = Probe(
        model=str(model_dir), optimizer=optimizer or NoStep, max_grad_norm=1e30, **module_kwargs(settings)
    )
    engine = engine or HFEngine(share_weights=settings["engine"] == "hf_shared")
    spy = _Spy(engine)
    kl = reference_kl(settings)
    callbacks = [
        RolloutCallback(engine=engine, rewards=reward, group_size=GROUP, sampling=sampling(settings)),
        *([kl] if kl else []),
        spy,
    ]
    corrections: list = []
    L.seed_everything(0)
    kw = {"devices": 1, **(trainer_kw or {})}
    trainer = L.Trainer(
        accelerator="cpu",
        precision=precision,
        # one iteration = every optimizer step of one Experience (max_steps counts optimizer steps)
        max_steps=optimizer_steps_per_iteration(
            PROMPTS * GROUP, module.config.step.ppo_epochs, module.config.step.minibatch_size
        ),
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kw,
    )
    with _record_corrections(corrections):
        trainer.fit(module, datamodule=PromptDataModule(task="addition", task_args=TASK, batch_size=PROMPTS))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    grads = getattr(trainer.optimizers[0], "grads", None) or [None] * len(minibatches)
    assert len(grads) == len(minibatches), (
        f"{len(minibatches)} optimizer steps, {len(grads)} gradients recorded"
    )
    return Run(
        settings,
        module,
        engine,
        metrics,
        spy.exp,
        list(zip(minibatches, grads)),
        corrections,
        spy.weight_diffs,
    )


def rows_of(exp, sub) -> list[int]:
    """Indices into ``exp`` of ``sub``'s rows, matched by their tokens (equal rows are interchangeable: same
    prompt, completion, reward and group)."""
    out, used = [], set()
    for r, a in zip(sub.input_ids, sub.attention_mask):
        real = r[a.bool()].tolist()
        for i in range(exp.batch_size):
            row_real = exp.input_ids[i][exp.attention_mask[i].bool()].tolist()
            if i not in used and row_real == real and exp.group_ids[i] == sub.group_ids[len(out)]:
                out.append(i)
                used.add(i)
                break
        else:
            raise AssertionError(f"minibatch row not found in the Experience: {real}")
    return out
