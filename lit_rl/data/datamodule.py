"""`PromptDataModule`: batches of prompt records for RL iterations, from a built-in task, JSONL files or
a Hugging Face ``datasets`` dataset."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lit_rl.core.names import TaskName
from lit_rl.core.seeds import run_seed
from lit_rl.data.prompts import Prompt, collate_prompts, load_jsonl, records_from_rows
from lit_rl.data.tasks import get_task


class NoEvaluation(list):
    """The empty validation "loader" of a fit without evaluation: a list, as Lightning takes it, with a name
    of its own, so ``lit_rl.cli.quiet`` drops Lightning's "Total length of `NoEvaluation` across ranks is zero"
    for it and for nothing else."""


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


class _ResumableLoader(DataLoader):
    """The training DataLoader with the sampler's position as its state: Lightning saves a loader that has
    ``state_dict`` / ``load_state_dict`` in the checkpoint and then knows a mid-epoch resume is exact (without
    them it warns "dataloader is not resumable ... unreliable results"). The same position is also the
    datamodule's state; restoring it twice sets the same value."""

    sampler: _InfiniteShuffle  # always: PromptDataModule.train_dataloader builds it with one

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_pos": self.sampler.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.pos = int(state.get("sampler_pos", self.sampler.pos))


class PromptDataModule(L.LightningDataModule):
    """Prompt batches for RL.

    Args:
        task: a built-in task name (``addition``, ``reverse``, the chat tasks ``chat_addition``,
            ``chat_multiply_digit``, ``chat_compare``, ``chat_largest`` and their mix ``chat_mixed``); used when neither
            ``train_files`` nor ``dataset`` is set.
        task_args: keyword arguments of the task (e.g. ``{max_operand: 9}``).
        train_files / heldout_files: JSONL files of prompt records (README "Your data": ``prompt`` text or a
            TRL-style conversation, ``answer``, optional ``domain``, ``uid``, ``metadata``, anything else).
        dataset: a Hugging Face ``datasets`` source: a local ``.parquet`` / ``.json`` / ``.jsonl`` / ``.arrow``
            / ``.csv`` file (one split, ``train``), a directory written by ``save_to_disk``, a directory of data
            files (with a README ``configs:`` block, or ``train.jsonl`` / ``test.jsonl`` ...), or a hub name
            (needs network access); from Python also a ``datasets.Dataset`` or ``DatasetDict`` object.
        dataset_config: the configuration name of ``dataset`` (``load_dataset(name, "main")``); None = the
            default one.
        dataset_split / heldout_split: the dataset's training split and (optional) held-out split; a split the
            dataset does not have is an error naming the splits it has (never a silent fallback).
        prompt_key / answer_key: the columns holding the prompt and the answer (``question`` / ``solution``,
            ...), for JSONL files and datasets alike.
        batch_size: prompts per RL iteration *per rank* (Lightning convention; the global batch is
            batch_size × world_size). Each is sampled ``group_size`` times by the RolloutCallback.
        seed: prompt-order seed; None = the run's ``seed_everything`` (``lit_rl.core.seeds``).

    Records are read and checked when the datamodule is built (the CLI builds it before the model loads):
    every bad record is reported with its ``file:line``, and held-out records must have an answer.
    """

    # Held-out batches while fitting: only when an evaluator asked for them (set by HeldoutEval.setup).
    heldout_in_fit = False

    def __init__(
        self,
        task: TaskName | str | None = "addition",
        task_args: dict[str, Any] | None = None,
        train_files: list[str] | None = None,
        heldout_files: list[str] | None = None,
        dataset: str | None = None,  # from Python also a datasets.Dataset / DatasetDict object
        dataset_config: str | None = None,
        dataset_split: str = "train",
        heldout_split: str | None = None,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        batch_size: int = 16,
        seed: int | None = None,
    ):
        super().__init__()
        if train_files and dataset is not None:
            raise ValueError("PromptDataModule: set one of train_files and dataset, not both")
        if heldout_files and not train_files:
            raise ValueError(
                "PromptDataModule: heldout_files needs train_files (with a dataset use heldout_split)"
            )
        if heldout_split and dataset is None:
            raise ValueError("PromptDataModule: heldout_split is a split of `dataset`; set dataset too")
        if dataset_config and dataset is None:
            raise ValueError(
                "PromptDataModule: dataset_config names a configuration of `dataset`; set dataset too"
            )
        if heldout_split is not None and heldout_split == dataset_split:
            raise ValueError(
                f"PromptDataModule: heldout_split={heldout_split!r} is the training split "
                "(dataset_split); evaluating on the training data is not a held-out evaluation"
            )
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive number of prompts, got {batch_size}")
        for name, v in (("prompt_key", prompt_key), ("answer_key", answer_key)):
            if not v:
                raise ValueError(f"{name} must be a non-empty column name")
        has_data = bool(train_files) or dataset is not None
        self.task = task if not has_data else None
        if self.task is None and not has_data:
            raise ValueError("PromptDataModule: set one of task, train_files, dataset")
        self.task_args = task_args or {}
        self.train_files, self.heldout_files = train_files, heldout_files
        self.dataset, self.dataset_split, self.heldout_split = dataset, dataset_split, heldout_split
        self.dataset_config = dataset_config
        self.prompt_key, self.answer_key = prompt_key, answer_key
        self.batch_size, self.seed = batch_size, run_seed(seed)
        self.train_prompts: list[Prompt] = []
        self.heldout_prompts: list[Prompt] = []
        self._sampler: _InfiniteShuffle | None = None
        self._loaded = False
        self.setup()  # read and check every record now: a bad line fails before any model weights load

    def _load(self) -> tuple[list[Prompt], list[Prompt]]:
        if self.task is not None:
            return get_task(self.task, **self.task_args)
        keys: dict[str, Any] = {"prompt_key": self.prompt_key, "answer_key": self.answer_key}
        if self.train_files:
            train = [p for f in self.train_files for p in load_jsonl(f, **keys)]
            held = [p for f in (self.heldout_files or []) for p in load_jsonl(f, **keys, require_answer=True)]
            return train, held
        splits = load_hf_splits(self.dataset, self.dataset_config)
        name = self.dataset if isinstance(self.dataset, str) else type(self.dataset).__name__
        for field, split in (("dataset_split", self.dataset_split), ("heldout_split", self.heldout_split)):
            if split is not None and split not in splits:
                raise ValueError(
                    f"PromptDataModule: {field}={split!r}: dataset={name!r} has no such split; its "
                    f"splits: {', '.join(map(repr, splits))}"
                )
        train = records_from_rows(splits[self.dataset_split], f"{name}[{self.dataset_split}]", **keys)
        held = []
        if self.heldout_split:
            held = records_from_rows(
                splits[self.heldout_split], f"{name}[{self.heldout_split}]", **keys, require_answer=True
            )
        return train, held

    def setup(self, stage: str | None = None) -> None:
        if self._loaded:
            return
        self.train_prompts, self.heldout_prompts = self._load()
        if not self.train_prompts:
            raise ValueError("PromptDataModule: the training prompt set is empty")
        self._sampler = _InfiniteShuffle(len(self.train_prompts), self.seed, self.batch_size)
        self._loaded = True

    def train_dataloader(self) -> DataLoader:
        self.setup()
        assert self._sampler is not None  # built by setup()
        trainer = getattr(self, "trainer", None)
        if trainer is not None:  # this rank's share of each global batch (batch_size is per rank)
            self._sampler.rank, self._sampler.world = trainer.global_rank, trainer.world_size
            if len(self.train_prompts) < self.batch_size * trainer.world_size:
                raise ValueError(
                    f"PromptDataModule: {len(self.train_prompts)} training prompts cannot fill one global batch of "
                    f"batch_size={self.batch_size} × world_size={trainer.world_size}; lower batch_size or devices"
                )
        return _ResumableLoader(
            _ListDataset(self.train_prompts),
            batch_size=self.batch_size,
            sampler=self._sampler,
            collate_fn=collate_prompts,
            num_workers=0,  # prompt records are tiny; workers would only copy the sampler state away
            # Its own generator: every new iterator (each epoch, and on resume) otherwise draws a seed from the
            # global torch RNG that rollouts sample with, so a resumed run would sample differently.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def val_dataloader(self):
        """The held-out prompts, for the policy's ``validation_step`` (``HeldoutEval``). Empty (no validation)
        while fitting without a ``HeldoutEval`` callback, so recipes without evaluation never generate for it;
        ``lit-rl validate`` always gets them. ``heldout_in_fit`` is set by ``HeldoutEval.setup`` (explicit wiring:
        the data floor imports no callback)."""
        trainer = getattr(self, "trainer", None)
        fitting = trainer is not None and trainer.state.fn == "fit"
        if not self.heldout_prompts or (fitting and not self.heldout_in_fit):
            return NoEvaluation()
        # Its own generator, as the training loader's: a new iterator draws a seed from it, and from the global
        # torch RNG the rollouts sample with otherwise, so every evaluation would change the next rollouts.
        return DataLoader(
            _ListDataset(self.heldout_prompts),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=collate_prompts,
            num_workers=0,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_pos": self._sampler.pos if self._sampler else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setup()
        assert self._sampler is not None  # built by setup()
        self._sampler.pos = int(state.get("sampler_pos", 0))


_HF_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow", ".csv": "csv"}


def load_hf_splits(source, config: str | None = None) -> dict:
    """The splits (name -> rows) of a Hugging Face ``datasets`` source: a ``Dataset`` (one split, ``train``) or
    ``DatasetDict`` object, a local data file (by extension; one split, ``train``, as ``load_dataset`` names
    it), a ``save_to_disk`` directory, a directory of data files, or a hub name (with ``config``). Errors say
    which of these was tried."""
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "PromptDataModule(dataset=...) needs the `datasets` package: pip install datasets"
        ) from None
    if isinstance(source, datasets.DatasetDict):
        return dict(source)
    if isinstance(source, datasets.Dataset):
        return {"train": source}
    if not isinstance(source, str):
        raise TypeError(
            f"dataset must be a path, a hub name, a datasets.Dataset or a DatasetDict, got "
            f"{type(source).__name__}"
        )
    path = Path(source).expanduser()
    if path.is_file():
        fmt = _HF_FORMATS.get(path.suffix)
        if fmt is None:
            raise ValueError(
                f"dataset={source!r}: unknown file type {path.suffix!r}; one of {', '.join(_HF_FORMATS)}"
            )
        if config:
            raise ValueError(
                f"dataset_config={config!r}: dataset={source!r} is one data file, which has no "
                "configurations; drop dataset_config"
            )
        with _no_cache(datasets) as kw:
            return dict(datasets.load_dataset(fmt, data_files=str(path), **kw))
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        if config:
            raise ValueError(
                f"dataset_config={config!r}: dataset={source!r} is a save_to_disk directory, which "
                "has no configurations; drop dataset_config"
            )
        ds = datasets.load_from_disk(str(path))
        return dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
    if path.is_dir():
        with _no_cache(datasets) as kw:
            return dict(_load_named(datasets, source, config, **kw))
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise FileNotFoundError(
            f"dataset={source!r}: no such file or directory (and not a hub name org/name)"
        )
    try:
        return dict(_load_named(datasets, source, config))
    except (ConnectionError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OSError(
            f"dataset={source!r} is not a local file or directory, so it was looked up on the Hugging "
            f"Face hub, which failed (no network access, or no such dataset?): {first}"
        ) from None


@contextlib.contextmanager
def _no_cache(datasets) -> Iterator[dict[str, Any]]:
    """``load_dataset`` keyword arguments that read a local source from its files as they are now: a cache folder
    of this load's own, removed after, with the rows read into memory. ``datasets`` caches a folder with a README
    ``configs:`` block under the folder's name and the configuration, not its path or contents, so a second folder
    of the same name or an edited one gave the first rows again; a data file's cache key misses a rewrite that
    keeps its size and modification time. The folder lives inside ``datasets``' cache (the disk its user chose)."""
    root = Path(datasets.config.HF_DATASETS_CACHE)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lit_rl_local_", dir=root) as tmp:
        yield {"cache_dir": tmp, "keep_in_memory": True}


def _load_named(datasets, source: str, config: str | None, **kw):
    """``load_dataset(source, config)``; an unknown configuration is a one-line error naming the ones there are."""
    try:
        return datasets.load_dataset(source, config, **kw)
    except ValueError as e:
        names = None
        try:
            names = datasets.get_dataset_config_names(source)
        except Exception:  # noqa: BLE001, S110 - only for the message
            pass
        if names and config not in names:
            raise ValueError(
                f"dataset_config={config!r}: dataset={source!r} has no such configuration; its "
                f"configurations: {', '.join(map(repr, names))}"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if names is None and not Path(source).expanduser().exists():
            raise OSError(
                f"dataset={source!r} is not a local file or directory, so it was looked up on the Hugging "
                f"Face hub, which failed (no network access, or no such dataset?): {first}"
            ) from None
        raise ValueError(f"dataset={source!r}: {first}") from None
