"""Async rollouts + DDP + one vLLM server shared by URL (issue 28 item 1), 2 gloo ranks in real processes.

Every rank's producer thread generates against the same server while the trainers update. The weight push
must happen at a version boundary every rank agrees on: no rank's generation may be in flight while the server
reloads, and every rank runs the same number of syncs. Rank 1's requests are slowed (dist_runner's
``SLOW_SERVER_REQUESTS``) so its generation is still running when rank 0 is ready to push.

The truth of "which weights generated this row" is measured, not read from a label: rank 0 saves the learner's
weights at every version, and each trained row's server log-probs are recomputed in float64 under every
version; the row's ``policy_version`` must be the (only) version that reproduces them.
"""

from __future__ import annotations

import time
import types

import pytest
import requests
import torch
from _async_recorder import wrong_rows
from _server_helpers import run_ddp_on_servers

from lit_rl.models.loading import load_causal_lm, load_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LAUNCH = {"num_servers": 1, "max_model_len": 64, "max_num_seqs": 16, "kv_cache_gb": 1, "timeout_s": 600}
STEPS, MAX_STALENESS, PROMPTS, GROUP = 4, 1, 2, 4
LORA = {"r": 4, "lora_alpha": 8}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One launched server with runtime LoRA on (a LoRA policy + ``lora_sync=adapter`` adds the flags), so it
    serves both sync paths: merged weights for a plain policy, adapters for a LoRA one."""
    from lit_rl.rollout.server import VLLMServerEngine

    path = str(tiny_model_dir)
    module = types.SimpleNamespace(
        model=load_causal_lm(path, lora=LORA), tokenizer=load_tokenizer(path), model_path=path
    )
    engine = VLLMServerEngine(launch=LAUNCH, request_timeout_s=60, sync_timeout_s=120, lora_sync="adapter")
    try:
        engine.bind(module)
        yield engine
    finally:
        engine.close()


# adapter first: a merged-weights run leaves its trained weights in the server's base model, under which a later
# adapter run would generate (a server given by URL keeps whatever the last run synced into it)
@pytest.mark.parametrize("sync_path", ["adapter", "merged"])
def test_async_ddp_on_a_shared_server_labels_every_row_with_the_weights_that_generated_it(
    server, tiny_model_dir, tmp_path, sync_path
):
    """Merged weights (reload + prefix-cache reset under the other rank's requests) and the LoRA adapter path
    (rank 0 loads the new adapter and unloads the one the other rank's queued requests name)."""
    url = server.pool.servers[0].url
    lora = (
        ["--model.init_args.lora", "{r: 4, lora_alpha: 8, init_lora_weights: false}"]
        if sync_path == "adapter"
        else []
    )
    out = tmp_path / "rec"
    out.mkdir()
    t0 = time.monotonic()
    run_ddp_on_servers(
        {"urls": [url], "request_timeout_s": 60, "sync_timeout_s": 120, "lora_sync": sync_path},
        tiny_model_dir,
        tmp_path,
        *lora,
        "--trainer.max_steps",
        str(STEPS),
        "--data.init_args.batch_size",
        str(PROMPTS),
        "--rollout.mode",
        "async",
        "--rollout.max_staleness",
        str(MAX_STALENESS),
        "--rollout.sampling.max_new_tokens",
        "4",
        "--model.init_args.rollout_correction",
        "tis",
        "--rollout.group_size",
        str(GROUP),
        # a digit anywhere: frequent enough at random init that groups have reward variance, so every step
        # moves the weights
        "--rollout.rewards.init_args.rewards",
        '{fmt: {class_path: lit_rl.rewards.RegexFormatReward, init_args: {pattern: ".*[0-9].*"}}}',
        # large steps: consecutive versions' log-probs differ far beyond TOL, so the check below has power
        "--model.init_args.optimizer.init_args.lr",
        "0.05",
        callbacks=[{"class_path": "_async_recorder.AsyncRowRecorder", "init_args": {"out_dir": str(out)}}],
        env={"SLOW_SERVER_REQUESTS": "1:1.5"},
        timeout=600,
    )
    wall = time.monotonic() - t0
    ranks = {r: torch.load(out / f"rows{r}.pt") for r in (0, 1)}
    assert sorted(torch.load(out / "weights.pt")) == list(
        range(STEPS + 1)
    )  # version 0 (train start) + one push per step

    wrong = wrong_rows(out, tiny_model_dir, STEPS * PROMPTS * GROUP, MAX_STALENESS)
    # the same number of syncs on every rank (the initial load + one per step); the server holds the last
    syncs = [ranks[r]["syncs"] for r in (0, 1)]
    if syncs != [STEPS + 1, STEPS + 1]:
        wrong.append(f"weight syncs per rank {syncs}, expected {STEPS + 1} on each")
    served = requests.get(url + "/weight_info", timeout=10).json()["weight_version"]
    if served != str(STEPS + 1):
        wrong.append(f"server weight version {served!r}, expected {STEPS + 1}")
    assert not wrong, "\n".join(wrong)
    assert [ranks[r]["learner"] for r in (0, 1)] == [STEPS, STEPS]
    print(f"2-rank async on a shared server ({sync_path}): {wall:.1f} s wall")
