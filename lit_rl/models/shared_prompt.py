"""One forward per distinct prompt: the G completions of a group reuse its prompt's key/value cache.

An Experience holds G rows per prompt (GRPO groups), and every row starts with the same left-padded prompt
tokens. A plain forward over ``input_ids`` (B, P+C) computes each prompt G times. Here the distinct prompts
(U <= B rows) run once with a KV cache, the cache is gathered out to the B rows (``index_select``, so the
gradient of every row flows back into the one shared prompt computation), and only the completion tokens
run per row. Same function, fewer FLOPs: with prompts as long as completions and G = 4, about 3/8 of the
forward (and of its backward) is saved.

The logits are those of the plain forward up to floating-point summation order (float64 agrees to ~1e-15;
tests/test_shared_prompt.py). Used only when it applies: rows that share a prompt exist, and the model's
cache is a plain per-layer key/value cache (``transformers`` ``DynamicCache`` of ``DynamicLayer``); otherwise
the caller runs its plain forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def distinct_prompts(
    input_ids: Tensor, attention_mask: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor] | None:
    """Rows with distinct prompts and, for each row, which of them it repeats; None if no prompt repeats.

    Two rows share a prompt when their first ``prompt_len`` tokens and attention-mask entries are equal
    (same tokens, same left padding), whatever their group ids or order.

    Shapes:
        input_ids, attention_mask: (B, L). Returns ``first`` (U,) int64 row indices (one row per distinct
        prompt) and ``inverse`` (B,) int64 in [0, U): row b's prompt is row ``first[inverse[b]]``'s.
    """
    B = input_ids.shape[0]
    if B < 2 or prompt_len < 1:
        return None
    key = torch.cat(
        [input_ids[:, :prompt_len], attention_mask[:, :prompt_len].to(input_ids.dtype)], 1
    )  # (B, 2P)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    U = uniq.shape[0]
    if U == B:
        return None
    rows = torch.arange(B, device=input_ids.device)
    first = torch.full((U,), B, dtype=torch.long, device=input_ids.device).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )  # (U,) smallest row index holding each prompt
    return first, inverse


def gatherable(cache) -> bool:
    """A cache whose layers are plain (batch, heads, tokens, dim) key/value tensors (no sliding window,
    no recurrent state): gathering its batch dimension is exactly repeating the prompt rows."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return False
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def _pass(model, project: bool, **kw) -> tuple[Any, Tensor]:
    """One CausalLM call; returns (output, logits) or, without ``project``, (output, LM-head input): the
    decoder's final-norm output, taken by a hook while the CausalLM projects no position (an empty
    ``logits_to_keep`` index), so no (b, L, V) tensor is created."""
    if project:
        out = model(**kw)
        return out, out.logits
    seen: dict[str, Tensor] = {}
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, o: seen.__setitem__(
            "h", o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]
        )
    )
    try:
        out = model(**kw, logits_to_keep=torch.zeros(0, dtype=torch.long, device=kw["input_ids"].device))
    finally:
        hook.remove()
    return out, seen["h"]


def shared_prompt_outputs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    prompt_len: int,
    project: bool = True,
) -> Tensor | None:
    """What predicts every completion token, computing each distinct prompt once; None = not applicable.

    ``project=True``: the logits (B, C, V). ``project=False``: the LM head's input (B, C, H) (the decoder's
    final-norm hidden states), for the chunked log-prob path (``core.fused_logprobs``) that never builds the
    logits. Entry t predicts token ``P + t`` (read at position ``P + t - 1``), exactly as
    ``model(...).logits[:, P-1:-1]`` of the plain forward: entry 0 comes from the last prompt position of the
    shared prompt pass, entries 1..C-1 from the completion pass over tokens ``P .. P+C-2`` (the last
    completion token predicts nothing, so it is never fed).

    Shapes:
        input_ids, attention_mask, position_ids: (B, P+C). Returns (B, C, V) or (B, C, H).
    """
    P = prompt_len
    C = input_ids.shape[1] - P
    sel = distinct_prompts(input_ids, attention_mask, P)
    if sel is None or C < 1:
        return None
    first, inverse = sel
    kw = {"logits_to_keep": 1} if project else {}
    head, head_out = _pass(
        model,
        project,
        input_ids=input_ids[first, :P],
        attention_mask=attention_mask[first, :P],
        position_ids=position_ids[first, :P],
        use_cache=True,
        **kw,
    )
    cache = head.past_key_values
    if not gatherable(cache):
        return None
    first_out = head_out[:, -1:].index_select(0, inverse)  # (B, 1, V|H): predicts completion token 0
    if C == 1:
        return first_out
    cache.reorder_cache(inverse)  # (U, ...) -> (B, ...): differentiable gather, gradients sum into the prompt
    _, tail = _pass(
        model,
        project,
        input_ids=input_ids[:, P:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, P:-1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([first_out, tail], 1)  # (B, C, V|H)


def shared_prompt_logits(
    model, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, prompt_len: int
) -> Tensor | None:
    """``shared_prompt_outputs(..., project=True)``: the logits (B, C, V); None = not applicable."""
    return shared_prompt_outputs(model, input_ids, attention_mask, position_ids, prompt_len, project=True)
