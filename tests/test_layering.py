"""The import arrows of the package: every module on its floor imports only its own floor and those below, and
no set of modules imports itself round a cycle (docs/architecture.md "Floors").

Read from the source with ``ast`` (every import statement, including those inside functions and under
``TYPE_CHECKING``, and every ``"lit_rl.…"`` string a lazy ``importlib`` map could load), so an arrow against the
layering fails here even when the module that would carry it is never imported by a test. ``python
tests/test_layering.py`` prints the upward imports and the cycles (the numbers of issue 27)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lit_rl"

# The floors, lowest first: a module may import its own floor and the floors below it, never above.
FLOORS = {
    "errors": 0,
    "jsonl": 0,
    "core": 0,
    "data": 1,
    "models": 1,
    "runs": 1,
    "checkpoint": 1,
    "report": 1,
    "rewards": 2,
    "rollout": 2,
    "strategies": 2,
    "export": 2,
    "learners": 3,
    "callbacks": 4,
    "cli": 5,
}

# layer -> lit_rl packages it must not import (the first rules, kept: core is also free of every other floor)
FORBIDDEN = {
    "core": (
        "lit_rl.callbacks",
        "lit_rl.learners",
        "lit_rl.rollout",
        "lit_rl.data",
        "lit_rl.rewards",
        "lit_rl.models",
        "lit_rl.cli",
        "lit_rl.runs",
        "lit_rl.strategies",
        "lit_rl.report",
    ),
    "rollout": ("lit_rl.callbacks", "lit_rl.learners", "lit_rl.cli", "lit_rl.runs"),
}


def imported_names(path: Path) -> set[str]:
    """Absolute module names a file imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), plus string
    constants naming a ``lit_rl.`` module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parent = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("lit_rl.")
        ):
            out.add(node.value)
    return out


def _violations(layer: str) -> list[str]:
    bad = []
    for f in sorted((PKG / layer).rglob("*.py")):
        for name in imported_names(f):
            for banned in FORBIDDEN[layer]:
                if name == banned or name.startswith(banned + "."):
                    bad.append(f"{f.relative_to(PKG.parent)} imports {name}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_inwards(layer):
    assert _violations(layer) == []


def modules(pkg: Path | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its ``__init__``)."""
    pkg = pkg or PKG
    out = {}
    for f in pkg.rglob("*.py"):
        parts = f.relative_to(pkg.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph(pkg: Path | None = None) -> dict[str, set[str]]:
    """module -> the lit_rl modules it imports (``from a import b`` is module ``a.b`` when that is a module,
    else ``a``; a name below no module is cut back to the module that holds it)."""
    mods = modules(pkg)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, f in mods.items():
        tree = ast.parse(f.read_text(), filename=str(f))
        here = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("lit_rl.")
            ):
                found.add(node.value.split(":")[0])  # "lit_rl.report:main" entry points too
        graph[name] = {r for n in found if n.startswith("lit_rl") for r in [resolve(n)] if r and r != name}
    return graph


def floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
        for a, bs in graph.items()
        for b in bs
        if floor(a) is not None and floor(b) is not None and floor(b) > floor(a)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_every_package_has_a_floor():
    tops = {name.split(".")[1] for name in modules() if name.count(".") >= 1}
    assert tops <= set(FLOORS), (
        f"give these a floor in FLOORS (and docs/architecture.md): {sorted(tops - set(FLOORS))}"
    )


def test_no_import_runs_upward():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_graph_checker_sees_upward_imports_and_cycles(tmp_path):
    """The detector itself, on a made-up package: an upward function-level import, a TYPE_CHECKING cycle."""
    pkg = tmp_path / "lit_rl"
    for d in ("data", "callbacks"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "data" / "dm.py").write_text("def f():\n    from lit_rl.callbacks.ev import E\n")
    (pkg / "callbacks" / "ev.py").write_text("from lit_rl.callbacks.ro import R\nclass E: ...\n")
    (pkg / "callbacks" / "ro.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .ev import E\nclass R: ...\n"
    )
    g = import_graph(pkg)
    assert upward_imports(g) == ["lit_rl.data.dm (floor 1) imports lit_rl.callbacks.ev (floor 4)"]
    assert cycles(g) == [["lit_rl.callbacks.ev", "lit_rl.callbacks.ro"]]


def test_curriculum_and_rollout_callbacks_do_not_import_each_other():
    cur = imported_names(PKG / "callbacks" / "curriculum.py")
    roll = imported_names(PKG / "callbacks" / "rollout.py")
    assert not any(n.startswith("lit_rl.callbacks.rollout") for n in cur)
    assert not any(n.startswith("lit_rl.callbacks.curriculum") for n in roll)


def test_the_checker_sees_function_level_relative_and_lazy_imports(tmp_path, monkeypatch):
    """The detector itself: each way of importing the callbacks package is reported."""
    pkg = tmp_path / "lit_rl"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "rollout" / "a.py").write_text(
        "def f():\n    from lit_rl.callbacks.rollout import RolloutCallback\n"
    )
    (pkg / "rollout" / "b.py").write_text("from ..callbacks import rollout\n")
    (pkg / "rollout" / "c.py").write_text("_LAZY = {'X': 'lit_rl.callbacks.agent_rollout'}\n")
    (pkg / "rollout" / "d.py").write_text("from lit_rl.rollout.engine import HFEngine\n")
    monkeypatch.setitem(globals(), "PKG", pkg)  # _violations reads the module-level PKG
    assert sorted({v.split(" imports ")[0] for v in _violations("rollout")}) == [
        "lit_rl/rollout/a.py",
        "lit_rl/rollout/b.py",
        "lit_rl/rollout/c.py",
    ]


if __name__ == "__main__":  # the numbers: python tests/test_layering.py
    g = import_graph(Path(sys.argv[1]) / "lit_rl" if len(sys.argv) > 1 else None)
    up, cyc = upward_imports(g), cycles(g)
    print(f"upward imports: {len(up)}", *(f"  {u}" for u in up), sep="\n")
    print(f"import cycles: {len(cyc)}", *(f"  {{{', '.join(c)}}}" for c in cyc), sep="\n")
