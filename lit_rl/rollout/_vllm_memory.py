"""The KV-cache size an in-process vLLM engine gets on a CPU when the user sets none.

On CPU, vLLM reads ``gpu_memory_utilization`` as the fraction of *RAM* to reserve and gives the KV cache all of
it that the process does not already hold: with ``VLLMEngine``'s default 0.3 on a 24 GB machine that is ~7 GB of
KV cache for any model, and a 135M-parameter fit then holds 8.8 GB resident (issue 25; the table in README "A
real checkpoint"). A rollout needs far less: ``cpu_kv_cache_bytes`` sizes it from the model's config instead,
room for ``DEFAULT_SEQS`` sequences of the full context (``max_model_len``), at least ``MIN_BYTES``; vLLM queues
requests that do not fit (slower, never wrong). An explicit ``kv_cache_memory_bytes`` or
``VLLM_CPU_KVCACHE_SPACE`` always wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_SEQS = 2
MIN_BYTES = 256 * 2**20
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}


def kv_bytes_per_token(config: dict, dtype: str) -> int | None:
    """Bytes of key + value cache per token of a standard decoder (None when the config does not say)."""
    cfg = config.get("text_config", config)
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    if not layers or not heads:
        return None
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 4) if head_dim else None


def cpu_kv_cache_bytes(model_path: str, dtype: str, max_model_len: int | None) -> int | None:
    """The default KV-cache size for ``model_path`` on CPU (see the module doc); None = leave it to vLLM
    (``VLLM_CPU_KVCACHE_SPACE`` is set, or the config is not a local decoder config we can read)."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    per_token = kv_bytes_per_token(config, dtype)
    length = max_model_len or config.get("text_config", config).get("max_position_embeddings")
    if not per_token or not length:
        return None
    return max(MIN_BYTES, DEFAULT_SEQS * int(length) * per_token)
