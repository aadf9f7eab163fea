"""Which ``group_size`` values can train, for a given advantage estimator. Kept free of torch so that
``lit-rl fit`` can refuse a bad value before importing torch or Lightning (``lit_rl/cli/precheck.py``)."""

from __future__ import annotations

# Estimators whose baseline is the prompt's own group: with one completion per prompt every advantage is 0,
# so the loss and the gradient are 0 at every step (a run that trains nothing and exits 0).
GROUP_RELATIVE = frozenset({"grpo", "dr_grpo", "rloo"})


def check_group_size(advantage: str | None, group_size: int, rl_coef: float | None = None) -> None:
    """Refuse ``group_size`` values that cannot train: below 1, or 1 with a group-relative estimator (unless the
    reward term is off: a ``DistillModule`` with ``rl_coef=0`` never uses the advantage). Called by the CLI
    before anything is built or written, and by ``RolloutCallback.setup`` for library use."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"rollout.group_size must be an integer >= 1, got {group_size!r}")
    if group_size == 1 and advantage in GROUP_RELATIVE and rl_coef != 0:
        raise ValueError(
            f"rollout.group_size=1 with model.advantage={advantage!r}: a group-relative advantage compares the "
            "completions of one prompt, so with one each its advantage, loss and gradient are 0 at every step; "
            "allowed: group_size >= 2, or an advantage with another baseline (reinforce, gae)"
        )
