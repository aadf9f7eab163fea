"""Which rows of a minibatch carry gradient signal, and when leaving the others out of a step is exact.

A policy loss in ``core.policy_losses.ADVANTAGE_LINEAR`` is, per token, A_t times a finite factor: a row
whose advantages are 0 on every trainable token (a group with all-equal rewards under GRPO, a row without a
reward) adds exactly 0 to that loss and to its gradient. The loss aggregation divides by the minibatch's token
and row counts, computed before any row is left out, so the other rows' terms do not change either: forwarding
only the signal rows gives the same gradient. A loss term (critic, reference KL or entropy in the loss,
distillation) trains every row, so with one all rows stay (``PolicyModule``'s ``skip_zero_advantage_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from lit_rl.core.policy_losses import ADVANTAGE_LINEAR


def signal_rows(advantages: Tensor, mask: Tensor) -> list[int]:
    """Indices of the rows with a nonzero advantage on some ``mask`` (trainable) token.

    Shapes:
        advantages, mask: (B, C). returns: a list of row indices, ascending.
    """
    return ((advantages != 0) & mask).any(-1).nonzero().flatten().tolist()


def by_prompt(group_ids: Tensor, rows: list[int] | None) -> list[int]:
    """``rows`` (default: every row) ordered by prompt group, stably: a shuffled minibatch's rows of one prompt
    then share micro-batches, where the policy's forward computes each distinct prompt once
    (``share_prompt_forward``). The minibatch's gradient is a sum over its rows, so the order changes only the
    floating-point summation order. Rows already grouped come back unchanged.

    Shapes:
        group_ids: (B,) int. returns: a list of row indices.
    """
    order = range(len(group_ids)) if rows is None else rows
    gid = group_ids.tolist()
    return sorted(order, key=lambda r: gid[r])


def old_logprob_rows(
    batch_size: int, signal: list[int] | None, first_step: list[int], epochs: int
) -> list[int]:
    """The rows whose log π_old a deferred pass computes (``learners/old_logprobs.py``): the rows some optimizer
    step reads, i.e. ``signal`` (every row when None: no row is left out of the steps), less the first step's
    rows when each row is trained once (``epochs`` 1): that step runs on the rollout's weights and takes its own
    forward's detached log-probs.

    Shapes:
        signal, first_step: row indices. returns: a list of row indices, ascending.
    """
    rows = range(batch_size) if signal is None else signal
    first = set(first_step) if epochs == 1 else set()
    return sorted(r for r in rows if r not in first)


def not_exact(policy_loss: str, terms: Sequence[str] = ()) -> str | None:
    """Why leaving zero-advantage rows out would change the gradient (None: it would not). ``terms``: the
    class names of the objective's active loss terms."""
    if policy_loss not in ADVANTAGE_LINEAR:
        return f"policy_loss={policy_loss!r} is not in core.policy_losses.ADVANTAGE_LINEAR"
    if terms:
        return f"the loss term {terms[0]} trains zero-advantage rows too"
    return None


def skips_rows(want: bool | None, policy_loss: str, terms: Sequence[str] = ()) -> bool:
    """``skip_zero_advantage_rows`` resolved: None = on where exact, False = off, True = on (a one-line
    ``ValueError`` with the reason where not exact)."""
    if want is False:
        return False
    why = not_exact(policy_loss, terms)
    if want and why is not None:
        raise ValueError(f"skip_zero_advantage_rows=true is not exact here: {why}; set it to null or false")
    return why is None
