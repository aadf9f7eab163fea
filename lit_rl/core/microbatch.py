"""Token-budget micro-batches: which rows share a forward/backward when the budget is tokens, not rows.

Rows of an Experience are a left-padded prompt followed by a right-padded completion. A micro-batch of rows
``S``, trimmed to its own width, is a ``|S| × (max_{i∈S} p_i + max_{i∈S} c_i)`` block (p_i / c_i = the row's
prompt / completion tokens): that padded area is what the forward costs and what its activations hold. With
a fixed row count one long completion pads every row of its micro-batch to its length; grouping rows of
similar length and cutting at a token budget keeps every block near the budget.

Pure index arithmetic: no torch, no Lightning. ``PolicyModule`` builds the micro-batches from these groups
and pads the count across ranks (every rank must run the same number of forward/backward passes).
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_tokens(prompt_lens: Sequence[int], completion_lens: Sequence[int], rows: Sequence[int]) -> int:
    """Padded area of rows ``rows`` trimmed to their own width: ``len(rows) × (max p + max c)``."""
    if not rows:
        return 0
    return len(rows) * (max(prompt_lens[i] for i in rows) + max(completion_lens[i] for i in rows))


def token_budget_groups(
    prompt_lens: Sequence[int], completion_lens: Sequence[int], max_tokens: int, max_rows: int | None = None
) -> list[list[int]]:
    """Partition rows into micro-batches whose padded area is at most ``max_tokens``.

    Rows are sorted longest first (p + c, ties by index so the plan is deterministic) and cut greedily: a
    row joins the current micro-batch while ``rows × (max p + max c)`` stays within the budget (and the rows
    stay within ``max_rows``), else it starts the next one. Sorted order makes neighbours similar in length,
    so little of each block is padding. A row longer than the budget on its own forms a micro-batch by itself
    (it cannot be split; its block is then over budget).

    Args:
        prompt_lens: (B,) real prompt tokens of each row.
        completion_lens: (B,) real completion tokens of each row.
        max_tokens: the budget of padded tokens per micro-batch (>= 1).
        max_rows: optional cap on rows per micro-batch.

    Returns:
        Lists of row indices (each row exactly once), longest rows first; the concatenation is a permutation
        of ``range(B)``.
    """
    if len(prompt_lens) != len(completion_lens):
        raise ValueError(
            f"prompt_lens ({len(prompt_lens)}) and completion_lens ({len(completion_lens)}) differ in length"
        )
    if isinstance(max_tokens, bool) or int(max_tokens) != max_tokens or max_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be a positive integer, got {max_tokens!r}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
    order = sorted(range(len(prompt_lens)), key=lambda i: (-(prompt_lens[i] + completion_lens[i]), i))
    groups: list[list[int]] = []
    cur: list[int] = []
    max_p = max_c = 0
    for i in order:
        p, c = max(max_p, prompt_lens[i]), max(max_c, completion_lens[i])
        fits = (len(cur) + 1) * (p + c) <= max_tokens and (max_rows is None or len(cur) < max_rows)
        if cur and not fits:
            groups.append(cur)
            cur, p, c = [], prompt_lens[i], completion_lens[i]
        cur.append(i)
        max_p, max_c = p, c
    if cur:
        groups.append(cur)
    return groups
