"""Runs one `lit-rl fit` (any world size) and saves the final full policy weights from rank 0.

    python tests/dist_runner.py OUT.pt fit -c cfg.yaml [--trainer.devices 2 ...]

Used by tests/test_distributed.py; Lightning's launcher re-executes this script for the extra local ranks.
Sharded parameters (FSDP2 DTensors, ZeRO-3 partitions) are gathered on every rank (collectives), rank 0
writes the file.
"""

import sys

import torch

from lit_rl.cli import main


def _break_engine_on_rank(spec: str) -> None:
    """``KILL_ENGINE=rank:call``: that rank's HFEngine dies (raises) on its call-th generate — a rollout engine
    crash on one rank only; the others are left waiting in the next collective."""
    import os

    from lit_rl.rollout.engine import HFEngine

    rank, call = (int(x) for x in spec.split(":"))
    original = HFEngine.generate

    def generate(self, *a, **kw):
        if int(os.environ.get("LOCAL_RANK", "0")) == rank and self._calls + 1 >= call:
            raise RuntimeError(f"test: rollout engine on rank {rank} died")
        return original(self, *a, **kw)

    HFEngine.generate = generate


def _fail_on_rank(spec: str) -> None:
    """``FAIL_AT=rank:where:call``: that rank raises ``ValueError("test: <where> failed on rank <rank>")`` in its
    call-th reward scoring (``where=reward``), generation (``generate``) or weight push to the engine (``sync``):
    an error on one rank while the others go on towards their next collective."""
    import torch.distributed as dist

    from lit_rl.rewards.pool import RewardPool
    from lit_rl.rollout.engine import HFEngine

    rank, where, call = spec.split(":")
    rank, call = int(rank), int(call)
    cls, attr = {
        "reward": (RewardPool, "score"),
        "sync": (HFEngine, "update_weights"),
        "generate": (HFEngine, "generate"),
    }[where]
    original, calls = getattr(cls, attr), [0]

    def failing(self, *a, **kw):
        if (dist.get_rank() if dist.is_initialized() else 0) == rank:
            calls[0] += 1
            if calls[0] >= call:
                raise ValueError(f"test: {where} failed on rank {rank}")
        return original(self, *a, **kw)

    setattr(cls, attr, failing)


def _kill_job_at_score(call: int) -> None:
    """``KILL_AT_SCORE=k``: rank 0 SIGKILLs its whole process group (itself and the ranks it launched) at its
    k-th reward scoring, i.e. mid-rollout -- a preempted job. The test starts the job in its own session."""
    import os
    import signal

    from lit_rl.rewards.pool import RewardPool

    original, calls = RewardPool.score, [0]

    def score(self, *a, **kw):
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            calls[0] += 1
            if calls[0] >= call:
                sys.stdout.flush()
                os.killpg(os.getpgrp(), signal.SIGKILL)
        return original(self, *a, **kw)

    RewardPool.score = score


def _kill_job_in_save(save: int) -> None:
    """``KILL_IN_SAVE=k``: rank 0 SIGKILLs the whole job inside its k-th checkpoint save, with the save half
    written: FSDP2 after every rank wrote its ``torch.distributed.checkpoint`` shards but before rank 0 writes the
    loop state (``meta.pt``); DeepSpeed after the model states and client state but before the ZeRO optimizer
    partitions. Before saves went to a side directory this left a checkpoint mixing two iterations."""
    import importlib.util
    import os
    import signal

    import lightning.pytorch.strategies.model_parallel as mp

    calls = [0]

    def after(fn):
        def wrapped(*a, **kw):
            out = fn(*a, **kw)
            if int(os.environ.get("LOCAL_RANK", "0")) == 0:
                calls[0] += 1
                if calls[0] >= save:
                    sys.stdout.flush()
                    os.killpg(os.getpgrp(), signal.SIGKILL)
            return out

        return wrapped

    mp._distributed_checkpoint_save = after(mp._distributed_checkpoint_save)
    if importlib.util.find_spec("deepspeed") is not None:
        from deepspeed.runtime.engine import DeepSpeedEngine

        DeepSpeedEngine._save_checkpoint = after(DeepSpeedEngine._save_checkpoint)


