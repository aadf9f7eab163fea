"""FSDP2 and ZeRO-3 ranks sharing one vLLM server of the user's own (``urls:``), 2 gloo ranks in real processes
(issue 36 item 1).

Sharded weights reach the server through gathers, one collective per parameter (``merged_state_items``), so
every rank must iterate the sync's generator although only rank 0 sends. The first push of a fresh sync-mode
run is the engine's own (``generate`` before any ``update_weights``); it used to hand the lazy generator to
``_sync``, which only rank 0 iterated while rank 1 waited in the sync's broadcast: both blocked until the
process-group timeout (here: the run's limit kills both ranks and fails the test).
"""

from __future__ import annotations

import time
import types

import pytest
import requests
from _server_helpers import run_ddp_on_servers

from lit_rl.models.loading import load_causal_lm, load_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
STEPS = 3


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One launched server; the runs below reach it only by URL, as a server of the user's own."""
    from lit_rl.rollout.server import VLLMServerEngine

    path = str(tiny_model_dir)
    module = types.SimpleNamespace(
        model=load_causal_lm(path), tokenizer=load_tokenizer(path), model_path=path
    )
    engine = VLLMServerEngine(
        launch={
            "num_servers": 1,
            "max_model_len": 64,
            "max_num_seqs": 16,
            "kv_cache_gb": 1,
            "timeout_s": 600,
        },
        request_timeout_s=60,
        sync_timeout_s=120,
    )
    try:
        engine.bind(module)
        yield engine
    finally:
        engine.close()


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_zero3"])
def test_sharded_ranks_sharing_a_server_by_url_finish(server, tiny_model_dir, tmp_path, strategy):
    """3 steps of sync mode; the server must end on the run's last push (the first push + one per step), both
    ranks with it alive. Before the fix this hung in the first push (killed at the 420 s limit)."""
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    url = server.pool.servers[0].url
    t0 = time.monotonic()
    _, ranks = run_ddp_on_servers(
        {"urls": [url], "request_timeout_s": 60, "sync_timeout_s": 120},
        tiny_model_dir,
        tmp_path,
        "--trainer.max_steps",
        str(STEPS),
        "--rollout.sampling.max_new_tokens",
        "4",
        "--data.init_args.batch_size",
        "2",
        strategy=strategy,
        timeout=420,
    )
    wall = time.monotonic() - t0
    assert requests.get(url + "/weight_info", timeout=10).json()["weight_version"] == str(STEPS + 1)
    for r in (0, 1):
        assert ranks[r]["metrics"]["rollout/servers_alive"] == 1.0, (r, ranks[r]["metrics"])
    print(f"2-rank {strategy} on a server by URL, {STEPS} steps: {wall:.1f} s wall")
