"""Adaptive β (ReferenceKL) and α (EntropyRegularization) are rank-consistent under real 2-process DDP.

Both ranks see different statistics; each must end with the coefficient a single process would compute from the
*global* mean (sum over ranks / token count over ranks), identical on both ranks, and that value is what
``state_dict`` (the checkpoint) holds. Iteration 2 has a rank with no token: it must still join the reduce
(no hang) and add nothing. The runner is tests/callbacks/controllers_ddp_runner.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rl.models.tiny import build_tiny_model

HERE = Path(__file__).resolve().parent


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("controllers_ddp")
    ref = build_tiny_model(d / "ref", layers=2, hidden=64, heads=2, tokenizer="char", seed=1)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port()}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "controllers_ddp_runner.py"), str(d), str(tiny_model_dir), str(ref)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # own process group: rank 1 (Lightning's child) dies with it
    try:
        log = proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(
            "2-rank controller run did not finish in 300 s (a rank skipped the all-reduce?)"
        ) from None
    assert proc.returncode == 0, log[-4000:]
    return [json.loads((d / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_adaptive_beta_is_updated_from_the_global_mean_on_every_rank(ranks):
    r0, r1 = ranks[0]["kl"], ranks[1]["kl"]
    assert len(r0) == len(r1) == 2
    # non-vacuous: the ranks measured different KLs, so a per-rank update would give different β
    m0, m1 = r0[0]["sum"] / r0[0]["count"], r1[0]["sum"] / r1[0]["count"]
    assert abs(m0 - m1) > 1e-4 * abs(m0), (m0, m1)
    assert r1[1]["count"] == 0 and r0[1]["count"] > 0  # iteration 2: rank 1 had no token
    beta = 0.1
    for it in range(2):
        a, b = r0[it], r1[it]
        mean = (a["sum"] + b["sum"]) / (a["count"] + b["count"])
        rows = a["rows"] + b["rows"]  # n_steps = rows of the global batch
        assert a["before"] == b["before"] == pytest.approx(beta, rel=1e-12)
        beta = beta * (1 + (mean / 0.05 - 1) * rows / 100.0)  # Ziegler et al.: no clipping (kl_clip=1e6)
        assert a["after"] == b["after"]  # bitwise identical on both ranks
        assert a["after"] == pytest.approx(beta, rel=1e-12)
    assert ranks[0]["state"]["kl"] == ranks[1]["state"]["kl"] == pytest.approx(beta, rel=1e-12)
    # logged kl/mean of the last iteration: the global mean (here rank 0's, as rank 1 had no token)
    for r in ranks:
        assert r["metrics"]["kl/mean"] == pytest.approx(r0[1]["sum"] / r0[1]["count"], rel=1e-6)


def test_adaptive_entropy_coef_is_updated_from_the_global_mean_on_every_rank(ranks):
    e0, e1 = ranks[0]["entropy"], ranks[1]["entropy"]
    # iteration 1: local means 0.2 (rank 0, below the band) and 1.0 (rank 1, above): a local update would move α
    # up on rank 0 and down on rank 1. The global mean (0.4 + 6.0) / 8 = 0.8 lies inside [0.5, 0.9]: α stays.
    assert e0[0]["after"] == e1[0]["after"] == pytest.approx(0.005, rel=1e-12)
    # iteration 2: rank 0 mean 0.1, rank 1 no token -> global 0.1 < 0.5 -> α + step on both ranks
    assert e0[1]["after"] == e1[1]["after"] == pytest.approx(0.006, rel=1e-12)
    assert ranks[0]["state"]["entropy"] == ranks[1]["state"]["entropy"] == pytest.approx(0.006, rel=1e-12)
    for r in ranks:
        assert r["metrics"]["entropy/mean"] == pytest.approx(0.1, rel=1e-6)
        assert r["metrics"]["entropy/coef"] == pytest.approx(0.005, rel=1e-6)  # the α used in iteration 2


def test_tokens_seen_is_the_sum_over_ranks_on_every_rank(ranks):
    """TokensSeen (the CLI adds it to every run): the run-wide count of trained tokens, not rank 0's share."""
    r0, r1 = ranks[0]["tokens"], ranks[1]["tokens"]
    assert len(r0) == len(r1) == 2
    total = 0
    for a, b in zip(r0, r1):
        total += a["local"] + b["local"]
        assert a["total"] == b["total"] == total
    assert r0[0]["local"] > 0 and r1[0]["local"] > 0
    assert ranks[0]["metrics"]["tokens_seen"] == ranks[1]["metrics"]["tokens_seen"] == total
