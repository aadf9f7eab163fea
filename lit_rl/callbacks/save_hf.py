"""``SaveHFModel``: the final policy and tokenizer in Hugging Face format when training ends (every recipe's
``final_model/``; the save itself is ``lit_rl.export.save_hf_model``, shared with ``lit-rl export``)."""

from __future__ import annotations

import lightning as L
import lightning.pytorch as pl

from lit_rl.runs import run_path


class SaveHFModel(L.Callback):
    """Saves the final policy and tokenizer in Hugging Face format to ``dirpath`` (a relative one is under the run
    directory, ``trainer.default_root_dir``) when training ends -- also when a finished run is resumed with
    ``--ckpt_path last`` and there is nothing left to train. A LoRA policy: ``lora="both"`` (default) writes the
    merged model to ``dirpath`` and the PEFT adapter to ``dirpath/adapter``; ``"merged"`` or ``"adapter"`` only
    one (``lit_rl.export.save_hf_model``, shared with ``lit-rl export``). Under FSDP2 and ZeRO-3 the full weights
    are gathered one parameter at a time on every rank and written by rank 0 (a LoRA policy is merged from the
    gathered tensors)."""

    def __init__(self, dirpath: str = "final_model", lora: str = "both"):
        from lit_rl.export import LORA_SAVE

        if lora not in LORA_SAVE:
            raise ValueError(f"SaveHFModel: lora={lora!r}; valid values: {', '.join(LORA_SAVE)}")
        self.dirpath, self.lora = dirpath, lora
        self._written = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._written = False

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A finished run resumed with --ckpt_path last has nothing to train: Lightning skips the training loop and
        # never calls on_train_end, but the restored weights are the final ones -- write them.
        if not self._written:
            self._save(trainer, pl_module)

    def _save(self, trainer, pl_module) -> None:
        # Every rank comes here (on_train_end / on_fit_end run on all ranks): under FSDP2 / ZeRO-3 the weights are
        # gathered with collectives every rank joins; rank 0 writes.
        from lit_rl.export import save_hf_model

        self._written = True
        save_hf_model(pl_module.model, pl_module.tokenizer, run_path(trainer, self.dirpath), lora=self.lora)
