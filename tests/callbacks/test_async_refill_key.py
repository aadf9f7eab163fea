"""The async producer keys each item's refill stream by the iteration the item is for (issue 28 §4).

Dynamic sampling draws refill prompts from a stream keyed by (seed, rank, iteration). The producer thread runs
ahead of the trainer, so reading ``pl_module.iteration`` there gave items 0 and 1 the same key (both read 0
while iteration 0 trained) — the same refill prompts — and made the key depend on thread timing. Item n of a
producer started at iteration i is for iteration i + n; a resumed run restarts at the restored iteration.
The key each trained Experience was built with is recorded by a pipeline subclass (the pipeline is injectable).
"""

from __future__ import annotations

import lightning as L
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.learners import PolicyModule
from lit_rl.rewards import ExactAnswerReward, RewardPool
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.pipeline import RolloutPipeline, build_pipeline
from lit_rl.rollout.settings import RolloutSettings


class KeyedPipeline(RolloutPipeline):
    """The real single-turn pipeline, remembering the refill key (``iteration``) each Experience was built with."""

    def __init__(self, base: RolloutPipeline):
        super().__init__(base.render, base.generate, base.score, base.build, base.settings, base.filters)
        self.built: list = []  # (Experience, key), producer thread appends

    def run(self, tokenizer, prompts, pool=None, rank=0, iteration=0):
        exp, metrics = super().run(tokenizer, prompts, pool=pool, rank=rank, iteration=iteration)
        self.built.append((exp, iteration))
        return exp, metrics


class TrainedKeys(L.Callback):
    """After the RolloutCallback: the refill key of the Experience each iteration trains on."""

    def __init__(self, pipeline: KeyedPipeline):
        self.pipeline, self.keys = pipeline, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.keys.append(next(k for e, k in list(self.pipeline.built) if e is batch.experience))


def _fit(model_dir, steps: int, ckpt_in=None, ckpt_out=None) -> tuple[list[int], KeyedPipeline]:
    L.seed_everything(0)
    module = PolicyModule(
        model=str(model_dir), rollout_correction="tis", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3)
    )
    engine = HFEngine(share_weights=False)
    settings = RolloutSettings(group_size=2, sampling=SamplingConfig(temperature=1.0, max_new_tokens=2))
    pipe = KeyedPipeline(build_pipeline(engine, RewardPool({"exact": ExactAnswerReward()}), settings))
    rc = RolloutCallback(engine=engine, pipeline=pipe, mode="async", max_staleness=2)
    rec = TrainedKeys(pipe)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, rec],
    )
    dm = PromptDataModule(
        task="addition", task_args={"answer_width": 1, "max_sum": 9, "unary": True}, batch_size=2
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_in)
    if ckpt_out is not None:
        trainer.save_checkpoint(ckpt_out)
    return rec.keys, pipe


def test_each_async_item_keys_its_own_iteration_and_resume_continues(tiny_model_dir, tmp_path):
    ckpt = str(tmp_path / "it3.ckpt")
    keys, pipe = _fit(tiny_model_dir, 3, ckpt_out=ckpt)
    assert keys == [0, 1, 2]  # item n is for iteration n: items 0 and 1 no longer share a refill stream
    produced = [k for _, k in pipe.built]
    assert produced == list(range(len(produced)))  # also the items produced ahead and never trained
    resumed, pipe = _fit(tiny_model_dir, 5, ckpt_in=ckpt)
    assert resumed == [3, 4]  # the uninterrupted run's keys for iterations 3 and 4
    assert [k for _, k in pipe.built][:2] == [3, 4]
