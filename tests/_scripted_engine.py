"""A rollout engine that plays a script instead of sampling: call k answers every context with action k (+ eos),
log-prob -0.5 per token. For agent tests that need exact episodes; an engine that really samples is
tests/conformance/_fake_engine.py. It takes the whole contract's defaults from ``EngineBase``."""

from __future__ import annotations

from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import Completion


class ScriptedEngine(EngineBase):
    def __init__(self, tokenizer, actions: list[str]):
        self.tokenizer, self.actions, self.calls, self.policy_version = tokenizer, actions, 0, 0

    def bind(self, module, rollout=None) -> None:
        pass

    def update_weights(self, named_tensors) -> None:
        self.policy_version += 1

    def generate(self, prompt_ids, n, sampling):
        ids = self.tokenizer(self.actions[self.calls], add_special_tokens=False)["input_ids"] + [
            self.tokenizer.eos_token_id
        ]
        self.calls += 1
        return [[Completion(list(ids), [-0.5] * len(ids), "stop") for _ in range(n)] for _ in prompt_ids]
