"""Error messages that point at the cause (issue 24): an unknown key names the file and line it came from and the
closest valid key; a failed import path names the missing attribute and what the module has instead."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

_UNKNOWN = (
    re.compile(r"does not accept option '([^']+)'"),  # a key in a -c file
    re.compile(r'Key "([^"]+)" is not expected'),
    re.compile(r"unrecognized arguments: --([\w.\-]+)"),  # a flag
)


def parser_keys(parser, prefix: str = "") -> list[str]:
    """Every option key of a (jsonargparse) parser, subcommands included without their name."""
    keys: list[str] = []
    for action in getattr(parser, "_actions", []):
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and choices and all(hasattr(p, "_actions") for p in choices.values()):
            for sub in choices.values():
                keys.extend(parser_keys(sub, prefix))
        elif action.dest and action.dest not in ("help", "config", "print_config"):
            keys.append(prefix + action.dest)
    return sorted(set(keys))


def _config_files(argv: list[str]) -> list[Path]:
    out = []
    for i, a in enumerate(argv[:-1]):
        if a in ("-c", "--config"):
            out.append(Path(argv[i + 1]))
    out += [Path(a.split("=", 1)[1]) for a in argv if a.startswith("--config=")]
    return [p for p in out if p.is_file()]


def locate_key(key: str, argv: list[str]) -> str | None:
    """``file:line`` of the last ``-c`` file that writes ``key``'s last component (the one that won)."""
    leaf = key.rsplit(".", 1)[-1]
    pattern = re.compile(rf"^\s*(- )?{re.escape(leaf)}\s*:|[{{,]\s*{re.escape(leaf)}\s*:")
    found = None
    for path in _config_files(argv):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                found = f"{path}:{n}"
    return found


def suggest(key: str, keys: list[str]) -> str | None:
    """The closest valid key: among the same section's keys first (``rollout.group_sise`` -> ``rollout.group_size``)."""
    parent = key.rpartition(".")[0]
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    for pool in (siblings, keys):
        close = difflib.get_close_matches(key, pool, n=1, cutoff=0.75)
        if close:
            return close[0]
    return None


def unknown_key_message(message: str, parser, argv: list[str]) -> str | None:
    """A one-line replacement for jsonargparse's unknown-key errors, or None when ``message`` is another error."""
    for rx in _UNKNOWN:
        m = rx.search(message)
        if m:
            key = m.group(1)
            break
    else:
        return None
    return unknown_key_text(
        key, parser_keys(parser), argv, from_flag=message.startswith("unrecognized arguments")
    )


def unknown_key_text(key: str, keys: list[str], argv: list[str], from_flag: bool) -> str:
    """``FILE:LINE: KEY is not an option; did you mean CLOSE? (...)``, or ``--KEY ...`` for a command-line flag;
    shared by the full parser's errors and the early check (``precheck.py``), so both read the same. A TRL
    ``GRPOConfig`` name is answered with the lit_rl setting it becomes (``trl_names.py``), not by spelling."""
    from lit_rl.cli.trl_names import trl_name_text

    where = None if from_flag else locate_key(key, argv)
    trl = trl_name_text(key, as_flag=from_flag)
    if trl:
        return (f"{where}: " if where else "") + trl
    close = suggest(key, keys)
    text = f"{where}: " if where else ""
    text += f"{key} is not an option" if where else f"--{key} is not an option"
    if close:
        text += f"; did you mean {close}?"
    section = key.rpartition(".")[0]
    if section:
        text += f" (lit-rl fit --help lists the {section} options)"
    return text


def pointed_parse_error(parser, message: str, argv: list[str]) -> str:
    """The cause first, on one line: an unknown key with its file:line and the closest valid key (or the lit_rl
    setting a TRL name becomes), a bad import path with what the module has instead; otherwise jsonargparse's
    innermost error. ``argv``: the arguments being parsed (their ``-c`` files are searched for the key)."""
    flat = " ".join(message.split())
    unknown = unknown_key_message(flat, parser, argv)
    if unknown:
        return unknown
    condensed = _condense_parse_error(message)
    key = re.match(r'Parser key "([\w.]+)"', flat)
    option = class_option_message(flat, key.group(1) if key else None)
    if option:
        if key and not option.startswith(key.group(1) + "."):
            return f"{key.group(1)}: {option}"
        return option
    cause = attribute_error_message(flat)
    if cause:
        key = re.match(r'(?:Parser key ")?([\w.]+)"?: ', condensed)
        return f"{key.group(1)}: {cause}" if key else cause
    return condensed


