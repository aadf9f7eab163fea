"""Prompt records, the batch object the RolloutCallback fills, and loading of prompt sets."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Prompt:
    """One task instance.

    Either ``prompt`` (raw text fed to the model as-is) or ``messages`` (chat turns, rendered with the
    tokenizer's chat template) must be set. ``answer`` is what verifiers compare against; ``domain`` routes
    to a teacher / per-domain metrics; ``metadata`` carries anything else (tests, privileged context, ...).
    """

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    answer: Any = None
    domain: str = "default"
    metadata: dict[str, Any] = field(default_factory=dict)
    uid: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("Prompt needs exactly one of 'prompt' (text) or 'messages' (chat turns)")

    @classmethod
    def from_dict(cls, d: dict[str, Any], index: int | None = None) -> "Prompt":
        known = {"prompt", "messages", "answer", "domain", "metadata", "uid"}
        where = f"record {index}" if index is not None else "record"
        if "prompt" not in d and "messages" not in d:
            raise ValueError(f"{where}: missing field 'prompt' (or 'messages'); fields present: {sorted(d)}")
        extra = {k: v for k, v in d.items() if k not in known}
        meta = dict(d.get("metadata") or {}, **extra)
        return cls(
            prompt=d.get("prompt"),
            messages=d.get("messages"),
            answer=d.get("answer"),
            domain=str(d.get("domain", "default")),
            metadata=meta,
            uid=d.get("uid", None if index is None else str(index)),
        )


class PromptBatch:
    """What one training step receives: prompt records, later annotated with the step's ``Experience``.

    Deliberately a plain class (not a dataclass/tuple) so Lightning's batch-to-device transfer treats it
    as opaque; the RolloutCallback fills ``experience`` in ``on_train_batch_start`` and the module reads it.
    """

    def __init__(self, prompts: list[Prompt]):
        self.prompts = prompts
        self.experience = None  # set by RolloutCallback
        self.metrics: dict[str, float] = {}  # rollout-side metrics, logged by the module

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:
        return f"PromptBatch({len(self.prompts)} prompts, experience={'set' if self.experience else 'none'})"


def collate_prompts(items: list[Prompt]) -> PromptBatch:
    return PromptBatch(list(items))


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Read prompt records (one JSON object per line: prompt|messages, answer, domain, ...)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    out = []
    with path.open() as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1}: not valid JSON ({e})") from None
            out.append(Prompt.from_dict(d, index=i))
    return out


def render_prompt(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids of a prompt: raw text as-is, chat messages through the tokenizer's chat template."""
    if prompt.messages is not None:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding (a mapping, not a dict)
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"]
