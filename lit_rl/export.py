"""Getting the trained model out: one save function (``save_hf_model``) shared by ``SaveHFModel`` (the end of every
recipe) and ``lit-rl export`` (any checkpoint, later).

    lit-rl export RUN_DIR_OR_CKPT -o DIR [--adapter] [--base MODEL]

writes a Hugging Face model directory (``AutoModelForCausalLM.from_pretrained(DIR)``; a LoRA run's adapter merged
into the base weights) and the tokenizer; ``--adapter`` writes a LoRA run's PEFT adapter directory instead
(``PeftModel.from_pretrained(base, DIR)``). The run's ``config.yaml`` says which base model and LoRA settings the
checkpoint belongs to; ``--base`` overrides the base model's path (e.g. when the run was started from another
working directory). A checkpoint directory is read whole into one process: FSDP2's distributed checkpoint
(``torch.distributed.checkpoint`` files) and DeepSpeed's ZeRO-2/3 directory (partitions consolidated to fp32).

Under sharding (FSDP2 DTensors, ZeRO-3 partitions) ``save_hf_model`` is a collective: every rank calls it, each
parameter is gathered whole in turn (``models.loading.merged_state_items``: peak one parameter beyond the
shards), and rank 0 alone writes. Unsharded models (single process, DDP, ZeRO-2) are written by rank 0 alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from lit_rl.jsonl import clean_text

ADAPTER_SUBDIR = "adapter"
LORA_SAVE = ("both", "merged", "adapter")


def is_peft(model) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def is_sharded(model) -> bool:
    """Whether any parameter is a shard: an FSDP2 DTensor (``full_tensor``) or a ZeRO-3 partition (``ds_id``)."""
    return any(
        hasattr(p, "ds_id") or hasattr(p, "full_tensor") for p in model.state_dict(keep_vars=True).values()
    )


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_hf_model(model, tokenizer, out: str | Path, lora: str = "both") -> list[Path]:
    """Write ``model`` and ``tokenizer`` in Hugging Face format under ``out``; returns the directories written
    (empty on ranks other than 0).

    A full model goes to ``out``. A LoRA (PEFT) model: ``lora="both"`` writes the merged model to ``out`` and the
    adapter (with the tokenizer) to ``out/adapter``; ``"merged"`` only the merged model; ``"adapter"`` only the
    adapter, to ``out`` itself. The training model is never modified (merging works on a copy).

    Sharded weights (FSDP2, ZeRO-3) are gathered one parameter at a time, so under a distributed strategy every
    rank must call this at the same point (rank 0 writes). A sharded LoRA policy is gathered whole on rank 0 (the
    merge needs the base weights) and merged from the gathered tensors (``lora_merged_state``)."""
    if lora not in LORA_SAVE:
        raise ValueError(f"lora={lora!r}; valid values: {', '.join(LORA_SAVE)}")
    out = Path(out)
    if _utf8(out) or _rank() != 0:
        return _save(model, tokenizer, out, lora)
    # A folder name that is not UTF-8 (Python holds its bytes as lone surrogates) cannot be handed to the Rust
    # writers (tokenizers, safetensors), which take UTF-8 paths: write into a temporary folder, then move the
    # files in with Python's own file calls, which take any name.
    with tempfile.TemporaryDirectory(prefix="lit_rl_save_") as tmp:
        written = _save(model, tokenizer, Path(tmp), lora)
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                dest = out / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(f, dest)
    return [out / d.relative_to(tmp) for d in written]  # out / Path('.') is out


def _utf8(path: Path) -> bool:
    try:
        str(path.absolute()).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _save(model, tokenizer, out: Path, lora: str) -> list[Path]:
    rank0 = _rank() == 0
    if is_sharded(model):
        from lit_rl.models.loading import full_tensor, lora_merged_state

        full = {}
        for name, p in model.state_dict(keep_vars=True).items():  # a collective per parameter: every rank
            t = full_tensor(p)
            if rank0:
                full[name] = t.to("cpu", copy=True)
        if not rank0:
            return []
        if not is_peft(model):
            model.save_pretrained(out, state_dict=full, safe_serialization=True)
            tokenizer.save_pretrained(out)
            return [out]
        written = []
        if lora in ("both", "adapter"):
            adir = out if lora == "adapter" else out / ADAPTER_SUBDIR
            model.save_pretrained(
                adir, state_dict=full, safe_serialization=True
            )  # peft keeps the LoRA tensors
            tokenizer.save_pretrained(adir)
            written.append(adir)
        if lora != "adapter":
            model.get_base_model().save_pretrained(
                out, state_dict=lora_merged_state(model, full), safe_serialization=True
            )
            tokenizer.save_pretrained(out)
            written.insert(0, out)
        return written
    if not rank0:
        return []
    written = []
    if is_peft(model):
        if lora in ("both", "adapter"):
            adir = out if lora == "adapter" else out / ADAPTER_SUBDIR
            model.save_pretrained(adir, safe_serialization=True)
            tokenizer.save_pretrained(adir)
            written.append(adir)
        if lora == "adapter":
            return written
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return [out, *written]


# ------------------------------------------------------------------------------------------- lit-rl export
def _resolve(source: str) -> tuple[Path, Path]:
    """(checkpoint file or directory, run directory) of a run directory, a ``.ckpt`` file or a checkpoint
    directory (FSDP2 / DeepSpeed)."""
    p = Path(source).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{source!r} does not exist: pass a run directory or a .ckpt file")
    if p.is_dir() and not _checkpoint_dir_kind(p) and p.suffix != ".ckpt":  # a run directory
        ckpt = p / "checkpoints" / "last.ckpt"
        if not ckpt.exists():
            found = (
                sorted(str(c) for c in (p / "checkpoints").glob("*.ckpt"))
                if (p / "checkpoints").is_dir()
                else []
            )
            raise FileNotFoundError(
                f"run directory {source!r} has no checkpoints/last.ckpt"
                + (
                    f"; checkpoints there: {', '.join(found)}"
                    if found
                    else " (nothing to export: was it trained with checkpointing on?)"
                )
            )
        return ckpt, p
    run = p.parent.parent if p.parent.name == "checkpoints" else p.parent
    return p, run


def _checkpoint_dir_kind(p: Path) -> str | None:
    """``"deepspeed"`` (Lightning's DeepSpeed directory: ``checkpoint/`` with the engine's files), ``"dcp"``
    (a ``torch.distributed.checkpoint`` directory, FSDP2's sharded save) or None (not a checkpoint directory)."""
    if not p.is_dir():
        return None
    if (p / "checkpoint").is_dir():
        return "deepspeed"
    if (p / ".metadata").is_file():
        return "dcp"
    return None


def _read_state_dict(ckpt: Path) -> dict:
    """The Lightning module's full state dict of a checkpoint file or directory, in one process (CPU)."""
    import torch

    kind = _checkpoint_dir_kind(ckpt)
    if kind == "deepspeed":
        if not any((ckpt / "checkpoint").glob("*model_states.pt")):
            raise ValueError(
                f"{ckpt} is a DeepSpeed checkpoint directory without model states "
                "(checkpoint/*model_states.pt): an incomplete save?"
            )
        try:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        except ImportError as e:
            raise ValueError(
                f"{ckpt} is a DeepSpeed checkpoint; reading it needs the deepspeed package "
                f"(pip install -e .[deepspeed]): {e}"
            ) from None
        # every rank's partitions merged into fp32 full tensors (ZeRO-2: the fp32 master copy, ZeRO-3: the
        # parameter partitions); keys are the LightningModule's
        sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="checkpoint")
        return {k.removeprefix("_forward_module."): v for k, v in sd.items()}
    if kind == "dcp":
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        state = _load_distributed_checkpoint(ckpt)
    elif ckpt.is_dir():
        raise ValueError(
            f"{ckpt} is a directory but neither a DeepSpeed checkpoint (no checkpoint/ inside) nor a "
            "torch.distributed.checkpoint one (no .metadata)"
        )
    else:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
    sd = state.get("state_dict") if isinstance(state, dict) else None
    if not isinstance(sd, dict):
        raise ValueError(f"{ckpt} is not a Lightning checkpoint (no state_dict)")
    return sd


