"""`lit-rl`: LightningCLI entry point (``lit-rl fit --config configs/quickstart.yaml``)."""
from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI


class LitRLCLI(LightningCLI):
    def instantiate_trainer(self, **kwargs):
        from lit_rl.checkpoint import use_atomic_checkpoint_io

        try:
            trainer = super().instantiate_trainer(**kwargs)
        except Exception as e:  # Lightning's own refusal, plus the alternative that runs here
            hint = _strategy_hint(str(e))
            if hint is None:
                raise
            raise type(e)(f"{e}\n{hint}") from e
        use_atomic_checkpoint_io(trainer)  # a kill mid-save must leave the previous checkpoint loadable
        return trainer


def _strategy_hint(message: str) -> str | None:
    low = message.lower()
    if "fsdp" in low and ("gpu" in low or "cuda" in low):
        return ("lit_rl: on CPU use FSDP2 through ModelParallelStrategy instead: "
                "-c configs/strategies/fsdp.yaml (or configs/strategies/ddp.yaml for plain data parallel).")
    if "deepspeed" in low:
        return ("lit_rl: DeepSpeed runs on GPU machines with `pip install deepspeed`; on CPU use "
                "-c configs/strategies/fsdp.yaml (FSDP2 via ModelParallelStrategy) or configs/strategies/ddp.yaml.")
    return None


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
    if sys.argv[1:2] == ["inspect"]:  # `lit-rl inspect RUN_DIR`: the rollout report, not a LightningCLI subcommand
        from lit_rl.report import main as inspect_main

        sys.exit(inspect_main(sys.argv[2:]))
    main()


if __name__ == "__main__":
    console_main()
