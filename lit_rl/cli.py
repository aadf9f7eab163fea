"""`lit-rl`: LightningCLI entry point (``lit-rl fit --config configs/quickstart.yaml``)."""
from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI


class LitRLCLI(LightningCLI):
    pass


def main(args: list[str] | None = None) -> None:
    import lightning as L

    LitRLCLI(
        L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
        parser_kwargs={"parser_mode": "omegaconf"}, save_config_kwargs={"overwrite": True},
        args=sys.argv[1:] if args is None else args,
    )


if __name__ == "__main__":
    main()
