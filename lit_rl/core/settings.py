"""One declaration per setting: its type, default, allowed values and one-line doc, in one dataclass field.

A *settings group* is a frozen, keyword-only dataclass whose fields are made with :func:`setting`; groups follow
the concepts (the objective, the optimizer step, the model, the rollout, …) and the code that needs a concept
is handed its group whole. A class that takes settings (``PolicyModule``, ``RolloutCallback``) keeps the flat,
TRL-like names users write in recipes: :func:`flat_settings` gives its ``__init__`` a signature made from the
groups' fields and appends each field's doc to the class docstring, so LightningCLI's ``--help``, its config
check and the saved ``config.yaml`` all read the one declaration. :func:`split_settings` turns the flat
keyword arguments back into group instances and refuses an unknown or moved name in one line naming the fix.

Pure Python (no torch, no Lightning): ``core`` groups and the Lightning classes both build on it.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, field, fields
from typing import Any

_DOC, _CHOICES = "lit_rl.doc", "lit_rl.choices"


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A settings field: ``default`` (or ``factory`` for a mutable default), a one-line ``doc`` and, for a
    string chosen from a fixed or registry-backed set, ``choices`` (a sequence, or a callable returning the
    names registered now, so a user's own registration is accepted)."""
    meta = {_DOC: doc, _CHOICES: choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def doc_of(f: Field) -> str:
    return f.metadata.get(_DOC, "")


def choices_of(f: Field) -> tuple[str, ...] | None:
    c = f.metadata.get(_CHOICES)
    if c is None:
        return None
    return tuple(c() if callable(c) else c)


def check_choices(group: Any) -> None:
    """Raise ``ValueError`` ``"<field>=<value>; valid values: a, b"`` for the first field whose value is not one
    of its declared choices."""
    for f in fields(group):
        valid = choices_of(f)
        value = getattr(group, f.name)
        if valid is not None and value not in valid:
            raise ValueError(f"{f.name}={value!r}; valid values: {', '.join(valid)}")


def declared(groups: Iterable[type]) -> dict[str, tuple[type, Field]]:
    """Field name → (its group, the field), over ``groups``; a name declared twice is a programming error."""
    out: dict[str, tuple[type, Field]] = {}
    for g in groups:
        for f in fields(g):
            if f.name in out:
                raise TypeError(
                    f"setting {f.name!r} is declared in both {out[f.name][0].__name__} and {g.__name__}"
                )
            out[f.name] = (g, f)
    return out


def split_settings(
    owner: str, groups: Iterable[type], values: Mapping[str, Any], moved: Mapping[str, str] | None = None
) -> list[Any]:
    """One instance per group from the flat ``values`` (missing fields take their defaults). An unknown name
    raises ``TypeError`` in one line: the new spelling for a ``moved`` name, else the closest declared names."""
    groups = tuple(groups)
    table = declared(groups)
    for name in values:
        if name in table:
            continue
        if moved and name in moved:
            raise TypeError(f"{owner}: setting {name!r} was moved: {moved[name]}")
        close = difflib.get_close_matches(name, list(table), n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise TypeError(f"{owner}: unknown setting {name!r}{hint}")
    return [g(**{f.name: values[f.name] for f in fields(g) if f.name in values}) for g in groups]


# Settings a release removed or moved, per owning class: name -> the one-line fix. Read by the owner's constructor
# and by the CLI (a YAML key the parser refuses names the fix instead of "not accepted").
_REMOVED: dict[type, dict[str, str]] = {}


def removed_settings(owner: type, fixes: Mapping[str, str]) -> None:
    """Declare settings ``owner`` (and its subclasses) no longer take, each with the one-line fix to print."""
    _REMOVED.setdefault(owner, {}).update(fixes)


def removed_fix(cls: type, name: str) -> str | None:
    """The fix for ``name`` if ``cls`` or a base class declared it removed, else None."""
    for klass in cls.__mro__:
        if name in _REMOVED.get(klass, {}):
            return _REMOVED[klass][name]
    return None


def flat_values(*group_instances: Any) -> dict[str, Any]:
    """The flat ``{name: value}`` of group instances (what ``save_hyperparameters`` stores)."""
    return {f.name: getattr(g, f.name) for g in group_instances for f in fields(g)}


def _field_doc(f: Field) -> str:
    valid = choices_of(f)
    doc = doc_of(f)
    return f"{doc} One of: {', '.join(valid)}." if valid else doc


def flat_settings(groups: Iterable[type], *, before: int = 1) -> Callable[[type], type]:
    """Class decorator: the class's ``__init__(self, <head>, **settings)`` gets the signature
    ``(self, <head params>, *, <every group field>)`` (head = its first ``before`` explicit parameters stay first,
    any remaining explicit ones after the settings), and each field's doc is appended to the class docstring's
    ``Args:`` section (which must be the docstring's last section)."""
    groups = tuple(groups)

    def decorate(cls: type[Any]) -> type[Any]:
        init = cls.__init__
        own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
        head, tail = own[: before + 1], own[before + 1 :]  # +1: self
        params = list(head)
        for g in groups:
            hints = typing.get_type_hints(g)
            for f in fields(g):
                default = (
                    f.default
                    if f.default is not MISSING
                    else (
                        f.default_factory() if f.default_factory is not MISSING else inspect.Parameter.empty
                    )
                )
                params.append(
                    inspect.Parameter(
                        f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name]
                    )
                )
        params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in tail]
        init.__signature__ = inspect.Signature(params)
        lines = [f"        {f.name}: {_field_doc(f)}" for g in groups for f in fields(g)]
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
        cls.settings_groups = groups
        return cls

    return decorate


def field_docs(group: type) -> str:
    """The ``Args:`` lines of a group's fields (``name: doc``), to append to its docstring: ``help()`` and
    jsonargparse's ``--help`` of a nested group (``rollout.sampling``) read the docstring."""
    return "\n\n    Args:\n" + "\n".join(f"        {f.name}: {_field_doc(f)}" for f in fields(group)) + "\n"
