"""The one name → implementation registry used by every pluggable piece of lit_rl.

Each registry holds implementations sharing one signature (e.g. every advantage estimator takes an
``AdvantageInputs`` and returns ``AdvantageOutputs``), so callers look a name up and call it without
branching on the name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named collection of implementations with one shared signature.

    >>> losses = Registry("policy_loss")
    >>> @losses.register("mine")
    ... def mine(inputs): ...
    >>> losses.get("mine") is mine
    True
    """

    def __init__(self, kind: str):
        self.kind = kind  # what the names denote, used in error messages ("advantage", "policy_loss", ...)
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name``; a second registration of the same name is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: name must be a non-empty string, got {name!r}")

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered (by {self._items[name]!r})")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(sorted(self._items))}"
            ) from None

    def check(self, name: str, field: str | None = None) -> str:
        """Validate a configured name at construction time; the error names the config field."""
        if name not in self._items:
            raise ValueError(
                f"{field or self.kind}={name!r} is not a known {self.kind}; "
                f"valid names: {', '.join(sorted(self._items))}"
            )
        return name

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
