"""Stage 1, render: prompts → token ids, with the prompt-length policy.

``Prompt.prompt`` (raw text) is tokenized as-is, ``Prompt.messages`` through the tokenizer's chat template
(``lit_rl.data.prompts.render_prompt``). A prompt longer than ``max_prompt_len`` tokens is truncated (its
*last* tokens kept), dropped, or refused, and each truncation / drop is counted: the counters are part of the
rollout state a checkpoint keeps.
"""
from __future__ import annotations

from lit_rl.data.prompts import Prompt, render_prompt

OVERLONG = ("truncate", "drop", "error")


class PromptRenderer:
    """Render a batch of prompts to token ids.

    Args:
        max_prompt_len: prompts longer than this many tokens are handled per ``overlong``.
        overlong: ``truncate`` (keep the last tokens) | ``drop`` (counted) | ``error``.

    ``counters``: ``prompts_truncated`` / ``prompts_dropped`` since the start of training (checkpointed by the
    owner of the stage).
    """

    def __init__(self, max_prompt_len: int = 512, overlong: str = "truncate"):
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        if overlong not in OVERLONG:
            raise ValueError(f"overlong_prompts={overlong!r}; valid values: {', '.join(OVERLONG)}")
        self.max_prompt_len, self.overlong = max_prompt_len, overlong
        self.counters = {"prompts_truncated": 0, "prompts_dropped": 0}

    def __call__(self, tokenizer, prompts: list[Prompt]) -> tuple[list[Prompt], list[list[int]]]:
        """(kept prompts, their token ids): N prompts in, N' <= N out (fewer only with ``drop``)."""
        kept, ids = [], []
        for p in prompts:
            t = render_prompt(p, tokenizer)
            if len(t) > self.max_prompt_len:
                if self.overlong == "error":
                    raise ValueError(f"prompt {p.uid!r} has {len(t)} tokens > max_prompt_len={self.max_prompt_len}")
                if self.overlong == "drop":
                    self.counters["prompts_dropped"] += 1
                    continue
                self.counters["prompts_truncated"] += 1
                t = t[-self.max_prompt_len:]  # keep the end: it holds the question and the generation prompt
            kept.append(p)
            ids.append(t)
        if not kept:
            raise ValueError(f"every prompt of the batch exceeded max_prompt_len={self.max_prompt_len} and was dropped")
        return kept, ids
