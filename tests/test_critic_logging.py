"""The logged ``critic/value_loss`` is the minibatch's value loss, from real micro-batches only (issue 28 §6c).

A rank with fewer token-budget micro-batches than another runs zero-weight passes (``OptimizerStep``: a
``None`` micro-batch → one untrained row, loss × 0) so the collectives stay in step. Those passes are no
value-loss sample: averaging them in logged (L + 0) / 2 for a rank with one real micro-batch and one pad.
The pad is added here the way ``train_micro_batches`` adds it after the ranks' max-count all-reduce. Each
micro-batch's value loss is its share of L (minibatch denominators), so their mean was L / k with k
micro-batches; the logged value is now L for any micro-batching. Float64.
"""

import functools

import lightning as L
import pytest
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig


class PaddedPolicy(PolicyModule):
    """A rank whose peer formed one more micro-batch: its step ends with one zero-weight pass."""

    def train_micro_batches(self, mb, rows=None):
        return super().train_micro_batches(mb, rows) + [None]


class Capture(L.Callback):
    """After the RolloutCallback: the Experience (with rollout values and returns) each iteration trains on."""

    def __init__(self):
        self.exps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.exps.append(batch.experience)


@pytest.mark.parametrize("micro_batch_size, padded", [(None, False), (None, True), (2, True)])
def test_logged_value_loss_ignores_zero_weight_passes(tiny_model_dir, micro_batch_size, padded):
    L.seed_everything(0)
    cls = PaddedPolicy if padded else PolicyModule
    mod = cls(
        model=str(tiny_model_dir),
        critic=CriticModule(value_clip=None),
        advantage="gae",
        lam=0.95,
        loss_agg="token_mean",
        micro_batch_size=micro_batch_size,
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
    )
    with torch.no_grad():  # non-zero values: a non-trivial value loss
        torch.manual_seed(0)
        mod.critic.head.weight.normal_(std=0.1)
    cap = Capture()
    rc = RolloutCallback(rewards=ExactAnswerReward(), group_size=4, sampling=SamplingConfig(max_new_tokens=3))
    trainer = L.Trainer(
        max_steps=1,
        max_epochs=-1,
        accelerator="cpu",
        precision="64-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, cap],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2))
    exp = cap.exps[0]
    assert exp.values.dtype == torch.float64
    m = exp.train_mask
    # one optimizer step, before it the update's values are the rollout's: L = Σ_t 0.5 (V_t − R_t)² / N
    expected = float((0.5 * (exp.values - exp.returns).square())[m].sum()) / int(m.sum())
    assert expected > 0
    assert float(trainer.callback_metrics["critic/value_loss"]) == pytest.approx(expected, rel=1e-9)