def _condense_parse_error(message: str) -> str:
    """jsonargparse nests a subclass field's error in its union's ("Does not validate against any of the Union
    subtypes ... Problem with given class_path ...: Parser key "loss_agg": ..."): keep the innermost error and
    name the field by the full key path (``model.loss_agg``)."""
    flat = " ".join(message.split())
    keys = re.findall(r'Parser key "([^"]+)"', flat)
    found = list(re.finditer(r'Parser key "[^"]+": ', flat))
    if len(found) < 2:
        return flat
    body = re.split(r" - Expected a <class 'NoneType'>| Given value type:", flat[found[-1].end() :])[0]
    return f"{'.'.join(dict.fromkeys(keys))}: {body.strip()}"


# The section's base class when no class_path was given (LightningCLI's subclass mode), and a class to name.
_NO_CLASS = {
    "LightningModule": ("model", "lit_rl.learners.PolicyModule"),
    "LightningDataModule": ("data", "lit_rl.data.PromptDataModule"),
}


def class_option_message(message: str, section: str | None = None) -> str | None:
    """``Problem with given class_path 'pkg.Cls': Option 'x' is not accepted`` (inside a union dump) -> one line:
    the fix when ``Cls`` declared ``x`` removed (``core.settings.removed_settings``), the lit_rl setting when ``x``
    is a TRL name, that the section has no class yet, else the closest setting. ``section``: where the class
    is configured (``model``), to name the key in full."""
    m = re.search(r"Problem with given class_path '([\w.]+)': Option '(\w+)' is not accepted", message)
    if not m:
        return None
    import importlib
    import inspect

    from lit_rl.cli.trl_names import trl_name_text
    from lit_rl.core.settings import removed_fix

    path, name = m.groups()
    module, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception:  # noqa: BLE001 - not importable here: jsonargparse's own error stands
        return None
    if (fix := removed_fix(cls, name)) is not None:
        return f"{attr}: {fix}"
    params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    if not params and path.startswith("lightning.") and attr in _NO_CLASS:
        where, example = _NO_CLASS[attr]
        return (
            f"no class is set, so {where}.init_args.{name} has nowhere to go: name the class first "
            f"(--{where} {example}, or -c a recipe such as configs/quickstart.yaml)"
        )
    if (trl := trl_name_text(f"{section}.init_args.{name}" if section else name, as_flag=False)) is not None:
        return trl
    close = difflib.get_close_matches(name, params, n=1, cutoff=0.6)
    its = f" (its settings: {', '.join(params)})" if params else " (it takes no settings)"
    hint = f"; did you mean {close[0]!r}?" if close else its
    return f"{attr} has no setting {name!r}{hint}"


# Packages a release renamed: a config's class_path under the old name gets the new spelling in one line.
RENAMED_PACKAGES = {"lit_rl.modules": "lit_rl.learners"}


def _renamed(old: str) -> str:
    return f"{old} was renamed {RENAMED_PACKAGES[old]}: write class_path: {RENAMED_PACKAGES[old]}.<Class>"


def attribute_error_message(message: str) -> str | None:
    """``module 'my_reward' has no attribute 'maxdigit'`` (buried in a union-type dump) -> one line naming what the
    module has instead: ``my_reward has no attribute 'maxdigit'; it has: max_digit``."""
    m = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
    if not m:
        missing = re.search(r"No module named '([\w.]+)'", message)
        if missing and missing.group(1) in RENAMED_PACKAGES:
            return _renamed(missing.group(1))
        if missing:
            return (
                f"no module named {missing.group(1)!r} (the working directory is importable: "
                f"{missing.group(1).replace('.', '/')}.py would be found there)"
            )
        return None
    module, attr = m.groups()
    if f"{module}.{attr}" in RENAMED_PACKAGES:
        return _renamed(f"{module}.{attr}")
    import importlib

    try:
        names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
    except Exception:  # noqa: BLE001 - the module fails to import: no names listed (the error stands)
        names = []
    close = difflib.get_close_matches(attr, names, n=3, cutoff=0.5)
    callables = close or names[:10]
    has = f"; it has: {', '.join(callables)}" if callables else ""
    return f"{module} has no attribute {attr!r}{has}"


