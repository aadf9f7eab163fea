"""Pieces shared by the in-process `VLLMEngine` (``rollout/vllm.py``) and the server engine
(``rollout/server.py``): prompt fitting, the truncated-log-prob guard, weight-name checks, safetensors weight
files and model-config reads. No vLLM import here."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from lit_rl.rollout.engine import Completion, SamplingConfig


def dtype_name(model) -> str:
    dt = next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt, "auto")


def architectures(path: str) -> list[str]:
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return []
    return list(json.loads(cfg.read_text()).get("architectures") or [])


def check_truncation(sampling: SamplingConfig, allowed: bool, engine: str) -> None:
    """Refuse top-p / top-k unless the engine was told to report the truncated distribution's log-probs."""
    if (sampling.top_p < 1 or sampling.top_k > 0) and not allowed:
        raise ValueError(
            f"sampling.top_p={sampling.top_p}, top_k={sampling.top_k}: vLLM would report logprobs of the "
            "truncated distribution, not the untruncated temperature-scaled one the trainer computes. Use "
            f"top_p=1 and top_k=0, set {engine}(allow_truncated_logprobs=True), or use HFEngine.")


def fit_prompts(prompt_ids, max_new_tokens: int, max_model_len: int, overlong: str, counters: dict):
    """Apply ``overlong_prompts``: returns [(index, ids)] to send and the placeholder for dropped ones.

    A prompt is overlong when ``len(prompt) + max_new_tokens > max_model_len``; ``counters`` gets
    ``prompts_truncated`` / ``prompts_dropped`` incremented.
    """
    limit = max_model_len - max_new_tokens
    if limit < 1:
        raise ValueError(f"sampling.max_new_tokens={max_new_tokens} leaves no room for a prompt within "
                         f"max_model_len={max_model_len}")
    sent = []
    for i, ids in enumerate(prompt_ids):
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError(f"prompt {i} is empty; vLLM needs at least one prompt token")
        if len(ids) > limit:
            if overlong == "error":
                raise ValueError(f"prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                                 f"at most {limit} fit max_model_len={max_model_len}")
            if overlong == "drop":
                counters["prompts_dropped"] += 1
                continue
            counters["prompts_truncated"] += 1
            ids = ids[-limit:]  # the end holds the question and the generation prompt
        sent.append((i, ids))
    return sent, lambda n: [Completion([], [], "dropped") for _ in range(n)]


def check_weight_names(items, expected: set[str] | None) -> None:
    """Every expected name exactly once (vLLM fuses q/k/v and gate/up: a partial set half-writes layers)."""
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError("update_weights got duplicate tensor names")
    if expected is None:
        return
    missing = sorted(expected - set(names))
    unknown = sorted(set(names) - expected)
    if missing or unknown:
        raise ValueError(f"update_weights needs exactly the bound model's weights: missing {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}, unknown {unknown[:5]}"
                         f"{' ...' if len(unknown) > 5 else ''}")


def make_sync_dir(root: str | None = None) -> str:
    """A fresh directory for weight files, in ``/dev/shm`` (memory-backed) where available."""
    if root is None:
        root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="lit_rl_sync_", dir=root)


def write_weights_file(items, sync_dir: str) -> str:
    """Write (name, tensor) pairs to ``sync_dir/model.safetensors`` atomically (readers never see a partial
    file); tied tensors are cloned because safetensors refuses shared storage. Returns the file path."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, t in items:
        t = t.detach().to("cpu").contiguous()
        if t.data_ptr() in seen:
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[name] = t
    tmp = os.path.join(sync_dir, "next.tmp")
    save_file(tensors, tmp)
    del tensors
    path = os.path.join(sync_dir, "model.safetensors")
    os.replace(tmp, path)
    return path

