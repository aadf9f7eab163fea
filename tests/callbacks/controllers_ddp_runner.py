"""Two DDP ranks (gloo, CPU) train 2 iterations with adaptive ReferenceKL and EntropyRegularization.

    python tests/callbacks/controllers_ddp_runner.py OUT_DIR POLICY_DIR REFERENCE_DIR

Used by tests/callbacks/test_controllers_ddp.py; Lightning's launcher re-executes this script for rank 1.
Each rank writes OUT_DIR/rank<r>.json with, per iteration, its *local* statistics (what the controller would
have used without the all-reduce), the coefficient before and after the update, and at the end the state it
would checkpoint and the logged metrics.

The KL statistics are the real ones (the reference is another random model, so each rank's KL differs). The
entropy statistics are replaced by known per-rank values just before the update (the band controller is
discrete, so only chosen values can tell a local update from a global one). At iteration 2 rank 1 contributes
no token at all to either statistic: a rank whose rows were all masked must still join the reduce.
"""

import json
import sys

import lightning as L
import torch

from lit_rl.callbacks import EntropyRegularization, ReferenceKL, RolloutCallback
from lit_rl.callbacks.monitoring import TokensSeen
from lit_rl.data import PromptDataModule
from lit_rl.learners import PolicyModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

# iteration -> rank -> (entropy sum, token count)
ENTROPY_STATS = {0: {0: (0.4, 2), 1: (6.0, 6)}, 1: {0: (0.3, 3), 1: (0.0, 0)}}


class KLRecorder(ReferenceKL):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1 and trainer.global_rank == 1:  # this rank had no trainable token
            self._kl_sum, self._kl_count = 0.0, 0
        rec = {
            "sum": self._kl_sum,
            "count": self._kl_count,
            "rows": batch.experience.batch_size,
            "before": self.beta,
        }
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.records.append({**rec, "after": self.beta})


class EntropyRecorder(EntropyRegularization):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._sum, self._count = ENTROPY_STATS[batch_idx][trainer.global_rank]
        rec = {"sum": self._sum, "count": self._count, "before": self.coef}
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.records.append({**rec, "after": self.coef})


class TokensRecorder(TokensSeen):
    """Records this rank's own token count of each step beside the run-wide total."""

    def __init__(self):
        super().__init__()
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        local = int(batch.experience.attention_mask.sum())
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.records.append({"local": local, "total": self.total})


if __name__ == "__main__":
    out, policy, reference = sys.argv[1:4]
    L.seed_everything(0)
    kl = KLRecorder(
        path=reference, kind="k3", where="loss", beta=0.1, target_kl=0.05, horizon=100.0, kl_clip=1e6
    )  # no clipping: the update is a continuous function of the global mean
    ent = EntropyRecorder(coef=0.005, band=(0.5, 0.9), step=0.001, coef_max=0.01)
    rollout = RolloutCallback(
        rewards=ExactAnswerReward(), group_size=2, sampling=SamplingConfig(max_new_tokens=3, seed=5)
    )
    trainer = L.Trainer(
        max_steps=2,
        max_epochs=-1,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rollout, kl, ent, tokens := TokensRecorder()],
    )
    module = PolicyModule(model=policy, optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    trainer.fit(
        module, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2)
    )
    state = {"kl": kl.state_dict()["controller"]["value"], "entropy": ent.state_dict()["controller"]["value"]}
    metrics = {
        k: float(v)
        for k, v in trainer.callback_metrics.items()
        if k.startswith(("kl/", "entropy/", "tokens_seen"))
    }
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(
            {
                "kl": kl.records,
                "entropy": ent.records,
                "tokens": tokens.records,
                "state": state,
                "metrics": metrics,
            },
            f,
        )
