"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``): two pages made at build time, never stored, so they
cannot go stale.

- ``index.md``: README.md, the site's front page, its ``docs/...`` links made relative to the site.
- ``reference/settings.md``: every setting a user writes in a config, read from its one declaration (the
  ``setting(...)`` fields of the settings groups, ``lit_rl.core.settings``): name, type, default, allowed values
  and doc, per group, with the classes that take the group.
- ``api/*.md``: one page per public package, every name of its ``__all__`` rendered by mkdocstrings from its
  docstring where it is defined (a lazily re-exported name, e.g. ``lit_rl.rollout.VLLMEngine``, included), and
  pages of modules (``core``: the pure math).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def index_page() -> str:
    """README.md with its links into docs/ made relative to the docs directory (the site's root)."""
    return re.sub(r"\]\(docs/", "](", (ROOT / "README.md").read_text())


def _owners() -> list[tuple[type, str]]:
    """The classes that take settings groups whole, and where a config writes their settings."""
    from lit_rl.callbacks import AgentRolloutCallback, RolloutCallback
    from lit_rl.learners import PolicyModule
    from lit_rl.learners.critic import CriticModule
    from lit_rl.learners.distill import DistillModule
    from lit_rl.learners.reward_model import RewardModelModule

    return [
        (PolicyModule, "model.init_args.NAME"),
        (DistillModule, "model.init_args.NAME"),
        (CriticModule, "model.init_args.critic.init_args.NAME"),
        (RewardModelModule, "model.init_args.NAME"),
        (RolloutCallback, "rollout.NAME"),
        (AgentRolloutCallback, "trainer.callbacks[...].init_args.NAME"),
    ]


def _type(t: Any) -> str:
    return inspect.formatannotation(t).replace("typing.", "").replace("collections.abc.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "required"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _groups() -> list[tuple[type, str, str]]:
    """(group, who takes it, where a config writes its fields) in the order the owners declare them; a group
    held by another group's field (``RolloutSettings.sampling``) follows that group."""
    takers: dict[type, list[str]] = {}
    where: dict[type, str] = {}
    for owner, path in _owners():
        for g in owner.settings_groups:
            takers.setdefault(g, []).append(f"`{owner.__name__}`")
            where.setdefault(g, path)
    out: list[tuple[type, str, str]] = []

    def add(g: type, by: str, path: str) -> None:
        out.append((g, by, path.replace("NAME", "<name>")))
        hints = typing.get_type_hints(g)
        for f in dataclasses.fields(g):
            if dataclasses.is_dataclass(hints[f.name]):
                add(hints[f.name], f"`{g.__name__}.{f.name}`", path.replace("NAME", f"{f.name}.NAME"))

    for g, by in takers.items():
        add(g, ", ".join(by), where[g])
    return out


def settings_page() -> str:
    """One table per settings group: name, type, default, allowed values and doc of each setting."""
    from lit_rl.core.settings import choices_of, doc_of

    out = [
        "# Settings reference",
        "",
        "Every setting of every settings group, generated when this site is built from the one declaration of "
        "each (a `setting(...)` field: type, default, allowed values, doc; `lit_rl.core.settings`). The same "
        "declarations give the classes' signatures, `lit-rl fit --help` and the config check.",
        "",
    ]
    for g, by, path in _groups():
        hints = typing.get_type_hints(g)
        out += [
            f"## {g.__name__}",
            "",
            f"`{g.__module__}.{g.__name__}`, taken by {by}; in a config: `{path}`.",
            "",
            "| setting | type | default | allowed values | meaning |",
            "|---|---|---|---|---|",
        ]
        for f in dataclasses.fields(g):
            valid = choices_of(f)
            allowed = ", ".join(f"`{v}`" for v in valid) if valid else ""
            out.append(
                f"| `{f.name}` | `{_cell(_type(hints[f.name]))}` | {_cell(_default(f))} | {allowed} "
                f"| {_cell(doc_of(f))} |"
            )
        out.append("")
    return "\n".join(out)


# API pages: package -> (title, what it holds). Each lists the package's __all__.
PACKAGES = {
    "learners": ("Learners", "The LightningModules that train: policy, distillation, critic, reward model."),
    "callbacks": (
        "Callbacks",
        "Rollouts, evaluation, reference KL, entropy, teachers, monitoring, the inspector.",
    ),
    "rollout": (
        "Rollout",
        "Engines, sampling settings, the rollout pipeline, agent loops, tools and environments.",
    ),
    "rewards": (
        "Rewards",
        "Reward functions, the reward pool, verifiers, the code sandbox and reward models.",
    ),
    "data": ("Data", "Prompt records, the data module, built-in tasks and the experience batch."),
    "models": ("Models", "Loading causal LMs, the tiny test models and the real SmolLM2 checkpoint."),
}
# API pages of whole modules: page -> (title, what it holds, modules)
MODULES = {
    "core": (
        "Core",
        "The pure math (torch only): advantages, policy losses, aggregation, importance weights, KL, the "
        "objective, the registries and how a setting is declared.",
        ["core.advantages", "core.policy_losses", "core.aggregation", "core.importance", "core.kl"]
        + ["core.objective", "core.registry", "core.settings"],
    ),
    "runs": (
        "Runs, checkpoints, export, strategies",
        "Run directories, checkpoint files, exporting the model, strategy presets and errors.",
        ["runs", "checkpoint", "export", "strategies", "errors"],
    ),
}


def public_names(package: str) -> list[tuple[str, str]]:
    """(name in ``__all__``, the dotted path mkdocstrings renders it from) of ``lit_rl.<package>``: a class or
    function from the module that defines it (a lazy re-export is invisible to a static reader), anything else
    (a constant, a type alias) through the package."""
    mod = importlib.import_module(f"lit_rl.{package}")
    lazy: dict[str, str] = getattr(mod, "_LAZY", {})
    out = []
    for name in mod.__all__:
        if name in lazy:
            out.append((name, f"{lazy[name]}.{name}"))
            continue
        obj = getattr(mod, name)
        defined = getattr(obj, "__module__", "") if inspect.isclass(obj) or inspect.isfunction(obj) else ""
        out.append(
            (name, f"{defined}.{name}" if defined.startswith("lit_rl.") else f"lit_rl.{package}.{name}")
        )
    return out


def api_pages() -> dict[str, str]:
    pages = {}
    for package, (title, intro) in PACKAGES.items():
        body = [f"# {title}", "", f"`lit_rl.{package}`: {intro}", "", f"::: lit_rl.{package}", "    options:"]
        body += ["      members: false", "      show_root_heading: false", ""]
        body += [f"::: {path}\n" for _, path in public_names(package)]
        pages[f"api/{package}.md"] = "\n".join(body)
    for page, (title, intro, modules) in MODULES.items():
        body = [f"# {title}", "", intro, ""] + [f"::: lit_rl.{m}\n" for m in modules]
        pages[f"api/{page}.md"] = "\n".join(body)
    return pages


def on_files(files: Files, config: Any) -> Files:
    generated = {"index.md": index_page(), "reference/settings.md": settings_page(), **api_pages()}
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files
