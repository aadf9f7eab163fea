"""One run directory per run: where every output goes, how ``--ckpt_path last`` is found, how logs continue.

Layout under ``trainer.default_root_dir`` (the *run directory*)::

    config.yaml            the parsed config (``lit-rl fit -c <run dir>/config.yaml --ckpt_path last`` resumes it;
                           with another ``--trainer.default_root_dir`` it re-runs from scratch)
    checkpoints/last.ckpt  written by ``IterationCheckpoint`` every N iterations and at the end (a symlink to
                           the newest iter=N.ckpt: one file per checkpoint)
    logs/metrics.csv       CSVLogger (no version_N folders: the run directory *is* the version)
    tb/                    TensorBoard events
    reward_curve.png, final_model/, rollouts ...   relative paths of lit_rl callbacks resolve here

Resume (``--ckpt_path``): ``last`` must find ``checkpoints/last.ckpt`` (or the configured
``ModelCheckpoint.dirpath``'s) and is an error otherwise; ``last_or_new`` starts fresh when there is none.
A resumed run appends to the same CSV and TensorBoard files: rows the killed process logged after its last
checkpoint are dropped first (CSV) or purged (TensorBoard ``purge_step``), so every step appears once.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rl.checkpoint import finish_interrupted_swap, remove_path

CHECKPOINT_SUBDIR = "checkpoints"
LAST = "last.ckpt"


def run_path(trainer, path: str | os.PathLike) -> Path:
    """``path`` itself when absolute, else ``<trainer.default_root_dir>/path``."""
    p = Path(path).expanduser()
    if p.is_absolute() or trainer is None:
        return p
    return Path(trainer.default_root_dir) / p


class IterationCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that saves every ``every_n_iterations`` RL iterations (not optimizer steps: an
    iteration with ``ppo_epochs x minibatches`` takes several) and after the last one, into
    ``<run dir>/checkpoints`` unless ``dirpath`` is given. ``save_top_k`` numbered checkpoints are kept
    (``iter=N.ckpt``; -1: all, the default 1: only the newest, as there is no metric to rank them by);
    ``last.ckpt`` (what ``--ckpt_path last`` resumes from) is a symlink to the newest (``save_last: link``, the
    default: one file per checkpoint, where ``true`` writes every checkpoint twice); with ``save_top_k: 0`` it
    is the only file. ``save_weights_only``: the model's weights without optimizer / loop states (~1/3 of the
    size with AdamW), for export and evaluation; such a checkpoint cannot resume a run.
    """

    def __init__(
        self,
        every_n_iterations: int = 50,
        dirpath: str | None = None,
        save_last: bool | Literal["link"] = "link",
        save_top_k: int = 1,
        filename: str | None = "iter={iteration}",
        save_weights_only: bool = False,
    ):
        if every_n_iterations < 1:
            raise ValueError(f"every_n_iterations must be >= 1, got {every_n_iterations}")
        # every_n_train_steps=0 and every_n_epochs=0: Lightning's own triggers are off, this class decides.
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            save_last=save_last,
            save_top_k=save_top_k,
            monitor="iteration" if save_top_k not in (0, 1, -1) else None,
            save_weights_only=save_weights_only,
            mode="max",
            every_n_train_steps=0,
            every_n_epochs=0,
            auto_insert_metric_name=False,
        )
        self.every_n_iterations = every_n_iterations

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        # Lightning removes the previous numbered file before it relinks last.ckpt: a kill in between would leave
        # last.ckpt dangling (nothing to resume). Pointing it at the new file first closes that window.
        if self.save_last == "link" and self.save_top_k != 0 and Path(filepath).name != LAST:
            last = self.format_checkpoint_name({}, self.CHECKPOINT_NAME_LAST)
            self._link_checkpoint(trainer, filepath, last)
            self.last_model_path = last  # so that _save_last_checkpoint relinks it, not a new last-v1.ckpt

    @staticmethod
    def _link_checkpoint(trainer, filepath: str, linkpath: str) -> None:
        """Lightning's, made atomic: the new link is created beside and renamed over the old one (a kill leaves
        the old or the new link, never none)."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            tmp = Path(linkpath).with_name(f".{Path(linkpath).name}.{os.getpid()}.link")
            tmp.unlink(missing_ok=True)
            os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), tmp)
            if os.path.isdir(linkpath) and not os.path.islink(
                linkpath
            ):  # a directory checkpoint of an older run
                remove_path(Path(linkpath))
            os.replace(tmp, linkpath)
        trainer.strategy.barrier()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(Path(trainer.default_root_dir) / CHECKPOINT_SUBDIR)
        super().setup(trainer, pl_module, stage)

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath) -> None:
        # Lightning warns "exists and is not empty" in setup, before it knows whether the run resumes; a resumed
        # run writes into its own checkpoint directory by design, so the check moves to on_train_start.
        pass

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        if trainer.ckpt_path is None and trainer.is_global_zero:
            # mypy does not mangle Lightning's private `__warn_if_dir_not_empty` to this name
            super()._ModelCheckpoint__warn_if_dir_not_empty(self.dirpath)  # type: ignore[misc]

    def _iteration(self, trainer, pl_module) -> int:
        return int(getattr(pl_module, "iteration", trainer.global_step))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        it = self._iteration(trainer, pl_module)
        final = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        if self._should_skip_saving_checkpoint(trainer) or not (it % self.every_n_iterations == 0 or final):
            return
        candidates = self._monitor_candidates(trainer)
        candidates["iteration"] = torch.tensor(it)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # Lightning "epochs" mean nothing in RL
        pass

    def on_validation_end(self, trainer, pl_module) -> None:
        pass


# ------------------------------------------------------------------ resume
class NothingToResume(FileNotFoundError):
    """``--ckpt_path last`` with no checkpoint in the run directory."""


def resolve_ckpt_path(ckpt_path: str | None, ckpt_dir: Path) -> str | None:
    """``last`` → ``<ckpt_dir>/last.ckpt`` (error if missing); ``last_or_new`` → it, or None (fresh start);
    any other value is a file path, checked to exist."""
    if ckpt_path is None:
        return None
    last = ckpt_dir / LAST
    if ckpt_path in ("last", "last_or_new"):
        finish_interrupted_swap(last)  # a directory save killed between its two renames
        if last.is_file() or last.is_dir():  # a directory: FSDP2's distributed checkpoint, DeepSpeed's
            return str(last)
        if ckpt_path == "last_or_new":
            return None
        raise NothingToResume(
            f"--ckpt_path last: nothing to resume, {last} does not exist. Check --trainer.default_root_dir "
            "(the run directory to resume), or pass --ckpt_path last_or_new to start fresh when there is none"
        )
    if not Path(ckpt_path).expanduser().exists():
        raise NothingToResume(f"--ckpt_path {ckpt_path}: no such checkpoint file or directory")
    return ckpt_path


def checkpoint_log_step(path: str) -> int:
    """The logging step a run resumed from checkpoint ``path`` logs first.

    An RL run (the checkpoint holds a ``PolicyModule``'s ``iteration`` K) logs iteration i at step i, the
    numbering of the progress bar and the rollout files (``RolloutCallback`` logs ``step``), so it continues at
    K + 1. Any other module keeps Lightning's numbering, batch i (0-based) at step i: it continues at the number
    of batches the checkpoint had processed. (Lightning's ``_batches_that_stepped`` is one short when the
    checkpoint was saved in ``on_train_batch_end``, as it increments after, so it is only the fallback.)
    Memory-mapped, so the weights are not read; of a checkpoint directory only the file holding these states."""
    ckpt = _load_states(_loop_state_file(Path(path)))
    if not Path(path).is_dir() and "optimizer_states" not in ckpt:  # a directory keeps them in its shards
        raise NothingToResume(
            f"--ckpt_path {path}: a weights-only checkpoint (checkpoint.save_weights_only) cannot resume a run: it "
            "has no optimizer or loop state. Export it (lit-rl export) or start a new run from its weights"
        )
    iteration = ckpt.get("lit_rl_policy", {}).get("iteration")
    if iteration is not None:
        return int(iteration) + 1
    loops = ckpt.get("loops", {}).get("fit_loop", {})
    processed = loops.get("epoch_loop.batch_progress", {}).get("total", {}).get("processed")
    if processed is not None:
        return int(processed)
    return int(
        loops.get("epoch_loop.state_dict", {}).get("_batches_that_stepped", ckpt.get("global_step", 0))
    )


def _load_states(file: Path) -> dict:
    """The checkpoint file's dict, memory-mapped (the weights are not read). torch hands a path to C++ as UTF-8,
    so a run folder whose name is not UTF-8 (bytes Python holds as lone surrogates) is read through a Python
    file object instead, without the memory map."""
    try:
        os.fsdecode(file).encode("utf-8")
    except UnicodeEncodeError:
        with open(file, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)
    return torch.load(file, map_location="cpu", weights_only=True, mmap=True)


def _loop_state_file(path: Path) -> Path:
    """The file of a checkpoint holding Lightning's loop states and the module's own keys: the checkpoint itself,
    ``meta.pt`` of a ``torch.distributed.checkpoint`` directory (FSDP2), or rank 0's ``*model_states.pt`` of a
    DeepSpeed directory (its client state)."""
    if not path.is_dir():
        return path
    if (path / "meta.pt").is_file():
        return path / "meta.pt"
    found = sorted((path / "checkpoint").glob("*mp_rank_00_model_states.pt"))
    if not found:
        raise FileNotFoundError(
            f"{path} is a directory but neither a torch.distributed.checkpoint (no meta.pt) nor "
            "a DeepSpeed checkpoint (no checkpoint/*model_states.pt)"
        )
    return found[0]


def truncate_csv_metrics(path: Path, from_step: int) -> int:
    """Drop rows with ``step >= from_step`` from a CSVLogger ``metrics.csv``; returns how many were dropped.

    They were logged by a killed process after its last checkpoint; the resumed run logs those steps again.
    """
    if not path.is_file():
        return 0
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    keep = [r for r in rows if not r.get("step") or int(float(r["step"])) < from_step]
    if len(keep) != len(rows):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(keep)
        os.replace(tmp, path)
    return len(rows) - len(keep)


class _ContinuingWriter:
    """Mixin for Lightning's CSV ExperimentWriter: keeps an existing ``metrics.csv`` (Lightning deletes it) and
    appends to it under the same header (a resumed run's new keys still widen the header)."""

    # provided by ExperimentWriter, the class this is mixed into
    _fs: Any
    metrics_file_path: str
    metrics_keys: list[str]

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])


