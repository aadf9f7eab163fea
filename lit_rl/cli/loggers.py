"""What every `lit-rl` run logs and where: the run directory's loggers, kept beside the user's own, and the
monitoring callbacks every recipe gets.

- Loggers. ``--trainer.logger`` unset (or ``true``): the run directory's CSV (``logs/metrics.csv``) and
  TensorBoard (``tb/``) loggers. A logger of the user's own (``--trainer.logger WandbLogger``, a list of them) is
  *added* to those two, as a TRL user adding ``report_to="wandb"`` still has the run directory's files; a user
  logger writing into the same directory as one of ours replaces it. ``--run_loggers false`` keeps only the
  user's; ``--trainer.logger false`` turns every logger off.
- Callbacks. A ``LearningRateMonitor`` (``IterationLRMonitor``: ``lr-AdamW`` at each iteration's step) when
  there is a logger to write to, ``TokensSeen`` (``tokens_seen``) and ``ProgressLog`` (progress lines when
  stdout is not a terminal), unless the config already has one of the same class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RUN_LOGGERS_HELP = (
    "Keep the run directory's CSV (logs/metrics.csv) and TensorBoard (tb/) loggers beside the "
    "loggers of --trainer.logger (default true); false: only those of --trainer.logger."
)


def run_loggers(logger: Any, root: str, subcommand: str, resume_step: int | None, keep: bool = True) -> Any:
    """The ``logger`` argument the Trainer gets: ``logger`` as configured (``None``/``True`` = unset, ``False``,
    one logger or a list of them) plus the run directory's loggers (see the module doc)."""
    if logger is False:
        return False
    user = [] if logger in (None, True) else list(logger) if isinstance(logger, (list, tuple)) else [logger]
    if not keep:
        return user or False
    if subcommand == "fit":
        from lit_rl.runs import default_loggers

        ours = default_loggers(root, resume_step)
    else:  # `lit-rl validate` on a run directory: its own CSV beside the run's logs
        from lightning.pytorch.loggers import CSVLogger

        ours = [CSVLogger(root, name=str(subcommand), version="")]
    taken = {_log_dir(u) for u in user}
    # ours first: Lightning's trainer.log_dir (where checkpoints / configs of some callbacks go) is loggers[0]'s
    return [o for o in ours if _log_dir(o) not in taken] + user


def _log_dir(logger) -> str | None:
    d = getattr(logger, "log_dir", None)
    try:
        return str(Path(d).resolve()) if d else None
    except (TypeError, ValueError):  # a logger whose log_dir is not a path (a remote URI object): never ours
        return None


def monitoring_callbacks(callbacks: list, has_logger: bool) -> list:
    """``callbacks`` plus a ``LearningRateMonitor`` (only with a logger: it refuses to run without one), a
    ``TokensSeen`` and a ``ProgressLog``, each unless one of its class is already there."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    from lit_rl.callbacks.monitoring import IterationLRMonitor, TokensSeen
    from lit_rl.callbacks.progress import ProgressLog

    out = list(callbacks)
    if has_logger and not any(isinstance(c, LearningRateMonitor) for c in out):
        out.append(IterationLRMonitor(logging_interval="step"))
    if not any(isinstance(c, TokensSeen) for c in out):
        out.append(TokensSeen())
    if not any(isinstance(c, ProgressLog) for c in out):
        out.append(ProgressLog())
    return out
