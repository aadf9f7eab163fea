"""Stage 1, render: prompts → token ids, with the prompt-length policy (its one owner).

``Prompt.prompt`` (raw text) is tokenized as-is, ``Prompt.messages`` through the tokenizer's chat template
(``lit_rl.data.prompts.render_prompt``). A prompt longer than its limit is truncated (its *last* tokens kept),
dropped, or refused, and each truncation / drop is counted: the counters are part of the rollout state a
checkpoint keeps and are logged as ``rollout/prompts_truncated`` / ``rollout/prompts_dropped``.

The limit is ``max_prompt_len``, and also the engine's context minus the completion budget
(``max_model_len - max_new_tokens``) when the engine has a context length (vLLM engines). This is the only
place a prompt is shortened: the token ids the Experience is built from are exactly the ids the engine
sampled from (engines refuse a prompt over their context instead of cutting it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from lit_rl.core.names import OverlongPrompts
from lit_rl.data.prompts import Prompt, render_prompt

OVERLONG: tuple[str, ...] = get_args(OverlongPrompts)  # declared once as the Literal (core/names.py)


def engine_context_len(engine) -> int | None:
    """The engine's context length (prompt + completion tokens), or None (none declared, or not started):
    ``limits()["max_model_len"]`` of the engine contract (``rollout/base.py``)."""
    n = engine.limits().get("max_model_len")
    return int(n) if n else None


class PromptRenderer:
    """Render a batch of prompts to token ids.

    Args:
        max_prompt_len, overlong: ``RolloutSettings.max_prompt_len`` / ``overlong_prompts`` (declared and
            documented in ``rollout/settings.py``; no defaults here, so that declaration is the only one).
        context_len: returns the engine's context length (None = no such limit), read at every call because
            engines start late (``engine_context_len``).
        max_new_tokens: the completion budget the context must leave room for (a call may pass its own).
        chat_template_kwargs: extra variables of the tokenizer's chat template (``SamplingConfig`` field of the
            same name, e.g. ``{"enable_thinking": False}``).

    ``counters``: ``prompts_truncated`` / ``prompts_dropped`` since the start of training (checkpointed by the
    owner of the stage).
    """

    def __init__(
        self,
        max_prompt_len: int,
        overlong: str,
        context_len: Callable[[], int | None] | None = None,
        max_new_tokens: int | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        if overlong not in OVERLONG:
            raise ValueError(f"overlong_prompts={overlong!r}; valid values: {', '.join(OVERLONG)}")
        self.max_prompt_len, self.overlong = max_prompt_len, overlong
        self.context_len, self.max_new_tokens = context_len, max_new_tokens
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.counters = {"prompts_truncated": 0, "prompts_dropped": 0}

    def limit(self, max_new_tokens: int | None = None) -> tuple[int, str]:
        """(most prompt tokens, which setting decides it)."""
        ctx = self.context_len() if self.context_len is not None else None
        if ctx is None:
            return self.max_prompt_len, f"max_prompt_len={self.max_prompt_len}"
        budget = max_new_tokens if max_new_tokens is not None else (self.max_new_tokens or 0)
        room = ctx - budget
        if room < 1:
            raise ValueError(
                f"max_new_tokens={budget} leaves no room for a prompt within the engine's max_model_len={ctx}"
            )
        if room < self.max_prompt_len:
            return room, f"{room} (the engine's max_model_len={ctx} - max_new_tokens={budget})"
        return self.max_prompt_len, f"max_prompt_len={self.max_prompt_len}"

    def __call__(
        self, tokenizer, prompts: list[Prompt], max_new_tokens: int | None = None, count: bool = True
    ) -> tuple[list[Prompt], list[list[int]]]:
        """(kept prompts, their token ids): N prompts in, N' <= N out (fewer only with ``drop``).
        ``count=False`` leaves the counters alone (held-out evaluation)."""
        limit, why = self.limit(max_new_tokens)
        kept, ids = [], []
        for p in prompts:
            t = render_prompt(p, tokenizer, self.chat_template_kwargs)
            if len(t) > limit:
                if self.overlong == "error":
                    raise ValueError(f"prompt {p.uid!r} has {len(t)} tokens > {why}")
                if self.overlong == "drop":
                    self.counters["prompts_dropped"] += count
                    continue
                self.counters["prompts_truncated"] += count
                t = t[-limit:]  # keep the end: it holds the question and the generation prompt
            kept.append(p)
            ids.append(t)
        if not kept:
            raise ValueError(f"every prompt of the batch exceeded {why} and was dropped")
        return kept, ids
