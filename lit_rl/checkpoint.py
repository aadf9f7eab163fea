"""Checkpoint pieces for exact resume: atomic checkpoint files and directories, and per-rank RNG states.

Lightning 2.6 checkpoints carry the model, optimizers, schedulers, loop progress, datamodule and callback
state, but not the random number generators. RL needs them: the rollout engine samples with torch's global
RNG, so a resumed run only reproduces the uninterrupted one if every rank's generators are exactly where
they were when the checkpoint was written. ``PolicyModule`` saves them through :func:`rng_checkpoint_state`
and restores them with :class:`PendingRNG` right before the first resumed batch reaches the callbacks.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

RNG_KEY = "lit_rl_rng"

# PolicyModule applies restored RNG states in on_after_batch_transfer (see PendingRNG). Lightning warns whenever
# a module overrides that hook while a datamodule is attached, though it then calls the module's, as intended.
warnings.filterwarnings(
    "ignore", message=r"You have overridden `on_after_batch_transfer` in `LightningModule`"
)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic and durable.

    Lightning's own save goes through an fsspec transaction whose temporary file lives in the system temp
    directory: when that is another filesystem the final "rename" is a copy, which a kill can interrupt, and
    nothing is fsynced. Here the bytes go to a temporary file next to the target, are fsynced, then
    ``os.replace`` swaps it in (atomic on POSIX), so a kill at any point leaves either the previous
    checkpoint or the new one, never a torn file. Remote URLs fall back to Lightning's implementation.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left behind by a process killed mid-save
            with contextlib.suppress(OSError):
                stale.unlink()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)  # make the rename itself durable


# ------------------------------------------------------------------ checkpoint directories
# FSDP2 (torch.distributed.checkpoint) and DeepSpeed write a checkpoint as a directory of files from every rank.
# Written in place over the previous one, a kill half-way leaves a directory that mixes two iterations and loads
# without error (new shards with the old loop state). So the strategies write into ``.<name>.partial`` next to
# the target and rank 0 swaps it in once every rank has finished (strategies.SideDirectorySave).
def side_path(final: Path, kind: str) -> Path:
    """``.<name>.partial`` (being written) or ``.<name>.old`` (being replaced) next to ``final``."""
    return final.parent / f".{final.name}.{kind}"


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def swap_in(partial: Path, final: Path) -> None:
    """Make the completely written ``partial`` (a file or a directory) the checkpoint at ``final``.

    A directory cannot atomically replace a non-empty one, so the previous one is renamed aside first
    (``.<name>.old``) and removed after. A kill between the two renames leaves both whole; that state
    (``.old`` present, ``final`` absent) is what :func:`finish_interrupted_swap` completes."""
    old = side_path(final, "old")
    finish_interrupted_swap(final)
    remove_path(old)
    if final.exists() or final.is_symlink():
        os.replace(final, old)
    os.replace(partial, final)
    _fsync_dir(final.parent)
    remove_path(old)


def finish_interrupted_swap(final: Path) -> None:
    """Complete a swap a kill interrupted between its two renames: ``.old`` is only ever present without
    ``final`` after ``.partial`` was written whole (a kill during the writing itself leaves no ``.old``)."""
    old, partial = side_path(final, "old"), side_path(final, "partial")
    if old.exists() and not final.exists() and partial.exists():
        os.replace(partial, final)
        _fsync_dir(final.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse to open directories
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def use_atomic_checkpoint_io(trainer) -> None:
    """Make the trainer's strategy write checkpoint files atomically, unless a custom CheckpointIO is set."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # only the default is replaced; user plugins win
        strategy.checkpoint_io = AtomicCheckpointIO()


# ------------------------------------------------------------------ RNG states
def collect_rng_states() -> dict[str, Any]:
    """This process's torch (CPU and CUDA), numpy and python RNG states, as tensors and plain tuples
    (loadable with ``torch.load(weights_only=True)``)."""
    # the legacy tuple (name, keys, pos, has_gauss, cached_gaussian): numpy's default, typed as tuple | dict
    np_state = cast("tuple[Any, ...]", np.random.get_state(legacy=True))
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    random.setstate(_as_tuple(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def rng_checkpoint_state(trainer) -> dict[str, Any]:
    """Every rank's RNG states, gathered so rank 0 (the one that writes the file) holds them all.

    Must run on every rank (``on_save_checkpoint`` does: Lightning dumps the checkpoint on all ranks).
    """
    mine = collect_rng_states()
    world = getattr(trainer, "world_size", 1)
    if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        per_rank: list[Any] = [None] * world
        torch.distributed.all_gather_object(per_rank, mine)
    else:
        per_rank = [mine]
    return {"per_rank": per_rank}


class PendingRNG:
    """Holds the restored RNG states until the first batch after a restore.

    Restoring inside ``on_load_checkpoint`` would be too early: between the restore and the first rollout
    Lightning still builds the dataloader iterator, which draws from the global torch RNG. The batch-transfer
    hooks run after that fetch and before any ``on_train_batch_start`` callback (the RolloutCallback).
    """

    def __init__(self):
        self.states: dict[str, Any] | None = None

    def load(self, checkpoint: dict[str, Any], rank: int, world_size: int) -> None:
        saved = checkpoint.get(RNG_KEY)
        if saved is None:  # a checkpoint from before RNG states were saved: resume is then not exact
            return
        per_rank = saved["per_rank"]
        if len(per_rank) != world_size:  # a legitimate change of scale; only exactness is lost
            warnings.warn(
                f"checkpoint holds RNG states of {len(per_rank)} rank(s) but this run has "
                f"world_size={world_size}: RNG states are not restored, so the resumed run will not "
                "reproduce the original exactly (that needs the same devices x num_nodes)",
                stacklevel=2,
            )
            return
        self.states = per_rank[rank]

    def apply(self) -> None:
        if self.states is not None:
            set_rng_states(self.states)
            self.states = None