def run_csv_logger(root: str, resume_step: int | None):
    """CSVLogger writing ``<root>/logs/metrics.csv``. On resume (``resume_step`` set) the rows logged at
    ``step >= resume_step`` are dropped and the new rows are appended to the same file."""
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    class _Writer(_ContinuingWriter, ExperimentWriter):
        pass

    class _RunCSVLogger(CSVLogger):
        @property
        def experiment(self):
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = (_Writer if resume_step is not None else ExperimentWriter)(
                    log_dir=self.log_dir
                )
            return self._experiment

    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    logger = _RunCSVLogger(root, name="logs", version="")
    # only rank 0 writes the CSV; Lightning sets `rank` on the function object, undeclared in its type
    if resume_step is not None and rank_zero_only.rank == 0:  # type: ignore[attr-defined]
        truncate_csv_metrics(Path(logger.log_dir) / "metrics.csv", resume_step)
    return logger


def default_loggers(root: str, resume_step: int | None) -> list[Any]:
    """CSV (``<root>/logs/metrics.csv``) and, when ``tensorboard`` is installed, TensorBoard (``<root>/tb``)
    loggers with a fixed version: a resumed run writes into the same files, continuing at ``resume_step``
    (TensorBoard's ``purge_step`` hides the events a killed process wrote after its last checkpoint)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    out: list[Any] = [run_csv_logger(root, resume_step)]
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return out
    try:
        os.fspath(root).encode("utf-8")
    except UnicodeEncodeError:  # a name with bytes that are not UTF-8 (held as lone surrogates by Python)
        warnings.warn(
            f"run directory {root!r}: its name is not UTF-8, which TensorBoard cannot write under (it encodes "
            "paths as UTF-8); no tb/ logs for this run (logs/metrics.csv has the same metrics)",
            UserWarning,
            stacklevel=2,
        )
        return out
    kw: dict[str, Any] = {} if resume_step is None else {"purge_step": resume_step}
    out.append(TensorBoardLogger(root, name="tb", version="", default_hp_metric=False, **kw))
    return out


def log_rows(path: Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as floats (empty cells dropped): a test and notebook helper."""
    with Path(path).open(newline="") as f:
        return [
            {k: float(v) for k, v in r.items() if v not in ("", None) and not math.isnan(float(v))}
            for r in csv.DictReader(f)
        ]
