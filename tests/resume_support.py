"""Helpers the resume / guard tests run inside real `lit-rl fit` subprocesses (importable through PYTHONPATH).

They are test instruments, not lit_rl code: a callback recording what each iteration did, a reward that
kills its own process mid-rollout, and a loss term that injects a NaN gradient at chosen iterations.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import lightning as L
import torch

from lit_rl.learners.protocols import LossTerm
from lit_rl.rewards.verifiers import ExactAnswerReward

SERIES_KEYS = ("loss/policy", "reward/mean", "actor/grad_norm", "actor/entropy", "kl/mean", "entropy/coef")


class SeriesRecorder(L.Callback):
    """Appends one JSON line per RL iteration: the logged series, the prompts and completions trained on."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        exp = batch.experience
        m = trainer.callback_metrics
        row = {
            "iteration": pl_module.iteration,
            "global_step": trainer.global_step,
            "pid": os.getpid(),
            "series": {k: float(m[k]) for k in SERIES_KEYS if k in m},
            "prompts": [p.uid for p in exp.prompts],
            "texts": list(exp.texts),
            "rewards": [float(r) for r in exp.rewards],
            "param_sum": float(sum(p.detach().double().sum() for p in pl_module.parameters())),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


class KillingReward(ExactAnswerReward):
    """ExactAnswerReward that SIGKILLs its own process at the ``LIT_RL_TEST_KILL_AT_CALL``-th call, i.e.
    in the middle of a rollout (no Python cleanup, no flushing: what a preempted job looks like)."""

    calls = 0

    def __call__(self, prompt, completion):
        KillingReward.calls += 1
        at = int(os.environ.get("LIT_RL_TEST_KILL_AT_CALL", "0"))
        if at and KillingReward.calls >= at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(prompt, completion)


class NaNGradTerm(L.Callback, LossTerm):
    """LossTerm adding ``0 * sum(logits)`` scaled by NaN (or Inf) at the listed iterations: the loss and every
    gradient become non-finite there, exactly as a real overflow would."""

    def __init__(self, at_iterations: list[int], value: str = "nan"):
        self.at = set(at_iterations)
        self.value = float(value)

    def loss_terms(self, module, micro, fwd):
        logits = fwd["logits"]
        if module.iteration in self.at:
            return {"injected": logits.float().sum() * torch.tensor(self.value)}
        return {"injected": logits.float().sum() * 0.0}


class CheckpointKiller(L.Callback):
    """Makes the ``LIT_RL_TEST_KILL_IN_SAVE``-th checkpoint write die half-way through the file: torch.save
    writes half of the serialized bytes into the file object it was given, then the process is SIGKILLed."""

    def setup(self, trainer, pl_module, stage):
        at = int(os.environ.get("LIT_RL_TEST_KILL_IN_SAVE", "0"))
        if not at:
            return
        import io

        real_save, count = torch.save, [0]

        def save(obj, f, *args, **kwargs):
            count[0] += 1
            if count[0] < at:
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            if hasattr(f, "write"):
                f.write(data[: len(data) // 2])
                f.flush()
            else:
                with open(f, "wb") as fh:
                    fh.write(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = save
