"""Padding-free training forward: the real tokens of a micro-batch packed into a few rows, each prompt once.

A micro-batch of Experience rows is a (B, P + C) block: left-padded prompts, right-padded completions, G rows
per prompt. When completion lengths vary, most of the block can be padding (SmolLM2 on the bench: 596 real of
32 x 64 completion positions), and a padded forward/backward pays for all of it. Here every distinct prompt
becomes one *unit*: its real prompt tokens followed by the real completion tokens of each row that shares it
(the last completion token predicts nothing and is not fed); a group too long for ``row_tokens`` is split into
several units, each with its own copy of the prompt. Units are packed first-fit-decreasing into rows of about
``row_tokens`` tokens, and a 4-D attention mask keeps them apart:

    key k is visible from query q  <=>  same unit, k <= q, and k is a prompt token or in q's own completion

Position ids restart per unit and continue from the prompt into each completion, exactly the ids the padded
forward gives (``cumsum(attention_mask) - 1``). So each completion sees what it saw in the padded forward (its
prompt and its own earlier tokens), the prompt is computed once per unit (once per group unless the group was
split; what ``shared_prompt`` does with a KV cache), and no padding is computed except the few tokens that even
out the packed rows.

The hidden states that predict each completion token are gathered back into the Experience's (B, C, H)
layout (``PackedRows.gather``), so the log-prob, entropy and value-head code downstream is unchanged; entries
past a row's last token read position 0 and are masked by every consumer.

Which models: attention that takes a custom 4-D mask (``sdpa``: boolean, ``eager``: additive) and no
sliding-window layer (a custom mask replaces the window). ``unsupported_reason`` says why not otherwise.
Cost: attention is dense over each packed row, so rows are kept to ``row_tokens`` (the quadratic term stays
small next to the matmuls); only a single row longer than that makes a longer packed row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rl.models.shared_prompt import distinct_prompts

DEFAULT_ROW_TOKENS = 256
MASKED_ATTENTION = ("sdpa", "eager")


def unsupported_reason(model) -> str | None:
    """Why ``model`` cannot take a packed forward (None: it can): its attention implementation must accept a
    custom 4-D mask and no layer may use a sliding window."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in MASKED_ATTENTION:
        return (
            f"padding_free needs attn_implementation in {list(MASKED_ATTENTION)} (a custom 4-D attention "
            f"mask), got {impl!r}"
        )
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or (
        getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None)
    ):
        return (
            "padding_free cannot pack a model with sliding-window attention layers (the packed mask replaces "
            "the window)"
        )
    return None


@dataclass
class PackedRows:
    """Model inputs of a packed micro-batch and the map back to the Experience layout.

    Shapes: ``input_ids``, ``position_ids`` (R, T); ``mask`` (R, 1, T, T) bool, True = may attend; ``index``
    (B, C) int64 positions in the flattened (R * T) packed tokens whose hidden state predicts completion token t
    of row b (0 past the row's last token).
    """

    input_ids: Tensor
    position_ids: Tensor
    mask: Tensor
    index: Tensor

    @property
    def computed_tokens(self) -> int:
        """Tokens the packed forward computes, padding of the packed rows included."""
        return int(self.input_ids.numel())

    def model_kwargs(self, attn_implementation: str, dtype: torch.dtype) -> dict[str, Tensor]:
        """Keyword arguments of the CausalLM call: the mask as the attention implementation reads it."""
        mask = self.mask
        if attn_implementation == "eager":  # additive: 0 where visible, the dtype's minimum elsewhere
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": mask}

    def gather(self, hidden: Tensor) -> Tensor:
        """(R, T, H) packed hidden states -> (B, C, H) in the Experience's completion layout (differentiable)."""
        H = hidden.shape[-1]
        return hidden.reshape(-1, H).index_select(0, self.index.reshape(-1)).view(*self.index.shape, H)


def _first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each summing to at most ``capacity`` (an item larger than it gets a bin alone),
    largest items first; deterministic (ties by index)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for j, r in enumerate(room):
            if sizes[i] <= r:
                bins[j].append(i)
                room[j] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return bins


