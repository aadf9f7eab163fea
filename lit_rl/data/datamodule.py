"""`PromptDataModule`: batches of prompt records for RL iterations, from a built-in task, JSONL files or
a Hugging Face ``datasets`` dataset."""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lit_rl.data.prompts import Prompt, collate_prompts, load_jsonl
from lit_rl.data.tasks import get_task


class _ListDataset(Dataset):
    def __init__(self, items: list[Prompt]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Prompt:
        return self.items[i]


class _InfiniteShuffle(torch.utils.data.Sampler):
    """Endless reshuffled passes over the dataset; RL runs are bounded by ``max_steps``, not epochs.

    Its position is part of the checkpoint (``state_dict``), so a resumed run sees the same prompts.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.pos = n, seed, 0

    def __iter__(self):
        while True:
            epoch, offset = divmod(self.pos, self.n)
            g = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.n, generator=g).tolist()
            for i in order[offset:]:
                self.pos += 1
                yield i

    def __len__(self) -> int:  # Lightning asks; an "epoch" is one pass
        return self.n


class PromptDataModule(L.LightningDataModule):
    """Prompt batches for RL.

    Args:
        task: a built-in task name (``addition``, ``reverse``); mutually exclusive with ``train_files``/``dataset``.
        task_args: keyword arguments of the task (e.g. ``{max_operand: 9}``).
        train_files / heldout_files: JSONL files of prompt records (``prompt`` or ``messages``, ``answer``, ...).
        dataset: a Hugging Face ``datasets`` name or local path, loaded with ``datasets.load_dataset``.
        batch_size: prompts per RL iteration (each is sampled ``group_size`` times by the RolloutCallback).
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
        self._sampler = _InfiniteShuffle(len(self.train_prompts), self.seed)
        self._loaded = True

    def train_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(
            _ListDataset(self.train_prompts),
            batch_size=self.batch_size,
            sampler=self._sampler,
            collate_fn=collate_prompts,
            num_workers=0,  # prompt records are tiny; workers would only copy the sampler state away
        )

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_pos": self._sampler.pos if self._sampler else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setup()
        self._sampler.pos = int(state.get("sampler_pos", 0))
