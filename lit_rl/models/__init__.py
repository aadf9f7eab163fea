"""Model loading and construction: causal LMs, value heads, and the tiny local model builder."""

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
