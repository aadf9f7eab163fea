"""Every dotted lit_rl name in README.md, docs/ and the package's docstrings resolves: an importable module, or an
attribute of one. A name is checked when it is written out (``lit_rl.learners.PolicyModule``) or, between
backticks, relative to the package (``core.settings.setting``, ``modules.protocols.RolloutSource``); a package
the code no longer has (``modules``, renamed ``learners``) fails with its new name. Config keys that share a
package's name (``rollout.sampling.temperature``, ``data.init_args.seed``, a misspelt ``rollout.group_sise``)
are settings, not code, and are left to the config tests."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

from _docs import markdown_files, text

import lit_rl

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "lit_rl").iterdir() if (p / "__init__.py").exists())
FORMER = {"modules": "learners"}  # package renames: an old root is always stale
FULL = re.compile(r"\blit_rl(?:\.[A-Za-z_]\w*)+")
RELATIVE = re.compile(rf"`((?:{'|'.join([*PACKAGES, *FORMER])})(?:\.[A-Za-z_]\w*)+)")


def resolves(dotted: str) -> bool:
    """The longest importable module prefix of ``dotted``, then attributes down the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _config_sections() -> dict[str, set[str]]:
    """Config sections named like a package, with the keys they take (a key is a setting, not code)."""
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule

    return {
        "rollout": set(inspect.signature(RolloutCallback).parameters),
        "data": set(inspect.signature(PromptDataModule).parameters) | {"init_args"},
    }


def _is_submodule(root: str, key: str, sections: dict[str, set[str]]) -> bool:
    """``root.key`` names code when ``key`` is a module of the package ``root`` and not one of the keys of the
    config section ``root`` (``rollout.engine`` is both: a key)."""
    return key not in sections[root] and (ROOT / "lit_rl" / root / f"{key}.py").exists()


def names(markdown: str, sections: dict[str, set[str]]) -> list[tuple[int, str]]:
    """(line, name as written) of the dotted lit_rl names to resolve in ``markdown``; each as a full name."""
    out = []
    for n, line in enumerate(markdown.splitlines(), 1):
        # a name cut short with "..." is an elided spelling (`lit_rl.modules...`), not a reference
        out += [(n, m.group(0)) for m in FULL.finditer(line) if not line[m.end() :].startswith("...")]
        for m in RELATIVE.finditer(line):
            if line[: m.start()].endswith("lit_rl."):
                continue  # the full name, above
            root, key = m.group(1).split(".")[:2]
            if key in ("py", "md", "html") or (root in sections and not _is_submodule(root, key, sections)):
                continue  # a file name (`report.html`), or a config key
            out.append((n, m.group(1)))
    return out


def docstrings() -> list[tuple[str, int, str]]:
    """(file, first line, docstring) of every module, class and function of the package."""
    out = []
    for f in sorted((ROOT / "lit_rl").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    out.append((str(f.relative_to(ROOT)), node.body[0].lineno, doc))
    return out


def unresolved(files: list[str], docs: list[tuple[str, int, str]] | None = None) -> list[str]:
    sections = _config_sections()
    bad = []
    sources = [(rel, 1, text(rel)) for rel in files] + list(docs or [])
    for rel, first, body in sources:
        for n, name in names(body, sections):
            n += first - 1
            full = name if name.startswith("lit_rl.") else f"lit_rl.{name}"
            root = full.split(".")[1]
            if root in FORMER:
                bad.append(f"{rel}:{n}: {name} (package {root!r} is now {FORMER[root]!r})")
            elif not resolves(full):
                bad.append(f"{rel}:{n}: {name} does not resolve")
    return bad


def test_the_checker_reads_full_and_relative_names_and_skips_config_keys():
    doc = (
        "`lit_rl.learners.PolicyModule` and lit_rl.core.nope, `core.settings.setting`, `lit_rl.modules...`,\n"
        "`modules.protocols.RolloutSource`, `rollout.sampling.temperature`, `data.init_args.seed`, `report.html`\n"
        "`rollout.group_sise` `rollout.render.nope`\n"
    )
    found = names(doc, _config_sections())
    assert found == [
        (1, "lit_rl.learners.PolicyModule"),
        (1, "lit_rl.core.nope"),
        (1, "core.settings.setting"),
        (2, "modules.protocols.RolloutSource"),
        (3, "rollout.render.nope"),
    ]
    assert [resolves(f"lit_rl.{n}" if not n.startswith("lit_rl.") else n) for _, n in found[:3]] == [
        True,
        False,
        True,
    ]


def test_every_dotted_name_in_the_docs_resolves():
    files = markdown_files()
    assert len(files) >= 10 and lit_rl.__name__ == "lit_rl"
    assert unresolved(files) == []


def test_every_dotted_name_in_the_docstrings_resolves():
    docs = docstrings()
    assert len(docs) >= 500  # non-vacuous: the package is documented
    assert unresolved([], docs) == []
