"""Errors every floor of the package may raise (this module imports nothing of lit_rl, so it sits on the lowest
floor; ``lit_rl.cli`` re-exports ``ConfigError`` and prints it as one line)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem found before training; the console script prints it as one line."""
