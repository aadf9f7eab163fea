"""The CPU KV-cache default of VLLMEngine (rollout/_vllm_memory.py): sized from the model, not from RAM."""

import json

from lit_rl.rollout._vllm_memory import MIN_BYTES, cpu_kv_cache_bytes, kv_bytes_per_token

SMOLLM2 = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "head_dim": 64,
    "max_position_embeddings": 8192,
}


def test_bytes_per_token_of_a_gqa_decoder():
    assert kv_bytes_per_token(SMOLLM2, "float32") == 2 * 30 * 3 * 64 * 4  # 45 KiB: K and V of 3 kv heads
    assert kv_bytes_per_token(SMOLLM2, "bfloat16") == 2 * 30 * 3 * 64 * 2
    no_gqa = {k: v for k, v in SMOLLM2.items() if k not in ("num_key_value_heads", "head_dim")}
    assert kv_bytes_per_token(no_gqa, "float32") == 2 * 30 * 9 * 64 * 4  # head_dim = hidden / heads
    assert kv_bytes_per_token({"hidden_size": 8}, "float32") is None


def test_default_is_two_full_contexts_with_a_floor(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", 128) == MIN_BYTES  # 2 x 128 tokens is tiny
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", None) == 2 * 8192 * 46080  # 755 MB, not 0.3 x RAM
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # the user's explicit vLLM setting wins
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", None) is None
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    assert cpu_kv_cache_bytes(str(tmp_path / "missing"), "float32", None) is None  # a hub id: vLLM decides
