"""Count the seams between the callbacks and the learner (issue 55, item 1), read from the source with ``ast``.

    python scripts/seam_counts.py [PACKAGE_DIR]      # default: lit_rl/ of this checkout

Prints three numbers (and the sites behind them):

- ``module_writes``: attributes a callback assigns onto a module (``pl_module.x = ...``, ``module.x = ...``,
  ``trainer.lightning_module.x = ...``, ``setattr(pl_module, ...)``) in ``callbacks/``;
- ``own_probes``: ``getattr`` / ``hasattr`` calls whose attribute name (a string literal) is one lit_rl itself
  defines (a method, a class attribute or a ``self.x =`` of some lit_rl class) and not one of Lightning's
  ``Trainer`` / ``LightningModule`` / ``LightningDataModule`` / ``Callback`` or ``torch.nn.Module``'s: a probe
  of lit_rl's own objects, in the whole package and in ``callbacks/``;
- ``hooks_typed``: Lightning callback hooks (methods of a class in ``callbacks/`` named as a hook of
  ``lightning.pytorch.Callback``) whose ``trainer`` and ``pl_module`` parameters are both annotated, of all.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

MODULE_NAMES = {"pl_module", "module"}


def _own_names(pkg: Path) -> set[str]:
    names: set[str] = set()
    for path in pkg.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        names.add(t.attr)
    return names


def _foreign_names() -> set[str]:
    out: set[str] = set()
    for cls in (pl.Trainer, pl.LightningModule, pl.LightningDataModule, pl.Callback, torch.nn.Module):
        out.update(dir(cls))
    # instance attributes Lightning sets in __init__ (not on the class)
    out.update(vars(pl.LightningModule()).keys())
    return out


def _is_module_ref(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in MODULE_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "lightning_module"


def count(pkg: Path) -> dict[str, object]:
    own = _own_names(pkg) - _foreign_names()
    hooks = {n for n in dir(pl.Callback) if n.startswith("on_") or n in ("setup", "teardown")}
    writes, probes, cb_probes, typed, untyped = [], [], [], [], []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent)
        in_callbacks = path.parent.name == "callbacks"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if in_callbacks and isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Attribute) and _is_module_ref(sub.value):
                            writes.append(f"{rel}:{node.lineno} .{sub.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                fn = node.func.id
                if in_callbacks and fn == "setattr" and node.args and _is_module_ref(node.args[0]):
                    writes.append(f"{rel}:{node.lineno} setattr")
                if fn in ("getattr", "hasattr") and len(node.args) >= 2:
                    name = node.args[1]
                    if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value in own:
                        site = f"{rel}:{node.lineno} {fn}(.., {name.value!r})"
                        probes.append(site)
                        if in_callbacks:
                            cb_probes.append(site)
            if in_callbacks and isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in hooks:
                        args = {a.arg: a for a in item.args.args}
                        if "trainer" not in args:
                            continue
                        mod = args.get("pl_module")
                        ok = args["trainer"].annotation is not None and (
                            mod is None or mod.annotation is not None
                        )
                        (typed if ok else untyped).append(f"{rel}:{item.lineno} {node.name}.{item.name}")
    return {
        "module_writes": writes,
        "own_probes": probes,
        "own_probes_callbacks": cb_probes,
        "hooks_typed": typed,
        "hooks_untyped": untyped,
    }


def main() -> None:
    pkg = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "lit_rl"
    c = count(pkg)
    for key in ("module_writes", "own_probes_callbacks", "own_probes", "hooks_untyped"):
        for site in c[key]:  # type: ignore[attr-defined]
            print(f"  {key}: {site}")
    n_typed, n_untyped = len(c["hooks_typed"]), len(c["hooks_untyped"])  # type: ignore[arg-type]
    print(f"module_writes {len(c['module_writes'])}")  # type: ignore[arg-type]
    print(f"own_probes {len(c['own_probes'])} (callbacks/ {len(c['own_probes_callbacks'])})")  # type: ignore[arg-type]
    print(f"hooks_typed {n_typed} of {n_typed + n_untyped}")


if __name__ == "__main__":
    main()
