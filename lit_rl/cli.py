"""`lit-rl`: LightningCLI entry point (``lit-rl fit --config configs/quickstart.yaml``)."""
from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI


class LitRLCLI(LightningCLI):
    pass


def main(args: list[str] | None = None) -> LitRLCLI:
    """Run the CLI; returns the LightningCLI object (its ``trainer`` and ``model``) for programmatic use."""
    import lightning as L

    return LitRLCLI(
        L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
        parser_kwargs={"parser_mode": "omegaconf"}, save_config_kwargs={"overwrite": True},
        args=sys.argv[1:] if args is None else args,
    )


def console_main() -> None:
    """The ``lit-rl`` console script: runs the CLI and exits 0 (a returned object would become exit code 1)."""
    main()


if __name__ == "__main__":
    console_main()
