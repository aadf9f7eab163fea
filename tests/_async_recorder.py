"""A Lightning callback for multi-process runs (tests/dist_runner.py): what each rank trained and with which
weights, written to files the test reads after the processes exit.

Place it after the RolloutCallback (the CLI puts ``rollout:`` first). Per rank ``rows{rank}.pt``: for every
trained row the prompt and completion token ids, the engine's log-probs (``rollout_logprobs``), the row's
``policy_version`` label and the learner's version when the trainer took it; at the end the number of weight
syncs the rank's engine ran and the learner version. Rank 0 also writes ``weights.pt``: the learner's merged
weights at every version it pushed (version 0 = the weights loaded at train start), so a test can recompute
each row's log-probs under every version and find which one generated it.
"""
from __future__ import annotations

import os

import lightning as L
import torch


class AsyncRowRecorder(L.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.rows: list[dict] = []
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    @staticmethod
    def _rc(trainer):
        from lit_rl.callbacks import RolloutCallback

        return next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))

    def _snapshot(self, trainer, pl_module) -> None:
        from lit_rl.models.loading import merged_state_items

        version = self._rc(trainer)._async_state["version"]
        if trainer.global_rank == 0 and version not in self.weights:
            self.weights[version] = {n: t.detach().cpu().clone() for n, t in merged_state_items(pl_module.model)}

    def on_train_start(self, trainer, pl_module):
        self._snapshot(trainer, pl_module)  # after the RolloutCallback loaded the learner's weights (version 0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        exp, rc = batch.experience, self._rc(trainer)
        learner = rc._producer.learner_version
        C = exp.loss_mask.shape[1]
        P = exp.input_ids.shape[1] - C
        for i in range(exp.input_ids.shape[0]):
            am = exp.attention_mask[i].bool()
            prompt = exp.input_ids[i, :P][am[:P]].tolist()
            completion = exp.input_ids[i, P:][am[P:]].tolist()
            self.rows.append({"iteration": int(pl_module.iteration), "prompt": prompt, "completion": completion,
                              "logprobs": exp.rollout_logprobs[i, :len(completion)].double().tolist(),
                              "version": int(exp.policy_version[i]), "learner": int(learner)})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._snapshot(trainer, pl_module)  # after the RolloutCallback's push (its version is the new one)

    def on_train_end(self, trainer, pl_module):
        rc = self._rc(trainer)
        rank = trainer.global_rank
        torch.save({"rows": self.rows, "syncs": int(rc.engine._sync_seq), "learner": rc._async_state["version"]},
                   os.path.join(self.out_dir, f"rows{rank}.pt"))
        if rank == 0:
            torch.save(self.weights, os.path.join(self.out_dir, "weights.pt"))
