"""A Lightning callback for multi-process runs (tests/dist_runner.py): what each rank trained and with which
weights, written to files the test reads after the processes exit.

Place it after the RolloutCallback (the CLI puts ``rollout:`` first). Per rank ``rows{rank}.pt``: for every
trained row the prompt and completion token ids, the engine's log-probs (``rollout_logprobs``), the row's
``policy_version`` label and the learner's version when the trainer took it; at the end the number of weight
syncs the rank's engine ran and the learner version. Rank 0 also writes ``weights.pt``: the learner's merged
weights at every version it pushed (version 0 = the weights loaded at train start), so a test can recompute
each row's log-probs under every version and find which one generated it (``wrong_rows``).

Faults (rank 0 only, real signals to a launched server's process group): ``fault_signal`` (``KILL`` | ``STOP``)
is sent to ``fault_pgid`` at iteration ``fault_at``, ``fault_when``: ``rollout`` when the iteration's rollout is
taken (async: the producers are generating the next items) or ``update`` just before its optimizer step (every
rank has generated, so the weight sync after it is the first to meet the server).
"""

from __future__ import annotations

import os
import signal

import lightning as L
import torch


class AsyncRowRecorder(L.Callback):
    def __init__(
        self,
        out_dir: str,
        fault_at: int | None = None,
        fault_pgid: int | None = None,
        fault_signal: str = "KILL",
        fault_when: str = "rollout",
    ):
        self.out_dir = out_dir
        self.fault_at, self.fault_pgid, self.fault_signal, self.fault_when = (
            fault_at,
            fault_pgid,
            fault_signal,
            fault_when,
        )
        self.rows: list[dict] = []
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    @staticmethod
    def _rc(trainer):
        from lit_rl.callbacks import RolloutCallback

        return next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))

    def _snapshot(self, trainer, pl_module) -> None:
        from lit_rl.models.loading import merged_state_items

        rc = self._rc(trainer)
        version = rc._async_state["version"] if rc._producer is not None else rc.engine.policy_version
        if trainer.global_rank == 0 and version not in self.weights:
            self.weights[version] = {
                n: t.detach().cpu().clone() for n, t in merged_state_items(pl_module.model)
            }

    def on_train_start(self, trainer, pl_module):
        self._snapshot(
            trainer, pl_module
        )  # after the RolloutCallback loaded the learner's weights (version 0)

    def _fault(self, trainer, pl_module, when: str) -> None:
        if (
            self.fault_when == when
            and trainer.global_rank == 0
            and self.fault_pgid is not None
            and pl_module.iteration == self.fault_at
        ):
            os.killpg(self.fault_pgid, getattr(signal, f"SIG{self.fault_signal}"))
            self.fault_at = None  # once (several optimizer steps may follow)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._fault(trainer, pl_module, "update")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._fault(trainer, pl_module, "rollout")
        exp, rc = batch.experience, self._rc(trainer)
        learner = rc._producer.learner_version if rc._producer is not None else rc.engine.policy_version
        C = exp.loss_mask.shape[1]
        P = exp.input_ids.shape[1] - C
        for i in range(exp.input_ids.shape[0]):
            am = exp.attention_mask[i].bool()
            prompt = exp.input_ids[i, :P][am[:P]].tolist()
            completion = exp.input_ids[i, P:][am[P:]].tolist()
            self.rows.append(
                {
                    "iteration": int(pl_module.iteration),
                    "prompt": prompt,
                    "completion": completion,
                    "logprobs": exp.rollout_logprobs[i, : len(completion)].double().tolist(),
                    "version": int(exp.policy_version[i]),
                    "learner": int(learner),
                }
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._snapshot(trainer, pl_module)  # after the RolloutCallback's push (its version is the new one)

    def on_train_end(self, trainer, pl_module):
        rc = self._rc(trainer)
        rank = trainer.global_rank
        learner = rc._async_state["version"] if rc._producer is not None else rc.engine.policy_version
        torch.save(
            {"rows": self.rows, "syncs": int(rc.engine._sync_seq), "learner": learner},
            os.path.join(self.out_dir, f"rows{rank}.pt"),
        )
        if rank == 0:
            torch.save(self.weights, os.path.join(self.out_dir, "weights.pt"))


@torch.no_grad()
def _logprobs(model, prompt, completion):
    """log softmax(logits)[token] of each completion token (T = 1), float64, one transformers forward."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def wrong_rows(out_dir, model_dir, rows_per_rank: int, max_staleness: int, tol: float = 2e-4) -> list[str]:
    """Every trained row (both ranks) whose server log-probs are not reproduced by exactly its labelled version
    (float64 recomputation under each version's weights, max |difference| <= ``tol``), or whose staleness is
    outside [0, max_staleness]; also a wrong row count. Empty = every label is the truth."""
    from lit_rl.models.loading import load_causal_lm

    weights = torch.load(os.path.join(out_dir, "weights.pt"))
    models = {}
    for v, state in weights.items():
        m = load_causal_lm(str(model_dir)).double().eval()
        m.load_state_dict({k: t.double() for k, t in state.items()})
        models[v] = m
    wrong = []
    for r in (0, 1):
        rows = torch.load(os.path.join(out_dir, f"rows{r}.pt"))["rows"]
        if len(rows) != rows_per_rank:
            wrong.append(f"rank {r} trained {len(rows)} rows, expected {rows_per_rank}")
        for row in rows:
            stale = row["learner"] - row["version"]
            got = torch.tensor(row["logprobs"], dtype=torch.float64)
            err = {
                v: round(float((_logprobs(m, row["prompt"], row["completion"]) - got).abs().max()), 6)
                for v, m in models.items()
            }
            match = [v for v, e in err.items() if e <= tol]
            # a row generated after another rank's push matches the next version; one whose weights changed
            # part-way matches none
            if match != [row["version"]] or not 0 <= stale <= max_staleness:
                wrong.append(
                    f"rank {r} iteration {row['iteration']}: label {row['version']}, learner "
                    f"{row['learner']}, max |log-prob error| per version {err}"
                )
    return wrong
