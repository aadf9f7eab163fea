"""What a ``lit-rl`` run prints: the progress bar, lit_rl's own lines, and nothing foreign (issue 24).

Each filter below drops exactly one known message of a dependency, by its text, so a new warning still shows.
Installed once, by ``lit_rl.cli.app`` on import, before Lightning / transformers / DeepSpeed log anything.
``tests/test_cli_output.py`` runs a short quickstart and checks its whole output against an allow-list.
"""
from __future__ import annotations

import logging
import warnings

# (logger name, start of the message) dropped
_LOG_MESSAGES = (
    # accelerate imports deepspeed (when installed) inside transformers' save_pretrained; DeepSpeed then
    # announces at WARNING level that it picked its CPU accelerator, which is what a CPU run wants.
    ("DeepSpeed", "Setting accelerator to CPU"),
    # Lightning's advertisement, printed by every Trainer that has no LitLogger.
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip"),
    ("lightning.fabric.utilities.rank_zero", "💡 Tip"),
)

# (category, message regex) of warnings dropped
_WARNINGS = (
    # Lightning 2.6's own pytree helper against torch >= 2.10; nothing a user can change.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        return not msg.startswith(self.prefixes)


def _delayed_tqdm(factory, args, kwargs):
    """transformers' own bars ("Loading weights", "Writing model shards") flash once per model load / save; a
    bar that appears only after 2 s keeps them for real checkpoints and hides them for tiny ones."""
    kwargs.setdefault("delay", 2.0)
    return factory(*args, **kwargs)


_installed = False


def install() -> None:
    """Install the filters (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    by_logger: dict[str, list[str]] = {}
    for name, prefix in _LOG_MESSAGES:
        by_logger.setdefault(name, []).append(prefix)
    for name, prefixes in by_logger.items():
        logging.getLogger(name).addFilter(_DropMessages(tuple(prefixes)))
    for category, message in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    try:
        from transformers.utils import logging as hf_logging

        if getattr(hf_logging, "set_tqdm_hook", None) is not None:
            hf_logging.set_tqdm_hook(_delayed_tqdm)
    except ImportError:  # transformers is a dependency; a broken install fails later with its own error
        pass