def _squashed_flow_keys(text: str) -> list[tuple[int, str]]:
    """(line, key) of every ``{key:value}`` entry written without a space after the colon. YAML reads such an
    entry as the single key ``"key:value"`` with no value (``{acc:1.0}`` is ``{"acc:1.0": null}``), which later
    fails far from the cause (an unknown reward name, a null weight). Text YAML cannot parse yields nothing (the
    parser's own error names it)."""
    import yaml

    try:
        docs = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return []
    found: list[tuple[int, str]] = []

    def walk(node) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if (
                    node.flow_style
                    and isinstance(k, yaml.ScalarNode)
                    and k.style is None
                    and ":" in k.value
                    and isinstance(v, yaml.ScalarNode)
                    and v.tag.endswith(":null")
                    and v.value == ""
                ):
                    found.append((k.start_mark.line + 1, k.value))
                walk(k)
                walk(v)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)

    for doc in docs:
        walk(doc)
    return found


def _flow_fix(key: str) -> str:
    name, _, value = key.partition(":")
    return f"{{{name}: {value}}}"


def flow_mapping_message(argv: list[str]) -> str | None:
    """One line for the first ``{key:value}`` (no space after the colon) in a ``-c`` file or a flag's value:
    where it is, what YAML made of it and the fix; None when there is none."""
    for path in _config_files(argv):
        for line, key in _squashed_flow_keys(path.read_text(errors="replace")):
            return (
                f"{path}:{line}: {{{key}}} needs a space after the colon: write {_flow_fix(key)} (YAML reads "
                f"{{{key}}} as the key {key!r} with no value)"
            )
    flag = None
    for a in argv:
        name, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        if a.startswith("--") and not eq:
            flag = a
            continue
        if value.lstrip().startswith("{"):
            for _, key in _squashed_flow_keys(value):
                where = name or flag or "a value"
                return (
                    f"{where} {value}: {{{key}}} needs a space after the colon: write {_flow_fix(key)} (YAML reads "
                    f"{{{key}}} as the key {key!r} with no value)"
                )
        flag = None
    return None


def union_error_message(e: BaseException | None, config=None) -> str | None:
    """One line for a class that failed to build inside a union-typed field (``trainer.strategy: str | Strategy``).

    jsonargparse tries every member of the union and chains the *first* member's complaint as the cause
    ("Expected a <class 'str'>. Got value: Namespace(class_path=...)"), while the real reason (DeepSpeed is not
    installed) sits in the middle of the union's message. Keep the errors that are not "Expected a <type>" and
    name the class; None when ``e``'s chain holds no such union error."""
    while e is not None:
        text = str(e)
        if "Does not validate against any of the Union subtypes" in text and "Errors:" in text:
            body = text.split("Errors:", 1)[1].split("\nGiven value", 1)[0]
            items = [" ".join(i.split()) for i in re.split(r"\n\s*- ", "\n" + body.strip()) if i.strip()]
            reasons = [
                re.sub(r"^Problem with given class_path '[^']+':\s*", "", i)
                for i in items
                if not re.match(r"Expected a <class '[\w.]+'>", i)
            ]
            if reasons:
                cls = re.search(r"class_path='([\w.]+)'", text)
                where = cls.group(1) if cls else ""
                if cls and config is not None:  # the field that holds the class: trainer.strategy
                    keys = [
                        k.rsplit(".", 1)[0]
                        for k, v in config.items()
                        if k.endswith(".class_path") and v == cls.group(1)
                    ]
                    key = re.sub(r"^(fit|validate|test|predict)\.", "", keys[0]) if keys else None
                    where = f"{key}={where}" if key else where
                return (f"{where}: " if where else "") + "; ".join(reasons)
        e = e.__cause__ or e.__context__
    return None
