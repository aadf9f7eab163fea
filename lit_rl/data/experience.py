"""`Experience`: one RL iteration's rollouts as padded tensors, one row per completion.

Layout (B rows, P prompt tokens, C completion tokens, L = P + C):

    input_ids      (B, L)  left-padded prompt | completion right-padded with pad
    attention_mask (B, L)  1 on real tokens (prompt and completion, including observations)
    loss_mask      (B, C)  True on tokens the policy generated (multi-turn: observations are False)
    train_mask     (B, C)  (property) the tokens that train: loss_mask on rows that are ``valid`` and
                           ``trainable``. Every loss term, every loss denominator, the critic's targets and
                           the KL / entropy terms read this, never ``loss_mask`` directly.

Every other per-token field is (B, C) and aligned with ``input_ids[:, P:]``: entry ``t`` belongs to the
token at sequence position ``P + t`` (its log-probability is read from the logits at position
``P + t - 1``). Per-row fields are (B,).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

# Per-token optional fields, all (B, C).
TOKEN_FIELDS = (
    "rollout_logprobs",
    "old_logprobs",
    "old_full_logprobs",
    "ref_logprobs",
    "values",
    "teacher_logprobs",
    "token_rewards",
    "advantages",
    "returns",
    "is_weights",
)
# Per-row tensors, all (B,).
ROW_FIELDS = ("rewards", "valid", "group_ids", "policy_version")
# Per-row optional tensors, all (B,).
OPTIONAL_ROW_FIELDS = ("trainable",)


@dataclass
class Experience:
    input_ids: Tensor  # (B, L) int64
    attention_mask: Tensor  # (B, L) int64 / bool
    loss_mask: Tensor  # (B, C) bool
    prompt_len: int  # P: completion tokens start at this position
    group_ids: Tensor  # (B,) int64, rows of one prompt share an id
    rewards: Tensor  # (B,) float; NaN where valid is False
    valid: Tensor  # (B,) bool; False = reward unavailable (infra error), masked out of advantages
    policy_version: Tensor  # (B,) int64: engine weights version that generated the row
    reward_components: dict[str, Tensor] = field(default_factory=dict)  # name -> (B,)
    rollout_logprobs: Tensor | None = None
    # log π_old(y_t) of the sampler's distribution (the PPO ratio's denominator; ``core.processed``); with
    # processed sampling (top-p / top-k / min-p / repetition penalty) also the model's full softmax(z / T) in
    # ``old_full_logprobs``, which KL-type quantities read (None when the two are the same distribution).
    old_logprobs: Tensor | None = None
    old_full_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    token_rewards: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    is_weights: Tensor | None = None
    # (B,) bool; False = the row's reward is valid and counts in its group's statistics, but the row itself
    # does not train (DAPO overlong filtering). None = every valid row trains.
    trainable: Tensor | None = None
    # H of length-normalised losses (``seq_mean_token_sum_norm``, Dr. GRPO): a constant of the run, e.g. the
    # generation budget max_new_tokens, so the divisor never follows padding, minibatch width or rank.
    horizon: int | None = None
    finish_reasons: list[str] = field(default_factory=list)  # "stop" | "length" per row
    domains: list[str] = field(default_factory=list)  # task domain per row (teacher routing)
    prompts: list[Any] = field(default_factory=list)  # the Prompt record behind each row
    texts: list[str] = field(default_factory=list)  # decoded completions
    reward_errors: list[str | None] = field(
        default_factory=list
    )  # per row: why it has no reward (None: scored)
    # per row: what rewards logged for it (TRL's log_extra columns, "<reward>/error" of a component that failed
    # on a row other rewards scored); [] = nothing logged. Shown by the rollout inspector.
    reward_extras: list[dict[str, Any]] = field(default_factory=list)
    # Tensors other components attach (e.g. multi-turn observation masks); sliced like token fields.
    extras: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        B, L = self.input_ids.shape
        C = L - self.prompt_len
        if self.attention_mask.shape != (B, L):
            raise ValueError(f"attention_mask shape {tuple(self.attention_mask.shape)} != input_ids {(B, L)}")
        if self.loss_mask.shape != (B, C):
            raise ValueError(f"loss_mask shape {tuple(self.loss_mask.shape)} != (B, C) = {(B, C)}")
        if self.loss_mask.dtype != torch.bool:
            raise TypeError(f"loss_mask must be torch.bool, got {self.loss_mask.dtype}")
        for name in ROW_FIELDS:
            t = getattr(self, name)
            if t.shape != (B,):
                raise ValueError(f"{name} shape {tuple(t.shape)} != (B,) = {(B,)}")
        for name in OPTIONAL_ROW_FIELDS:
            t = getattr(self, name)
            if t is not None and (t.shape != (B,) or t.dtype != torch.bool):
                raise ValueError(
                    f"{name} must be a (B,) = {(B,)} bool tensor, got {tuple(t.shape)} {t.dtype}"
                )
        if self.valid.dtype != torch.bool:
            raise TypeError(f"valid must be torch.bool, got {self.valid.dtype}")
        for name in TOKEN_FIELDS:
            t = getattr(self, name)
            if t is not None and t.shape != (B, C):
                raise ValueError(f"{name} shape {tuple(t.shape)} != (B, C) = {(B, C)}")
        if self.horizon is not None and (
            isinstance(self.horizon, bool) or not int(self.horizon) == self.horizon or self.horizon < 1
        ):
            raise ValueError(f"horizon must be a positive integer or None, got {self.horizon!r}")

    # ------------------------------------------------------------------ sizes
    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def completion_len(self) -> int:
        return self.input_ids.shape[1] - self.prompt_len

    @property
    def completion_ids(self) -> Tensor:  # (B, C)
        return self.input_ids[:, self.prompt_len :]

    def __len__(self) -> int:
        return self.batch_size

    # ---------------------------------------------------------- training mask
    @property
    def train_rows(self) -> Tensor:
        """(B,) bool: rows that train — ``valid`` (a reward exists) and ``trainable`` (not filtered)."""
        rows = self.valid.to(self.loss_mask.device)
        if self.trainable is not None:
            rows = rows & self.trainable.to(rows.device)
        return rows

    @property
    def train_mask(self) -> Tensor:
        """(B, C) bool: the one owner of "which tokens train" (docs/architecture.md "Contracts": trainable tokens).

        ``loss_mask`` (generated tokens) restricted to ``train_rows``. A row whose reward failed (``valid``
        False) or that a filter excluded (``trainable`` False) is out of every loss term and every loss
        denominator, not only out of the advantage; so is the critic's value target on it.
        """
        return self.loss_mask & self.train_rows[:, None]

    # ---------------------------------------------------------------- slicing
    def select(self, index: Tensor | list[int] | slice) -> Experience:
        """Rows ``index`` as a new Experience (tensors are views/copies; lists are re-indexed)."""
        if isinstance(index, slice):
            rows = list(range(self.batch_size))[index]
        else:
            rows = index.tolist() if isinstance(index, Tensor) else list(index)
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                kw[f.name] = v.index_select(0, idx)
            elif isinstance(v, dict):
                kw[f.name] = {k: t.index_select(0, idx.to(t.device)) for k, t in v.items()}
            elif isinstance(v, list):
                kw[f.name] = [v[i] for i in rows] if v else []
            else:
                kw[f.name] = v
        return Experience(**kw)

    def minibatch_orders(
        self, size: int | None, shuffle: bool = True, generator: torch.Generator | None = None
    ) -> list[Tensor]:
        """The row indices of each minibatch ``minibatches`` yields (one ``randperm`` draw when shuffled):
        a step's rows can be known before the minibatches are cut (the deferred old log-probs)."""
        B = self.batch_size
        if size is not None and size <= 0 and size < B:
            raise ValueError(f"minibatch size must be positive, got {size}")
        order = torch.randperm(B, generator=generator) if shuffle else torch.arange(B)
        if size is None or size >= B:
            return [order]
        return [order[start : start + size] for start in range(0, B, size)]

    def minibatches(
        self,
        size: int | None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
        orders: list[Tensor] | None = None,
    ) -> Iterator[Experience]:
        """Split into minibatches of ``size`` rows (one optimizer step each); every row exactly once.

        ``size=None`` yields the whole Experience. The last minibatch may be smaller when ``size`` does
        not divide B (PolicyModule rejects that configuration at construction; data-dependent batch sizes,
        e.g. after dynamic sampling, still work). ``orders``: ``minibatch_orders``' draw, taken earlier.
        """
        orders = self.minibatch_orders(size, shuffle, generator) if orders is None else orders
        if len(orders) == 1 and not shuffle:
            yield self
            return
        for order in orders:
            yield self.select(order)

    def micro_batches(self, size: int | None) -> Iterator[Experience]:
        """Consecutive chunks of ``size`` rows for gradient accumulation (no shuffling)."""
        B = self.batch_size
        if size is None or size >= B:
            yield self
            return
        if size <= 0:
            raise ValueError(f"micro batch size must be positive, got {size}")
        for start in range(0, B, size):
            yield self.select(slice(start, start + size))

    def to(self, device: torch.device | str) -> Experience:
        kw = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                v = v.to(device)
            elif isinstance(v, dict):
                v = {k: t.to(device) for k, t in v.items()}
            kw[f.name] = v
        return Experience(**kw)

    def row_extents(self) -> tuple[list[int], list[int]]:
        """Per row: prompt columns from its first real token to P, and completion columns up to its last real
        token (the widths a block of these rows needs: left-padded prompts, right-padded completions)."""
        att = self.attention_mask.bool()
        P, C = self.prompt_len, self.completion_len
        cols_p = torch.arange(P, device=att.device)
        first = (
            torch.where(att[:, :P], cols_p, P).min(-1).values
            if P
            else torch.zeros(len(att), dtype=torch.long)
        )
        cols_c = torch.arange(1, C + 1, device=att.device)
        last = (
            torch.where(att[:, P:], cols_c, 0).max(-1).values
            if C
            else torch.zeros(len(att), dtype=torch.long)
        )
        return (P - first).tolist(), last.tolist()

    def trim(self, prompt: bool = False) -> Experience:
        """Drop completion columns that are padding in every row (saves compute after row selection); with
        ``prompt`` also the leading prompt columns that are padding in every row (``prompt_len`` shrinks).
        Position ids come from the attention mask and padded keys are masked, so the model computes the same
        values on the trimmed rows."""
        real = self.attention_mask[:, self.prompt_len :].bool().any(0)  # (C,)
        drop_p = 0
        if prompt and self.prompt_len:
            real_p = self.attention_mask[:, : self.prompt_len].bool().any(0)  # (P,)
            drop_p = int(real_p.long().argmax()) if real_p.any() else self.prompt_len - 1
        if (real.all() or not real.any()) and drop_p == 0:
            return self
        keep_c = int(real.nonzero().max()) + 1 if real.any() else self.completion_len
        L = self.prompt_len + keep_c
        kw = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("input_ids", "attention_mask"):
                v = v[:, drop_p:L]
            elif f.name == "prompt_len":
                v = v - drop_p
            elif f.name == "loss_mask" or (f.name in TOKEN_FIELDS and v is not None):
                v = v[:, :keep_c]
            elif f.name == "extras":
                v = {k: t[:, :keep_c] if t.dim() == 2 else t for k, t in v.items()}
            kw[f.name] = v
        return Experience(**kw)


def pad_prompts_completions(
    pad_id: int, prompts: list[list[int]], completions: list[list[int]]
) -> tuple[Tensor, Tensor, Tensor, int]:
    """The Experience layout from token lists: prompts left-padded to P, completions right-padded to C.

    Returns ``input_ids`` (B, P+C), ``attention_mask`` (B, P+C), ``loss_mask`` (B, C) (True on completion
    tokens) and P. C is at least 1 so an all-empty batch still has a completion column.
    """
    B, P, C = len(prompts), max(map(len, prompts)), max([1, *map(len, completions)])
    input_ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + C), dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        att[i, P - len(p) : P + len(c)] = 1
        if c:
            input_ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, : len(c)] = True
    return input_ids, att, mask, P