def _model_args(run: Path) -> dict[str, Any]:
    cfg_path = run / "config.yaml"
    if not cfg_path.exists():
        raise FileNotFoundError(
            f"{cfg_path} not found: the run's config says which base model the checkpoint "
            "belongs to (pass the run directory, or a .ckpt inside <run>/checkpoints)"
        )
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    init = ((cfg.get("model") or {}).get("init_args")) or {}
    if "model" not in init:
        raise ValueError(f"{cfg_path}: no model.init_args.model (the base model of the run)")
    return init


def _beside(run: Path, path: str) -> str:
    """``path`` as the run saw it; a relative path of the run's working directory is looked for beside the run."""
    if not Path(path).expanduser().exists():
        for cand in (run / path, run.parent / path, run.parent.parent / path):
            if (cand / "config.json").exists() or (cand / "adapter_config.json").exists():
                return str(cand)
    return path


def export(source: str, out: str, adapter: bool = False, base: str | None = None) -> list[Path]:
    from lit_rl.models.loading import is_adapter_dir, load_causal_lm, load_tokenizer

    ckpt, run = _resolve(source)
    init = _model_args(run)
    lora, start = init.get("lora"), init.get("adapter")  # start: the adapter directory the run started from
    if adapter and not lora and not start and not is_adapter_dir(init["model"]):
        raise ValueError(
            f"--adapter: the run {str(run)!r} trained without LoRA (model.init_args.lora is null), "
            "so it has no adapter; export the full model without --adapter"
        )
    base = _beside(run, base or init["model"])
    start = _beside(run, start) if start else None
    sd = _read_state_dict(ckpt)
    weights = {k[len("model.") :]: v for k, v in sd.items() if k.startswith("model.")}
    if not weights:
        raise ValueError(
            f"{ckpt} holds no policy weights (no 'model.*' keys); keys start with: "
            f"{sorted({k.split('.')[0] for k in sd})}"
        )
    model = load_causal_lm(base, init.get("dtype") or "float32", lora, adapter=start)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{ckpt} does not match the base model {base!r} with lora={lora}: "
            f"{len(missing)} missing keys (e.g. {missing[:2]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:2]}); pass the run's base model with --base"
        )
    return save_hf_model(model, load_tokenizer(base), out, lora="adapter" if adapter else "merged")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lit-rl export",
        description="Write a Hugging Face model (or, with "
        "--adapter, a LoRA run's PEFT adapter) from a run directory or a .ckpt file.",
    )
    ap.add_argument("source", help="a run directory (its checkpoints/last.ckpt) or a .ckpt file")
    ap.add_argument("-o", "--output", required=True, help="the directory to write")
    ap.add_argument(
        "--adapter", action="store_true", help="a LoRA run: write the PEFT adapter, not the merged model"
    )
    ap.add_argument(
        "--base",
        default=None,
        help="the base model (default: model.init_args.model of the run's config.yaml)",
    )
    a = ap.parse_args(argv)
    try:
        written = export(a.source, a.output, adapter=a.adapter, base=a.base)
    except (FileNotFoundError, ValueError, NotImplementedError, OSError) as e:
        print(f"lit-rl export: error: {e}", file=sys.stderr)
        return 2
    for d in written:  # a folder name that is not UTF-8 holds lone surrogates, which stdout cannot encode
        print(f"wrote {clean_text(str(d))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
