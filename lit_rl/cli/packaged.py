"""Config fragments shipped inside the package (``lit_rl/cli/fragments/*.yaml``, package data), so that
``-c callbacks/trl_defaults.yaml`` works from an installed lit_rl as it does in a clone (where
``callbacks/trl_defaults.yaml`` is a link to the shipped file): a ``-c callbacks/NAME.yaml`` that names no file
in the working directory is the shipped ``NAME.yaml``. A file of that name in the working directory wins."""

from __future__ import annotations

from pathlib import Path

FRAGMENTS = Path(__file__).with_name("fragments")
_DIR = Path("callbacks")


def shipped(path: str) -> str | None:
    """The shipped fragment ``path`` stands for, or None (it is a file here, or names no shipped fragment)."""
    p = Path(path)
    if p.parent != _DIR or p.exists():
        return None
    candidate = FRAGMENTS / p.name
    return str(candidate) if candidate.is_file() else None


def resolve_configs(argv: list[str]) -> list[str]:
    """``argv`` with each ``-c`` / ``--config`` value that is a shipped fragment replaced by its path."""
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("-c", "--config") and i + 1 < len(out) and (found := shipped(out[i + 1])):
            out[i + 1] = found
        elif a.startswith("--config=") and (found := shipped(a.split("=", 1)[1])):
            out[i] = f"--config={found}"
    return out
