"""Per-request sampling seeds differ per rank and each rank's cursor survives a checkpoint (2 real gloo ranks).

Before ranks were folded into the seed, every rank's vLLM engine started its cursor at 0 with the same seed, so
prompt i of every rank got the same sampling noise; and the checkpoint held rank 0's cursor only, so a rank
that had generated more (dynamic-sampling refills) replayed seeds after a resume. The runner is
tests/rank_seeds_runner.py (no server or vLLM model: the request bodies and the checkpoint are under test;
HFEngine's unseeded stream on a tiny model).
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rl.rollout.base import SEED_MOD, rank_seed

HERE = Path(__file__).resolve().parent
N, SEED = 4, 7


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("rank_seeds")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port(), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "rank_seeds_runner.py"), str(d), str(tiny_model_dir)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in (0, 1)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            raise AssertionError("2-rank seed run did not finish in 240 s") from None
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return [json.loads((d / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_rank_seed_rule():
    assert rank_seed(SEED, 0) == SEED  # one process: the seeds it always had
    b1, b2 = rank_seed(SEED, 1), rank_seed(SEED, 2)
    assert len({SEED, b1, b2}) == 3 and all(0 <= b < SEED_MOD for b in (b1, b2))
    assert rank_seed(SEED, 1) == b1 and rank_seed(SEED + 1, 1) != b1  # a function of (seed, rank) only


@pytest.mark.slow  # two processes importing Lightning: ~30 s on 2 shared cores
@pytest.mark.parametrize("engine", ["server", "local"])
def test_ranks_sample_with_different_seeds(ranks, engine):
    r0, r1 = (r[f"{engine}_seeds"] for r in ranks)
    b0, b1 = rank_seed(SEED, 0), rank_seed(SEED, 1)
    assert r0 == [b0]
    assert r1 == [b1, b1 + N]  # the cursor steps by n per prompt, from this rank's own base
    assert b0 != b1
    used = [set(range(s, s + N)) for s in r0 + r1]  # vLLM gives sample k of a request seed + k
    assert not set.intersection(*used[:1], used[1] | used[2])  # no sample of rank 1 shares rank 0's noise


@pytest.mark.slow
def test_server_request_carries_the_seed_and_n(ranks):
    assert ranks[0]["server_n"] == [N] and ranks[1]["server_n"] == [N, N]


@pytest.mark.slow
@pytest.mark.parametrize("i", [0, 1], ids=["server", "local"])
def test_each_rank_restores_its_own_cursor(ranks, i):
    for rank, r in enumerate(ranks):
        got = r["restored"][i]
        assert got["cursor"] == N * (rank + 1)  # rank 1 sent two prompts, rank 0 one
        assert got["next"] == rank_seed(SEED, rank) + N * (rank + 1)  # continues, never replays


@pytest.mark.slow
def test_hf_unseeded_sampling_differs_per_rank_and_replays(ranks):
    """Every rank's global torch generator starts from the same seed (seed_everything); unseeded HFEngine
    samples must still differ between ranks, and replay exactly from the same generator state (resume)."""
    (a0, a1), (b0, b1) = ranks[0]["hf"], ranks[1]["hf"]
    assert a0 == a1 and b0 == b1  # reproducible from the (checkpointed) per-rank generator state
    assert a0 != b0  # same prompt, same global seed, different ranks: different samples


@pytest.mark.slow
def test_hf_seeded_sampling_is_rank_independent_and_replays(ranks):
    """``sampling.seed`` with HFEngine: a prompt's samples are a function of (seed, generate call, prompt tokens,
    occurrence in its batch) alone, so rank 1 draws the same group as rank 0 for the same prompt at the same
    call (what lets 2 ranks x 8 prompts train exactly like 1 x 16, tests/test_distributed.py), and each rank
    replays it. A rank folded into the seed broke that identity (max weight difference 6e-3 after 3 steps)."""
    (a0, a1), (b0, b1) = ranks[0]["hf_seeded"], ranks[1]["hf_seeded"]
    assert a0 == a1 and b0 == b1
    assert a0 == b0, "the seeded samples depend on the rank"
    assert len({tuple(c) for c in a0}) > 1  # 4 samples at temperature 1, not one repeated row
