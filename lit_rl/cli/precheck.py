"""The configuration errors ``lit-rl fit`` can find in well under 2 s: before torch, Lightning or the full parser.

Importing torch + Lightning and building LightningCLI's parser takes seconds (about 9 s of CPU here), so a typo
would wait for all of it. This module reads the ``-c`` files and ``--key value`` flags with PyYAML and checks
them against the *source* of the classes they configure (``ast``: parameter names, defaults and ``Literal``
annotations of ``__init__`` / dataclass fields, or of the settings groups of a ``flat_settings`` class;
nothing is imported):

- an unknown key in ``rollout``, ``rollout.sampling``, ``checkpoint``, ``trainer`` or the ``init_args`` of a
  ``model`` / ``data`` class whose ``__init__`` takes no ``**kwargs``: the file and line, and the closest key;
- a value outside a closed set (a ``Literal`` of ``lit_rl/core/names.py``, e.g. ``loss_agg``); a registry
  name (``advantage``, typed ``Literal[...] | str``) only when no ``--imports`` could register another;
- ``rollout.group_size`` below 1, or 1 with a group-relative advantage (``lit_rl.core.group_size``);
- a TRL ``GRPOConfig`` name, at the top level or in a section (``--learning_rate``): the lit_rl setting it is.

It only reports what it is sure of: anything it does not understand (``--print_config``, an interpolation,
a class it cannot find, ``key+`` appends) is left to the full parser, which checks everything again.
``tests/test_cli_precheck.py`` keeps its key lists equal to the real parser's; ``LIT_RL_PRECHECK=0`` skips it.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from functools import cache
from pathlib import Path

import yaml

from lit_rl.cli.errors import unknown_key_text
from lit_rl.cli.trl_names import TRL_ARGS

COMMANDS = ("fit", "validate", "test", "predict")
_NAMES = "lit_rl.core.names"
# Where a section's class is defined: (module, class name). ``trainer`` is Lightning's Trainer.
SECTIONS = {
    "rollout": ("lit_rl.callbacks.rollout", "RolloutCallback"),
    "rollout.sampling": ("lit_rl.rollout.engine", "SamplingConfig"),
    "checkpoint": ("lit_rl.runs", "IterationCheckpoint"),
    "trainer": ("lightning.pytorch.trainer.trainer", "Trainer"),
}
_NOT_A_VALUE = object()


class _Unsure(Exception):
    """The command line holds something this module does not model: leave it to the full parser."""


# ------------------------------------------------------------------ source reading (no imports)
def _module_file(module: str) -> Path | None:
    """The source file of ``module`` without importing it (nor its parent packages past the top one)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)  # a top-level lookup imports nothing
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin) if spec and spec.origin and not rest else None
    base = (
        Path(next(iter(spec.submodule_search_locations))).joinpath(*rest.split("."))
        if rest
        else Path(next(iter(spec.submodule_search_locations)))
    )
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@cache
def _literals() -> dict[str, tuple[str, ...]]:
    """``name -> values`` of every ``Name = Literal[...]`` in lit_rl/core/names.py."""
    out = {}
    for node in _tree(_module_file(_NAMES)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _literal_values(node.value, {})
            if values is not None:
                out[node.targets[0].id] = values
    return out


def _literal_values(node, known: dict) -> tuple | None:
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        consts = [e for e in elts if isinstance(e, ast.Constant)]
        if len(consts) == len(elts):
            return tuple(e.value for e in consts)
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    return None


def _choices(annotation) -> tuple[tuple, bool] | None:
    """(allowed values, open) of a parameter annotation: a closed ``Literal`` (possibly ``| None``), or
    ``open`` when it is ``Literal[...] | str`` (a registry name). None when it is not a ``Literal`` at all."""
    known = _literals()
    parts, stack = [], [annotation]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
            stack += [n.left, n.right]
        else:
            parts.append(n)
    values: list = []
    is_open, found = False, False
    for p in parts:
        lit = _literal_values(p, known)
        if lit is not None:
            values += lit
            found = True
        elif isinstance(p, ast.Constant) and p.value is None:
            values.append(None)
        elif isinstance(p, ast.Name) and p.id == "str":
            is_open = True
        else:
            return None
    return (tuple(values), is_open) if found else None


def _find(module: str, name: str, depth: int = 0) -> tuple[str, ast.stmt] | None:
    """(defining module, node) of the module-level class or assignment ``name`` of ``module``, following
    ``from x import Name`` re-exports (lit_rl.learners.PolicyModule)."""
    path = _module_file(module)
    if path is None or depth > 4:
        return None
    for node in _tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return module, node
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _find(node.module, alias.name, depth + 1)
    return None


def _find_class(module: str, name: str) -> ast.ClassDef | None:
    found = _find(module, name)
    return found[1] if found and isinstance(found[1], ast.ClassDef) else None


def _group_classes(module: str, node) -> list[tuple[str, ast.ClassDef]] | None:
    """The settings-group classes a ``flat_settings(...)`` argument names: a tuple of class names (``*NAME``
    spreads another tuple) or the name of a module-level tuple; None for anything else."""
    if isinstance(node, ast.Name):
        found = _find(module, node.id)
        if found is None:
            return None
        where, stmt = found
        if isinstance(stmt, ast.ClassDef):
            return [(where, stmt)]
        return _group_classes(where, stmt.value) if isinstance(stmt, ast.Assign) else None
    if isinstance(node, ast.Starred):
        return _group_classes(module, node.value)
    if isinstance(node, ast.Tuple):
        out = []
        for e in node.elts:
            part = _group_classes(module, e)
            if part is None:
                return None
            out += part
        return out
    return None


def _group_fields(module: str, cls: ast.ClassDef) -> dict:
    """``{field: (default, annotation)}`` of a settings-group dataclass, its dataclass bases' fields first."""
    out = {}
    for base in cls.bases:
        found = _find(module, base.id) if isinstance(base, ast.Name) else None
        if found and isinstance(found[1], ast.ClassDef):
            out.update(_group_fields(found[0], found[1]))
    out.update(
        {
            n.target.id: (_default(n.value), n.annotation)
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
    )
    return out


def _flat_settings(module: str, cls: ast.ClassDef) -> dict | None:
    """The settings a ``@flat_settings(groups)`` class takes (``core.settings``), None without the decorator
    or when its groups cannot be read."""
    for d in cls.decorator_list:
        if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "flat_settings" and d.args:
            groups = _group_classes(module, d.args[0])
            if groups is None:
                return None
            out = {}
            for gmod, g in groups:
                out.update(_group_fields(gmod, g))
            return out
    return None


@cache
def signature(module: str, name: str) -> tuple[dict, bool] | None:
    """``({param: (default or _NOT_A_VALUE, annotation node)}, takes_kwargs)`` of the class's ``__init__`` (or
    its dataclass fields); None when the class or its ``__init__`` cannot be read from the source."""
    found = _find(module, name)
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    cls = found[1]
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        if any(
            (isinstance(d, ast.Name) and d.id == "dataclass")
            or (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass")
            for d in cls.decorator_list
        ):
            return _group_fields(found[0], cls), False
        return None
    a = init.args
    params = a.posonlyargs + a.args
    defaults = [_NOT_A_VALUE] * (len(params) - len(a.defaults)) + [_default(d) for d in a.defaults]
    out = {p.arg: (d, p.annotation) for p, d in zip(params, defaults) if p.arg != "self"}
    out.update(
        {
            p.arg: (_default(d) if d is not None else _NOT_A_VALUE, p.annotation)
            for p, d in zip(a.kwonlyargs, a.kw_defaults)
        }
    )
    settings = _flat_settings(found[0], cls)
    if settings is not None:  # **settings takes exactly the groups' fields
        return {**out, **settings}, False
    return out, a.kwarg is not None


def _default(node):
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setting":  # core.settings.setting
        node = node.args[0] if node.args else None
    try:
        return ast.literal_eval(node) if node is not None else _NOT_A_VALUE
    except ValueError:
        return _NOT_A_VALUE


def section_keys(section: str) -> list[str] | None:
    """The option names of a fixed section (``rollout``, ``checkpoint``, ...), from its class's source."""
    sig = signature(*SECTIONS[section])
    return None if sig is None or sig[1] else sorted(sig[0])


# ------------------------------------------------------------------ the command line
def _set(cfg: dict, dotted: str, value, origin: dict, source: str) -> None:
    *parents, leaf = dotted.split(".")
    d = cfg
    for p in parents:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[leaf] = value
    origin[dotted] = source


def _merge(dst: dict, src: dict, origin: dict, source: str, prefix: str = "") -> None:
    for k, v in src.items():
        if not isinstance(k, str):
            raise _Unsure
        key = f"{prefix}{k}"
        if k.endswith("+"):
            raise _Unsure  # list appends: jsonargparse's own semantics
        if (
            isinstance(v, dict)
            and isinstance(dst.get(k), dict)
            and (v.get("class_path") in (None, dst[k].get("class_path")))
        ):
            _merge(dst[k], v, origin, source, key + ".")
        else:
            dst[k] = v
            origin[key] = source
            if isinstance(v, dict):
                _mark(v, origin, source, key + ".")


def _mark(d: dict, origin: dict, source: str, prefix: str) -> None:
    for k, v in d.items():
        origin[f"{prefix}{k}"] = source
        if isinstance(v, dict):
            _mark(v, origin, source, f"{prefix}{k}.")


def parse(argv: list[str]) -> tuple[dict, dict] | None:
    """``(merged config, {dotted key: "flag" | file})`` of a ``fit``-like command line, or None to skip."""
    cfg: dict = {}
    origin: dict = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help") or a.startswith("--print_config"):
            return None
        if a in ("-c", "--config") or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else None)
            i += 1 if "=" in a else 2
            if path is None or not Path(path).is_file():
                return None  # the full parser names the missing file
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                return None
            _merge(cfg, loaded, origin, path)
            continue
        if not a.startswith("--"):
            return None
        key, eq, value = a[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                return None  # a flag without a value: not modelled
            value, i = argv[i + 1], i + 1
        i += 1
        if not key or "+" in key:
            return None
        parsed = yaml.safe_load(value) if value.strip() else value
        _set(cfg, key, parsed, origin, "flag")
    return cfg, origin


def _walk(d: dict, prefix: str = ""):
    for k, v in d.items():
        yield f"{prefix}{k}", v


def _unknown(key: str, valid: list[str], origin: dict, argv: list[str], section: str) -> str:
    keys = [f"{section}.{k}" for k in valid]
    return unknown_key_text(key, keys, argv, from_flag=origin.get(key) == "flag")


def _check_values(section: str, values: dict, sig: dict, imports: bool) -> str | None:
    for k, v in values.items():
        if k not in sig or isinstance(v, (dict, list)) or (isinstance(v, str) and "${" in v):
            continue
        ch = _choices(sig[k][1])
        if ch is None:
            continue
        allowed, is_open = ch
        if v in allowed or (is_open and (imports or not isinstance(v, str))):
            continue
        names = [x for x in allowed if x is not None]
        close = difflib.get_close_matches(str(v), [str(x) for x in names], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if (
            is_open
        ):  # a registry name: the registry's own text (core/registry.py), which the module would raise
            return (
                f"{k}={v!r} is not a known {k}; valid names: {', '.join(sorted(map(str, names)))} (or a name "
                f"registered by a module given with --imports){hint}"
            )
        return f"{section}.{k}: {v!r} is not one of: {', '.join(map(str, names))}{hint}"
    return None


def _class_sig(section_cfg) -> tuple[str, dict, bool] | None:
    if not isinstance(section_cfg, dict) or not isinstance(section_cfg.get("class_path"), str):
        return None
    module, _, name = section_cfg["class_path"].rpartition(".")
    if not module:
        return None
    try:
        sig = signature(module, name)
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    return (name, *sig) if sig else None


def check(argv: list[str]) -> str | None:
    """The first configuration error of ``argv`` (``["fit", "-c", ...]``) this module is sure of, or None.
    ``LIT_RL_PRECHECK=0`` switches it off (a false alarm's escape hatch; ``scripts/bench_cli_startup.py``)."""
    if not argv or argv[0] not in COMMANDS or os.environ.get("LIT_RL_PRECHECK") == "0":
        return None
    try:
        parsed = parse(argv)
    except (_Unsure, yaml.YAMLError, OSError, UnicodeDecodeError):
        return None  # a YAML syntax error or an unreadable file: the full parser's message
    if parsed is None:
        return None
    cfg, origin = parsed
    for key in cfg:  # no top-level option of lit-rl is a TRL GRPOConfig name (--learning_rate)
        if key in TRL_ARGS and key in origin:
            return unknown_key_text(key, [], argv, from_flag=origin[key] == "flag")
    imports = bool(cfg.get("imports"))
    # A RolloutCallback still listed under trainer.callbacks fills what the rollout section leaves unset.
    rollout = dict(cfg.get("rollout") or {}) if isinstance(cfg.get("rollout") or {}, dict) else {}
    for cb in (
        (cfg.get("trainer") or {}).get("callbacks") or [] if isinstance(cfg.get("trainer"), dict) else []
    ):
        if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("RolloutCallback"):
            if cb["class_path"].rsplit(".", 1)[-1] != "RolloutCallback":
                return None  # a subclass (AgentRolloutCallback) has its own arguments
            for k, v in (cb.get("init_args") or {}).items():
                rollout.setdefault(k, v)
    for section in ("rollout", "checkpoint", "trainer", "rollout.sampling"):
        values = (
            rollout.get("sampling")
            if section == "rollout.sampling"
            else (rollout if section == "rollout" else cfg.get(section))
        )
        if not isinstance(values, dict):
            continue
        sig = signature(*SECTIONS[section])
        if sig is None:
            continue
        params, kwargs = sig
        for key, _ in _walk(values, section + "."):
            if not kwargs and key.rsplit(".", 1)[-1] not in params and key in origin:
                return _unknown(key, sorted(params), origin, argv, section)
        msg = _check_values(section, values, params, imports)
        if msg:
            return msg
    model = _class_sig(cfg.get("model"))
    for section in ("model", "data"):
        found = model if section == "model" else _class_sig(cfg.get("data"))
        init = (cfg.get(section) or {}).get("init_args") if isinstance(cfg.get(section), dict) else None
        if found is None or not isinstance(init, dict):
            continue
        _, params, kwargs = found
        for key, _ in _walk(init, f"{section}.init_args."):
            if not kwargs and key.rsplit(".", 1)[-1] not in params and key in origin:
                return _unknown(key, sorted(params), origin, argv, f"{section}.init_args")
        if section == "data" and (init.get("train_files") or init.get("dataset")):
            init = {
                k: v for k, v in init.items() if k != "task"
            }  # replaced by the files (app._one_prompt_source)
        msg = _check_values(f"{section}.init_args", init, params, imports)
        if msg:
            return msg
    return _check_group_size(cfg, rollout, model)


def _check_group_size(cfg: dict, rollout: dict, model) -> str | None:
    from lit_rl.core.group_size import check_group_size

    size = rollout.get("group_size", _NOT_A_VALUE)
    if size is _NOT_A_VALUE:
        sig = signature(*SECTIONS["rollout"])
        size = sig[0].get("group_size", (_NOT_A_VALUE,))[0] if sig else _NOT_A_VALUE
    if not isinstance(size, int) or isinstance(size, bool):
        return None  # a string or interpolation: the full parser's type check
    init = ((cfg.get("model") or {}).get("init_args") or {}) if isinstance(cfg.get("model"), dict) else {}
    params = model[1] if model else {}

    def setting(name):
        if name in init:
            return init[name]
        default = params.get(name, (None,))[0]
        return None if default is _NOT_A_VALUE else default

    advantage = setting("advantage")
    rl_coef = setting("rl_coef") if "rl_coef" in init or "rl_coef" in params else None
    if not isinstance(advantage, (str, type(None))) or (isinstance(advantage, str) and "${" in advantage):
        return None
    try:
        check_group_size(advantage, size, rl_coef)
    except ValueError as e:
        return str(e)
    return None
