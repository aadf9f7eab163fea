"""`PromptDataModule`: batches of prompt records for RL iterations, from a built-in task, JSONL files or
a Hugging Face ``datasets`` dataset."""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lit_rl.data.prompts import Prompt, collate_prompts, load_jsonl
from lit_rl.data.tasks import get_task


class _ListDataset(Dataset):
    def __init__(self, items: list[Prompt]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Prompt:
        return self.items[i]


class _InfiniteShuffle(DistributedSampler):
    """Endless reshuffled passes over the dataset; RL runs are bounded by ``max_steps``, not epochs.

    One *global* stream (a fresh permutation per pass, seeded by ``seed + pass``) is cut into global
    batches of ``batch_size × world_size`` prompts; rank r takes slice ``[r·batch_size, (r+1)·batch_size)``
    of each. So 2 ranks × 8 prompts see exactly the prompts of 1 rank × 16, in the same order — the
    data side of the DDP/FSDP equivalence. ``pos`` counts this rank's yielded items (equal on every rank)
    and is part of the checkpoint, so a resumed run sees the same prompts.

    Subclassing ``DistributedSampler`` tells Lightning the sampler is already rank-aware; it would
    otherwise wrap it in a ``DistributedSamplerWrapper``, which materialises the (endless) sampler.
    """

    def __init__(self, n: int, seed: int, batch_size: int = 1, rank: int = 0, world_size: int = 1):
        # No super().__init__: it needs an initialised process group; we only want the type.
        self.n, self.seed, self.pos = n, seed, 0
        self.batch, self.rank, self.world = batch_size, rank, world_size
        self._perm: tuple[int, list[int]] = (-1, [])

    def global_index(self, i: int) -> int:
        """Position in the global stream of this rank's i-th item."""
        b, within = divmod(i, self.batch)
        return b * self.batch * self.world + self.rank * self.batch + within

    def _at(self, k: int) -> int:
        epoch, offset = divmod(k, self.n)
        if self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(self.n, generator=g).tolist())
        return self._perm[1][offset]

    def __iter__(self):
        while True:
            i = self._at(self.global_index(self.pos))
            self.pos += 1
            yield i

    def __len__(self) -> int:  # Lightning asks; an "epoch" is one pass of this rank's share
        return max(1, self.n // self.world)

    def set_epoch(self, epoch: int) -> None:  # the stream position, not Lightning's epoch, drives shuffling
        pass


class PromptDataModule(L.LightningDataModule):
    """Prompt batches for RL.

    Args:
        task: a built-in task name (``addition``, ``reverse``); mutually exclusive with ``train_files``/``dataset``.
        task_args: keyword arguments of the task (e.g. ``{max_operand: 9}``).
        train_files / heldout_files: JSONL files of prompt records (``prompt`` or ``messages``, ``answer``, ...).
        dataset: a Hugging Face ``datasets`` name or local path, loaded with ``datasets.load_dataset``.
        batch_size: prompts per RL iteration *per rank* (Lightning convention; the global batch is
            batch_size × world_size). Each is sampled ``group_size`` times by the RolloutCallback.
        seed: shuffling seed.
    """

    def __init__(
        self,
        task: str | None = "addition",
        task_args: dict[str, Any] | None = None,
        train_files: list[str] | None = None,
        heldout_files: list[str] | None = None,
        dataset: str | None = None,
        dataset_split: str = "train",
        batch_size: int = 16,
        seed: int = 0,
    ):
        super().__init__()
        sources = [s for s in (task if not (train_files or dataset) else None, train_files, dataset) if s]
        if len(sources) != 1:
            raise ValueError("PromptDataModule: set exactly one of task, train_files, dataset")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive number of prompts, got {batch_size}")
        self.task = task if not (train_files or dataset) else None
        if self.task is not None:
            get_task(self.task, **(task_args or {}))  # validates the name and args now, not at fit time
        self.task_args = task_args or {}
        self.train_files, self.heldout_files = train_files, heldout_files
        self.dataset, self.dataset_split = dataset, dataset_split
        self.batch_size, self.seed = batch_size, seed
        self.train_prompts: list[Prompt] = []
        self.heldout_prompts: list[Prompt] = []
        self._sampler: _InfiniteShuffle | None = None
        self._loaded = False

    def setup(self, stage: str | None = None) -> None:
        if self._loaded:
            return
        if self.task is not None:
            self.train_prompts, self.heldout_prompts = get_task(self.task, **self.task_args)
        elif self.train_files:
            self.train_prompts = [p for f in self.train_files for p in load_jsonl(f)]
            self.heldout_prompts = [p for f in (self.heldout_files or []) for p in load_jsonl(f)]
        else:
            import datasets  # optional dependency, only for this source

            ds = datasets.load_dataset(self.dataset, split=self.dataset_split)
            self.train_prompts = [Prompt.from_dict(dict(r), index=i) for i, r in enumerate(ds)]
        if not self.train_prompts:
            raise ValueError("PromptDataModule: the training prompt set is empty")
        self._sampler = _InfiniteShuffle(len(self.train_prompts), self.seed, self.batch_size)
        self._loaded = True

    def train_dataloader(self) -> DataLoader:
        self.setup()
        trainer = getattr(self, "trainer", None)
        if trainer is not None:  # this rank's share of each global batch (batch_size is per rank)
            self._sampler.rank, self._sampler.world = trainer.global_rank, trainer.world_size
            if len(self.train_prompts) < self.batch_size * trainer.world_size:
                raise ValueError(
                    f"PromptDataModule: {len(self.train_prompts)} training prompts cannot fill one global batch of "
                    f"batch_size={self.batch_size} × world_size={trainer.world_size}; lower batch_size or devices")
        return DataLoader(
            _ListDataset(self.train_prompts),
            batch_size=self.batch_size,
            sampler=self._sampler,
            collate_fn=collate_prompts,
            num_workers=0,  # prompt records are tiny; workers would only copy the sampler state away
            # Its own generator: every new iterator (each epoch, and on resume) otherwise draws a seed from the
            # global torch RNG that rollouts sample with, so a resumed run would sample differently.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_pos": self._sampler.pos if self._sampler else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setup()
        self._sampler.pos = int(state.get("sampler_pos", 0))
