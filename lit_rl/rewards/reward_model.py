"""`RewardModelReward`: score completions with a trained Bradley-Terry reward model inside a RewardPool."""

from __future__ import annotations

import threading
from typing import Any

import torch


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if getattr(prompt, "prompt", None) is not None:
        return prompt.prompt
    msgs = getattr(prompt, "messages", None) or []
    return "".join(m.get("content", "") for m in msgs)


class RewardModelReward:
    """Reward = the reward model's scalar for ``prompt text + completion`` (the same string it was trained on).

    Args:
        path: directory saved by ``RewardModelModule`` (or any ``AutoModelForSequenceClassification`` with
            ``num_labels=1``).
        device: where the reward model runs (default cpu).
        scale, shift: reward = scale · r + shift (reward models are only defined up to a shift).

    The model loads lazily on first use and is shared across the pool's worker threads (a lock serialises
    the forward passes; ``score_batch`` scores many completions in one forward).
    """

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        dtype: str = "float32",
        scale: float = 1.0,
        shift: float = 0.0,
        max_length: int | None = None,
    ):
        from lit_rl.models.loading import check_model_source

        check_model_source(path, "path")
        self.path, self.device, self.dtype, self.scale, self.shift = path, device, dtype, scale, shift
        self.max_length = max_length
        self._model = self._tok = None
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            from lit_rl.models.reward_head import load_reward_model

            model, tok = load_reward_model(self.path, self.dtype)
            self._model, self._tok = model.to(self.device).eval().requires_grad_(False), tok
        return self._model, self._tok

    @torch.no_grad()
    def score_batch(self, prompts: list[Any], completions: list[str]) -> list[float]:
        from lit_rl.models.reward_head import score_texts

        with self._lock:
            model, tok = self._load()
            r = score_texts(
                model, tok, [_prompt_text(p) + c for p, c in zip(prompts, completions)], self.max_length
            )
        return [self.scale * float(x) + self.shift for x in r]

    def __call__(self, prompt: Any, completion: str) -> float:
        return self.score_batch([prompt], [completion])[0]
