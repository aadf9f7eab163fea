"""What ``trainer.max_steps`` counts: optimizer steps (Lightning's ``global_step``; TRL's ``max_steps`` too).

An RL iteration (one rollout batch) takes ``ppo_epochs x minibatches`` optimizer steps, and Lightning checks
``max_steps`` only between iterations (batches), so a ``max_steps`` that is not a multiple of that overshoots:
``max_steps 2`` with 4 steps per iteration saved ``global_step`` 4. Stopping mid-iteration would leave a
checkpoint whose Experience is half trained (no exact resume), so such a ``max_steps`` is refused instead
(``lit-rl fit`` before any model is built, ``RolloutCallback.setup`` for library users). Torch-free.
"""

from __future__ import annotations


def optimizer_steps_per_iteration(rows: int, ppo_epochs: int, minibatch_size: int | None) -> int | None:
    """Optimizer steps one iteration of ``rows`` rollout rows per rank takes, or None when ``minibatch_size``
    does not divide ``rows`` (its own error says so)."""
    if not minibatch_size or minibatch_size >= rows:
        return ppo_epochs
    if rows % minibatch_size:
        return None
    return ppo_epochs * (rows // minibatch_size)


def max_steps_message(
    max_steps: int | None, rows: int, ppo_epochs: int, minibatch_size: int | None
) -> str | None:
    """One line when ``max_steps`` is not a whole number of iterations; None when it is (or is unbounded)."""
    per = optimizer_steps_per_iteration(rows, ppo_epochs, minibatch_size)
    if max_steps is None or max_steps < 0 or not per or max_steps % per == 0:
        return None
    low = max_steps // per * per
    choices = f"{low} or {low + per}" if low else str(per)
    minibatches = rows // minibatch_size if minibatch_size and minibatch_size < rows else 1
    return (
        f"trainer.max_steps={max_steps} counts optimizer steps (as TRL's max_steps), and one RL iteration "
        f"takes {per}: model.init_args.ppo_epochs={ppo_epochs} x {minibatches} minibatch(es) of "
        f"model.init_args.minibatch_size={minibatch_size} over {rows} rollout rows; set trainer.max_steps to a "
        f"multiple of {per} ({choices}) so the run ends at the end of an iteration"
    )
