"""The import arrows of the package: core ← rollout ← callbacks / modules.

Read from the source with ``ast`` (every import statement, including those inside functions, and every
``"lit_rl.…"`` string a lazy ``importlib`` map could load), so an arrow against the layering fails here even
when the module that would carry it is never imported by a test."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lit_rl"

# layer -> lit_rl packages it must not import
FORBIDDEN = {
    "core": ("lit_rl.callbacks", "lit_rl.modules", "lit_rl.rollout", "lit_rl.data", "lit_rl.rewards",
             "lit_rl.models", "lit_rl.cli", "lit_rl.runs", "lit_rl.strategies", "lit_rl.report"),
    "rollout": ("lit_rl.callbacks", "lit_rl.modules", "lit_rl.cli", "lit_rl.runs"),
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("lit_rl."):
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


def test_curriculum_and_rollout_callbacks_do_not_import_each_other():
    cur = imported_names(PKG / "callbacks" / "curriculum.py")
    roll = imported_names(PKG / "callbacks" / "rollout.py")
    assert not any(n.startswith("lit_rl.callbacks.rollout") for n in cur)
    assert not any(n.startswith("lit_rl.callbacks.curriculum") for n in roll)


def test_the_checker_sees_function_level_relative_and_lazy_imports(tmp_path, monkeypatch):
    """The detector itself: each way of importing the callbacks package is reported."""
    pkg = tmp_path / "lit_rl"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "rollout" / "a.py").write_text("def f():\n    from lit_rl.callbacks.rollout import RolloutCallback\n")
    (pkg / "rollout" / "b.py").write_text("from ..callbacks import rollout\n")
    (pkg / "rollout" / "c.py").write_text("_LAZY = {'X': 'lit_rl.callbacks.agent'}\n")
    (pkg / "rollout" / "d.py").write_text("from lit_rl.rollout.engine import HFEngine\n")
    monkeypatch.setitem(globals(), "PKG", pkg)  # _violations reads the module-level PKG
    assert sorted({v.split(" imports ")[0] for v in _violations("rollout")}) == [
        "lit_rl/rollout/a.py", "lit_rl/rollout/b.py", "lit_rl/rollout/c.py"]
