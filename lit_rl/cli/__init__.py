"""The ``lit-rl`` command. This package stays light: ``lit-rl inspect`` (the rollout report) must not pay for
importing Lightning (~13 s on a small machine). The LightningCLI itself (``main``, ``LitRLCLI``, ...) lives in
``lit_rl.cli.app`` and is imported on first use (``from lit_rl.cli import main`` still works)."""

from __future__ import annotations

import importlib
import os
import sys

from lit_rl.errors import ConfigError  # defined on the lowest floor: callbacks raise it too


def __getattr__(name: str):
    # PEP 562: everything else the package exposes comes from the Lightning-backed app module, lazily.
    if name.startswith("__"):
        raise AttributeError(name)
    app = importlib.import_module("lit_rl.cli.app")
    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module 'lit_rl.cli' has no attribute {name!r}") from None


# The commands, in the order `lit-rl --help` lists them. The LightningCLI ones build models; the others are
# light commands dispatched before Lightning is imported ("module:function" called with the remaining argv,
# returning an exit code). A new light command is one entry here (listed in --help, dispatched, suggested).
LIGHTNING_COMMANDS = {
    "fit": "train (lit-rl fit -c configs/quickstart.yaml); resume a run with --ckpt_path last",
    "validate": "held-out evaluation of a checkpoint (lit-rl validate -c CONFIG --ckpt_path last)",
    "test": "Lightning's test loop on a checkpoint",
    "predict": "Lightning's predict loop on a checkpoint",
}
LIGHT_COMMANDS = {
    "inspect": (
        "lit_rl.report:main",
        "the rollout report of a run directory (lit-rl inspect runs/quickstart)",
    ),
    "models": (
        "lit_rl.cli:_models_main",
        "get a real model as a local directory (lit-rl models smollm2 DIR)",
    ),
    "export": (
        "lit_rl.export:main",
        "a Hugging Face model (or --adapter) from a run or .ckpt (lit-rl export RUN -o DIR)",
    ),
    "explain-trl": ("lit_rl.cli.trl_diff:main", "what a config sets unlike TRL 1.16's defaults (-c CONFIG)"),
}


def _commands() -> dict[str, str]:
    return {**LIGHTNING_COMMANDS, **{k: v[1] for k, v in LIGHT_COMMANDS.items()}}


def top_level_help() -> str:
    """``lit-rl --help``, without importing Lightning (the full parser takes seconds to build)."""
    cmds = _commands()
    width = max(map(len, cmds))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in cmds.items())
    return (
        f"usage: lit-rl [-h] {{{','.join(cmds)}}} ...\n\n"
        "lit_rl: reinforcement-learning post-training of language models with PyTorch Lightning.\n\n"
        f"commands:\n{rows}\n\n"
        "Options of a command: lit-rl COMMAND --help (lit-rl fit --help lists every config field).\n"
        "A config file goes after the command: lit-rl fit -c configs/quickstart.yaml --trainer.max_steps 100\n"
    )


MODELS = {"smollm2": "SmolLM2-135M-Instruct as a Hugging Face directory (lit-rl models smollm2 --help)"}


def _models_main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):  # help, not an error
        rows = "\n".join(f"  {name}  {text}" for name, text in MODELS.items())
        print(
            f"usage: lit-rl models NAME [DIR] [--force]\n\nGet a real model as a local directory (default DIR: "
            f"the cache under ~/.cache/lit_rl).\n\nmodels:\n{rows}"
        )
        return 0
    if argv[:1] != ["smollm2"]:  # nothing or an unknown name: one line naming the choices
        print(
            "lit-rl: error: lit-rl models NAME [DIR]: NAME must be one of: " + ", ".join(MODELS),
            file=sys.stderr,
        )
        return 2
    from lit_rl.models.smollm2 import main as smollm2_main

    return smollm2_main(argv[1:])


def _light_dispatch(argv: list[str]) -> int | None:
    """The exit code of a command handled without Lightning, or None for the LightningCLI."""
    if not argv or argv[0] in ("-h", "--help"):
        print(top_level_help(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    cmd = argv[0]
    if cmd in LIGHT_COMMANDS:
        if cmd == "models":  # saves a model (DeepSpeed's accelerator notice, transformers' bars); export
            from lit_rl.cli import quiet  # imports cli.app, which installs them; inspect must stay light

            quiet.install()
        module, _, func = LIGHT_COMMANDS[cmd][0].partition(":")
        return getattr(importlib.import_module(module), func)(argv[1:])
    if not cmd.startswith("-") and cmd not in LIGHTNING_COMMANDS:
        import difflib

        close = difflib.get_close_matches(cmd, list(_commands()), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        print(
            f"lit-rl: error: unknown command {cmd!r}{hint} Commands: {', '.join(_commands())} "
            "(lit-rl --help)",
            file=sys.stderr,
        )
        return 2
    return None


def console_main() -> None:
    """The ``lit-rl`` console script: runs the CLI and exits 0 (a returned object would become exit code 1);
    a configuration error exits 2 with one line on stderr. The working directory is importable (as with
    ``python -m``), so ``--rollout.rewards.rewards '{mine: my_reward.fn}'`` finds ``./my_reward.py``.
    ``--help``, the light commands (``inspect``, ``models``), an unknown command and the configuration errors of
    ``precheck.py`` never import torch or Lightning."""
    if os.getcwd() not in sys.path and "" not in sys.path:  # before the light commands: explain-trl resolves
        sys.path.insert(0, os.getcwd())  # the config's reward import paths as fit does
    from lit_rl.cli.packaged import resolve_configs

    sys.argv[1:] = resolve_configs(sys.argv[1:])  # -c callbacks/trl_defaults.yaml outside a clone
    code = _light_dispatch(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from lit_rl.cli.precheck import check

    early = check(sys.argv[1:])  # errors that need no model, found in well under 2 s (before Lightning)
    if early is not None and not os.environ.get("LIT_RL_TRACEBACK"):
        print(f"lit-rl: error: {early}", file=sys.stderr)
        sys.exit(2)
    from lit_rl.cli.app import main

    try:
        cli = main()
    except ConfigError as e:
        if os.environ.get("LIT_RL_TRACEBACK"):
            raise
        print(f"lit-rl: error: {e}", file=sys.stderr)
        sys.exit(2)
    _close_engines(cli)  # first: an in-process vLLM engine's own process groups must go before the world's
    _destroy_process_group()


def _close_engines(cli) -> None:
    """Shut down the run's rollout engines (they outlive a fit on purpose: ``EngineBase.teardown``). An
    in-process vLLM engine created the default process group (a one-process run) or its groups inside
    Lightning's; left alive, it shuts down at interpreter exit (vLLM's weakref finalizer), after
    ``_destroy_process_group`` has destroyed every group, and its ``destroy_process_group(<its TP group>)``
    then raised "ValueError: Invalid process group specified" (a ``[rank0]: Traceback`` after a run that had
    exited 0)."""
    from lit_rl.callbacks.rollout import RolloutCallback

    for cb in getattr(getattr(cli, "trainer", None), "callbacks", None) or []:
        if isinstance(cb, RolloutCallback):  # the callbacks that hold an engine
            cb.engine.close()


def _destroy_process_group() -> None:
    """Lightning leaves the process group(s) alive at exit; gloo's worker threads then may still hold work objects
    while the interpreter is torn down, which aborts a finished run ("terminate called without an active
    exception", exit -6; seen after a resumed ZeRO-3 run). Destroying them while Python is alive avoids it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