def _kill_rank_at_score(spec: str) -> None:
    """``KILL_RANK_AT_SCORE=r:k``: rank r SIGKILLs itself alone at its k-th reward scoring (mid-rollout), after
    writing the kill time to ``$KILL_TIME_FILE``: a rank lost to the OOM killer or a failed node; the other rank
    goes on into the step's collectives."""
    import os
    import signal
    import time

    from lit_rl.rewards.pool import RewardPool

    rank, call = (int(x) for x in spec.split(":"))
    original, calls = RewardPool.score, [0]

    def score(self, *a, **kw):
        if int(os.environ.get("LOCAL_RANK", "0")) == rank:
            calls[0] += 1
            if calls[0] >= call:
                with open(os.environ["KILL_TIME_FILE"], "w") as f:
                    f.write(repr(time.time()))
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *a, **kw)

    RewardPool.score = score


def _record_server_metrics(out_dir: str) -> None:
    """``SERVER_METRICS_DIR=dir``: every rank writes its own VLLMServerEngine's latest ``metrics()`` (its own
    per-server request counts, before Lightning averages them over ranks) to ``dir/rank{LOCAL_RANK}.json``."""
    import json
    import os

    from lit_rl.rollout.server import VLLMServerEngine

    original = VLLMServerEngine.metrics

    def metrics(self):
        m = original(self)
        if self.pool is not None:
            rank = int(os.environ.get("LOCAL_RANK", "0"))
            with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
                json.dump({"urls": [s.url for s in self.pool.servers], "metrics": m}, f)
        return m

    VLLMServerEngine.metrics = metrics


def _slow_server_requests(spec: str) -> None:
    """``SLOW_SERVER_REQUESTS=rank:seconds``: that rank's server requests wait ``seconds`` before they are sent
    (a slow link to the servers on one rank only), so its generation is still running when the other ranks reach
    their next weight push: the interleaving that shared servers must survive."""
    import os
    import time

    from lit_rl.rollout._server_http import ServerPool

    rank, seconds = spec.split(":")
    if int(os.environ.get("LOCAL_RANK", "0")) != int(rank):
        return
    original = ServerPool.complete

    def complete(self, body, n):
        time.sleep(float(seconds))
        return original(self, body, n)

    ServerPool.complete = complete


def _nan_loss_at(iteration: int) -> None:
    """``NAN_AT_ITERATION=k``: every rank's policy loss is NaN in iteration k (its gradients are NaN), so that
    optimizer step must be skipped by the non-finite guard — identically in every strategy."""
    from lit_rl.learners.policy import PolicyModule

    original = PolicyModule._micro_loss

    def micro_loss(self, micro, common):
        parts = original(self, micro, common)
        if self.iteration == iteration:
            parts["policy"] = parts["policy"] * float("nan")
        return parts

    PolicyModule._micro_loss = micro_loss


if __name__ == "__main__":
    import os

    if os.environ.get("KILL_ENGINE"):
        _break_engine_on_rank(os.environ["KILL_ENGINE"])
    if os.environ.get("FAIL_AT"):
        _fail_on_rank(os.environ["FAIL_AT"])
    if os.environ.get("KILL_AT_SCORE"):
        _kill_job_at_score(int(os.environ["KILL_AT_SCORE"]))
    if os.environ.get("KILL_IN_SAVE"):
        _kill_job_in_save(int(os.environ["KILL_IN_SAVE"]))
    if os.environ.get("KILL_RANK_AT_SCORE"):
        _kill_rank_at_score(os.environ["KILL_RANK_AT_SCORE"])
    if os.environ.get("SERVER_METRICS_DIR"):
        _record_server_metrics(os.environ["SERVER_METRICS_DIR"])
    if os.environ.get("SLOW_SERVER_REQUESTS"):
        _slow_server_requests(os.environ["SLOW_SERVER_REQUESTS"])
    if os.environ.get("NAN_AT_ITERATION"):
        _nan_loss_at(int(os.environ["NAN_AT_ITERATION"]))
    out, args = sys.argv[1], sys.argv[2:]
    cli = main(args)
    from lit_rl.models.loading import merged_state_items

    # FSDP2 DTensors and ZeRO-3 partitions are gathered one parameter at a time (collectives on every rank)
    state = {name: t.detach().cpu().clone() for name, t in merged_state_items(cli.model.model)}
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    if cli.trainer.global_rank == 0:
        torch.save({"state": state, "metrics": metrics, "world_size": cli.trainer.world_size}, out)
    from lit_rl.cli import _destroy_process_group

    _destroy_process_group()  # as the lit-rl console script does: no gloo thread outlives the interpreter
