"""The ``lit-rl`` command. This package stays light: ``lit-rl inspect`` (the rollout report) must not pay for
importing Lightning (~13 s on a small machine). The LightningCLI itself (``main``, ``LitRLCLI``, ...) lives in
``lit_rl.cli.app`` and is imported on first use (``from lit_rl.cli import main`` still works)."""
from __future__ import annotations

import importlib
import os
import sys


class ConfigError(ValueError):
    """A configuration problem found before training; the console script prints it as one line."""


def __getattr__(name: str):
    # PEP 562: everything else the package exposes comes from the Lightning-backed app module, lazily.
    if name.startswith("__"):
        raise AttributeError(name)
    app = importlib.import_module("lit_rl.cli.app")
    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module 'lit_rl.cli' has no attribute {name!r}") from None


def console_main() -> None:
    """The ``lit-rl`` console script: runs the CLI and exits 0 (a returned object would become exit code 1);
    a configuration error exits 2 with one line on stderr. The working directory is importable (as with
    ``python -m``), so ``--rollout.rewards.rewards '{mine: my_reward.fn}'`` finds ``./my_reward.py``."""
    if sys.argv[1:2] == ["inspect"]:  # `lit-rl inspect RUN_DIR`: the rollout report, not a LightningCLI subcommand
        from lit_rl.report import main as inspect_main

        sys.exit(inspect_main(sys.argv[2:]))
    if sys.argv[1:2] == ["export"]:  # `lit-rl export RUN_DIR -o DIR`: a Hugging Face model from a checkpoint
        from lit_rl.export import main as export_main

        sys.exit(export_main(sys.argv[2:]))
    if sys.argv[1:2] == ["models"]:  # `lit-rl models smollm2 DIR`: a real checkpoint, without Lightning
        if sys.argv[2:3] != ["smollm2"]:
            print("lit-rl: error: lit-rl models NAME [DIR]: NAME must be one of: smollm2", file=sys.stderr)
            sys.exit(2)
        from lit_rl.models.smollm2 import main as smollm2_main

        sys.exit(smollm2_main(sys.argv[3:]))
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    from lit_rl.cli.app import main

    try:
        main()
    except ConfigError as e:
        if os.environ.get("LIT_RL_TRACEBACK"):
            raise
        print(f"lit-rl: error: {e}", file=sys.stderr)
        sys.exit(2)
