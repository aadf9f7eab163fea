"""An error on one rank stops every rank, within a bound, with the failing rank's message (2 real gloo processes).

A rank that raises while the others are about to enter a collective must not leave them waiting: the rollout
step and the weight push are each closed by an agreement collective (``lit_rl/callbacks/_agree.py``) after which
every rank raises — the failing rank its own exception, the others ``RankFailure`` naming the rank and carrying its
message. The job is run in a subprocess with a timeout of ``BOUND_S``: a hang fails the test instead of blocking it.
"""

import subprocess
import time

import pytest
from test_distributed import ROOT, _config, _run

BOUND_S = 240  # the whole 2-rank job, start-up included (~40-60 s on 2 shared cores); a hang hits it


@pytest.mark.slow
@pytest.mark.parametrize("rank,where", [(1, "reward"), (0, "generate"), (0, "sync")])
def test_one_rank_failing_stops_every_rank_with_its_message(tmp_path, tiny_model_dir, rank, where):
    """Rank ``rank`` raises in its 2nd reward scoring or generation (the other rank goes on into the training step's
    collectives) or its 2nd weight push (the other rank goes on into the next rollout)."""
    cfg = _config(tmp_path, tiny_model_dir, steps=4)
    t0 = time.monotonic()
    proc, _ = _run(
        tmp_path / "never.pt",
        cfg,
        "-c",
        str(ROOT / "configs/strategies/ddp.yaml"),
        "--trainer.devices",
        "2",
        "--data.init_args.batch_size",
        "8",
        env={"FAIL_AT": f"{rank}:{where}:2", "NAN_AT_ITERATION": ""},
    )
    try:
        log = proc.communicate(timeout=BOUND_S)[0]  # returns once every rank has closed the shared pipe
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"rank {rank} failing in {where} left the job hanging for {BOUND_S} s") from None
    assert proc.returncode != 0
    assert time.monotonic() - t0 < BOUND_S
    msg = f"test: {where} failed on rank {rank}"
    lines = log.splitlines()
    # the failing rank raises its own error; the other rank raises one naming it, with the message
    assert any(line.startswith(f"[rank{rank}]: ValueError: {msg}") for line in lines), log[-4000:]
    assert any(
        line.startswith(f"[rank{1 - rank}]:") and f"rank {rank} failed during" in line and msg in line
        for line in lines
    ), log[-4000:]
    assert not (tmp_path / "never.pt").exists()


_SERVER_SYNC_CHILD = """
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lit_rl.rollout.server import VLLMServerEngine, _ddp_group

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
engine = VLLMServerEngine(urls=["http://127.0.0.1:9"])  # never contacted: the names are refused first
# what bind() sets on every rank of a job sharing the servers: the sync group and the policy's weight names
engine._group, engine._expected_names = _ddp_group(), {"model.w"}
try:
    engine.update_weights([("model.not_w", torch.zeros(1))])
    err = None
except Exception as e:
    err = f"{type(e).__name__}: {e}"
reports = [None, None]
dist.all_gather_object(reports, err)  # the next collective every rank goes on to (RolloutCallback's agreement)
print(f"RANK{rank} seq={engine._sync_seq} stale={engine._stale!r} {err}", flush=True)
# leave together and tear gloo down before the interpreter exits: without it, rank 0 (the store's host) was once
# aborted at exit ("terminate called without an active exception", return code -6) while rank 1 still held its pair
dist.barrier()
dist.destroy_process_group()
"""


def test_server_sync_refusing_the_names_on_rank_0_raises_on_every_rank(tmp_path):
    """``VLLMServerEngine``'s weight sync: rank 0 checks the names and refuses them before the broadcast that tells
    the other ranks how the push went. Rank 0 must still broadcast, or rank 1 waits in that broadcast while rank 0
    waits in the next collective (before: both blocked until the test's timeout). 2 real gloo processes."""
    import os
    import sys

    from test_distributed import _free_port

    script = tmp_path / "child.py"
    script.write_text(_SERVER_SYNC_CHILD)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port(), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(
            "rank 0's refused weight names left the ranks waiting on each other for 90 s"
        ) from None
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out[-3000:]
        line = next(x for x in out.splitlines() if x.startswith(f"RANK{r} "))
        # both ranks: ValueError with rank 0's message; the sequence number not used, the servers not stale
        assert f"RANK{r} seq=0 stale=None ValueError:" in line, line
        assert "missing ['model.w'], unknown ['model.not_w']" in line, line
    assert "rank 0 failed the weight sync" in outs[1]
