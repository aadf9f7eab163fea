"""Non-finite gradient guards on a real tiny model: NaN / Inf gradients come from a LossTerm callback
(``resume_support.NaNGradTerm``), so the whole real update path runs, down to clip_grad_norm."""

from __future__ import annotations

import copy
import functools

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from resume_support import NaNGradTerm

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.learners import PolicyModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9, "unary": True}


def _fit(model_dir, callbacks, max_steps, **module_kw):
    module = PolicyModule(
        model=str(model_dir), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2), **module_kw
    )
    rollout = RolloutCallback(
        rewards=ExactAnswerReward(), group_size=4, sampling=SamplingConfig(max_new_tokens=1)
    )
    # no implicit ModelCheckpoint (it would write into the working directory): only the tests' own
    enable_ckpt = any(isinstance(cb, ModelCheckpoint) for cb in callbacks)
    trainer = L.Trainer(
        max_steps=max_steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=enable_ckpt,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rollout, *callbacks],
    )
    return (
        module,
        trainer,
        lambda: trainer.fit(module, datamodule=PromptDataModule(task_args=TASK, batch_size=2)),
    )


def _snapshot(module, trainer):
    return {
        "params": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "opt": copy.deepcopy(trainer.optimizers[0].state_dict()),
        "global_step": trainer.global_step,
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


class Snapshots(L.Callback):
    """Module, optimizer and step before and after every iteration, keyed by the iteration index."""

    def __init__(self):
        self.before, self.after, self.skipped = {}, {}, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before[module.iteration] = _snapshot(module, trainer)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after[module.iteration - 1] = _snapshot(module, trainer)
        self.skipped[module.iteration - 1] = float(trainer.callback_metrics["actor/skipped_steps"])


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nonfinite_gradient_skips_the_step_bitwise(tiny_model_dir, value):
    snaps = Snapshots()
    module, trainer, fit = _fit(tiny_model_dir, [NaNGradTerm([1], value), snaps], max_steps=3)
    fit()
    # iteration 1 was skipped: parameters, optimizer state (AdamW moments, step) and global_step untouched
    assert _equal(snaps.after[1]["params"], snaps.before[1]["params"])
    assert _equal(snaps.after[1]["opt"], snaps.before[1]["opt"])
    assert snaps.after[1]["global_step"] == snaps.before[1]["global_step"] == 1
    # the good iterations around it did update
    assert not _equal(snaps.after[0]["params"], snaps.before[0]["params"])
    assert not _equal(snaps.after[2]["params"], snaps.before[2]["params"])
    assert all(torch.isfinite(v).all() for v in snaps.after[3]["params"].values() if v.is_floating_point())
    assert (
        module.skipped_steps == 1 and module.nonfinite_in_a_row == 0
    )  # counted; reset by the next good step
    assert [snaps.skipped[i] for i in range(4)] == [0.0, 1.0, 1.0, 1.0]  # logged as actor/skipped_steps
    assert trainer.global_step == 3 and module.iteration == 4


def test_a_skipped_step_is_never_checkpointed(tiny_model_dir, tmp_path):
    """ModelCheckpoint(every_n_train_steps=1) does not save after the skipped iteration (global_step did not
    move); a checkpoint forced right after it holds exactly the last good state."""

    class Saves(L.Callback):
        def __init__(self):
            self.iterations = []

        def on_save_checkpoint(self, trainer, module, checkpoint):
            self.iterations.append(module.iteration)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if module.iteration == 2:  # just after the skipped iteration 1
                trainer.save_checkpoint(tmp_path / "forced.ckpt")

    saves = Saves()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1, save_last=True)
    _module, _trainer, fit = _fit(tiny_model_dir, [NaNGradTerm([1]), saves, ckpt], max_steps=2)
    fit()
    # ModelCheckpoint saved after iterations 0 and 2 (step + last files, 2 dumps each); only the forced save
    # happened after iteration 1
    assert saves.iterations == [1, 1, 2, 3, 3]
    good = torch.load(tmp_path / "ckpt" / "epoch=0-step=1.ckpt", map_location="cpu", weights_only=True)
    forced = torch.load(tmp_path / "forced.ckpt", map_location="cpu", weights_only=True)
    assert _equal(forced["state_dict"], good["state_dict"])
    assert _equal(forced["optimizer_states"], good["optimizer_states"])
    assert forced["global_step"] == good["global_step"] == 1
    assert forced["lit_rl_policy"] == {"iteration": 2, "skipped_steps": 1, "nonfinite_in_a_row": 1}


def test_consecutive_nonfinite_steps_stop_with_the_last_good_checkpoint(tiny_model_dir, tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_last=True)
    module, _trainer, fit = _fit(
        tiny_model_dir, [NaNGradTerm([1, 2, 3]), ckpt], max_steps=10, max_nonfinite_steps=3
    )
    with pytest.raises(
        RuntimeError,
        match=r"3 optimizer steps in a row had a non-finite gradient norm "
        r"\(max_nonfinite_steps=3\)",
    ):
        fit()
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 1 and last["lit_rl_policy"]["iteration"] == 1  # the good iteration 0
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())
    assert module.skipped_steps == 3