def pack_rows(
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    row_tokens: int = DEFAULT_ROW_TOKENS,
    device: torch.device | None = None,
) -> PackedRows | None:
    """Pack a micro-batch's real tokens (see the module doc); None when the layout does not allow it (no
    completion column, a row without a prompt token, or real tokens that are not one contiguous run on each
    side of ``prompt_len``), in which case the caller runs its padded forward.

    Shapes:
        input_ids, attention_mask: (B, P + C), prompts left-padded to ``prompt_len`` = P, completions
        right-padded, on any device (each may be on its own: the no-grad passes hand over the Experience as
        the rollout left it, on the CPU). Returns ``PackedRows`` on ``device`` (default: ``input_ids``').
    """
    dev = input_ids.device if device is None else torch.device(device)
    # The layout is planned on the CPU whatever the inputs' device: it reads every length into Python (.tolist())
    # anyway, so two small copies replace a device sync per read, and inputs on two devices cannot meet in an op.
    input_ids, attention_mask = input_ids.cpu(), attention_mask.cpu()
    B, width = input_ids.shape
    P, C = prompt_len, width - prompt_len
    if C < 1 or P < 1 or B < 1:
        return None
    att = attention_mask.bool()
    plen, clen = att[:, :P].sum(1), att[:, P:].sum(1)  # (B,)
    cols = torch.arange(width, device=att.device)
    contiguous = (att == ((cols >= P - plen[:, None]) & (cols < P + clen[:, None]))).all()
    if not bool(contiguous) or int(plen.min()) < 1:
        return None
    sel = distinct_prompts(input_ids, attention_mask, P)
    first, inverse = (
        (sel[0].tolist(), sel[1].tolist()) if sel is not None else (list(range(B)), list(range(B)))
    )
    plen_l, clen_l, ids = plen.tolist(), clen.tolist(), input_ids
    members: list[list[int]] = [[] for _ in first]
    for b, u in enumerate(inverse):
        members[u].append(b)
    fed = [max(c - 1, 0) for c in clen_l]  # completion tokens fed per row: the last one predicts nothing
    # Units: a prompt and rows that share it, split so that a unit stays within row_tokens (the prompt then
    # repeats in each part): a whole long group in one unit would make a packed row, and its dense attention,
    # as long as all of the group's completions together.
    units: list[tuple[int, list[int]]] = []  # (row holding the prompt, member rows)
    for u, f in enumerate(first):
        cur: list[int] = []
        size = plen_l[f]
        for b in members[u]:
            if cur and size + fed[b] > row_tokens:
                units.append((f, cur))
                size, cur = plen_l[f], []
            cur.append(b)
            size += fed[b]
        units.append((f, cur))
    sizes = [plen_l[f] + sum(fed[b] for b in mem) for f, mem in units]
    bins = _first_fit_decreasing(sizes, max([row_tokens, *sizes]))
    R, T = len(bins), max(sum(sizes[u] for u in b) for b in bins)
    p_ids = torch.zeros(R, T, dtype=torch.long)
    p_pos = torch.zeros(R, T, dtype=torch.long)
    unit_of = torch.full((R, T), -1, dtype=torch.long)  # -1: padding of the packed row
    owner_of = torch.full((R, T), -1, dtype=torch.long)  # -1: a prompt token (or padding)
    index = torch.zeros(B, C, dtype=torch.long)
    for r, row_units in enumerate(bins):
        at = r * T  # flat position of the unit's first token
        for u in row_units:
            f, mem = units[u]
            p = plen_l[f]
            toks, owner, pos = ids[f, P - p : P].tolist(), [-1] * p, list(range(p))
            for m in mem:
                start = at + len(toks)  # flat position of row m's first fed completion token
                if (
                    clen_l[m] > 0
                ):  # t = 0 is predicted by the prompt's last token, t >= 1 by completion token t-1
                    index[m, 0] = at + p - 1
                    index[m, 1 : clen_l[m]] = torch.arange(start, start + fed[m])
                toks += ids[m, P : P + fed[m]].tolist()
                owner += [m] * fed[m]
                pos += range(p, p + fed[m])
            n, col = len(toks), at - r * T
            p_ids[r, col : col + n] = torch.tensor(toks, dtype=torch.long)
            p_pos[r, col : col + n] = torch.tensor(pos, dtype=torch.long)
            owner_of[r, col : col + n] = torch.tensor(owner, dtype=torch.long)
            unit_of[r, col : col + n] = u
            at += n
    q_unit, k_unit = unit_of[:, :, None], unit_of[:, None, :]
    q_own, k_own = owner_of[:, :, None], owner_of[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = (q_unit == k_unit) & causal & ((k_own == -1) | (k_own == q_own))
    mask |= torch.eye(T, dtype=torch.bool)  # padding attends itself: no all-masked row (NaN in sdpa)
    return PackedRows(p_ids.to(dev), p_pos.to(dev), mask[:, None].to(dev), index.to(dev))
