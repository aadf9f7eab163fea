"""Prompt records, the batch object the RolloutCallback fills, and loading of prompt sets."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lit_rl.jsonl import lines_note, read_jsonl

if TYPE_CHECKING:
    from lit_rl.data.experience import Experience


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
    def from_dict(
        cls,
        d: dict[str, Any],
        index: int | None = None,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        where: str | None = None,
        require_answer: bool = False,
    ) -> Prompt:
        """Build a record from one row, checking it. ``prompt_key`` holds the prompt: text, or a TRL-style
        conversation (a list of ``{role, content}``), which becomes ``messages``; a ``messages`` column is
        read as a conversation too. ``answer_key`` holds the answer (kept in ``metadata`` under that name too,
        so rewards read it as ``answer`` or by its column name). Other fields go to ``metadata``.
        Errors start with ``where`` (``file:line``) and name the field."""
        where = where or (f"record {index}" if index is not None else "record")
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object (one record per line), got {type(d).__name__}")
        key = prompt_key if prompt_key in d else "messages" if "messages" in d else None
        if key is None:
            raise ValueError(
                f"{where}: missing field {prompt_key!r} (the prompt: text or a list of "
                f"{{role, content}} messages); fields present: {sorted(d)}"
            )
        value, text, messages = d[key], None, None
        if isinstance(value, str):
            text = value
        elif isinstance(value, list):
            messages = _check_messages(value, f"{where}: field {key!r}")
        else:
            raise ValueError(
                f"{where}: field {key!r} must be a string or a list of {{role, content}} messages, "
                f"got {type(value).__name__}"
            )
        answer = d.get(answer_key)
        if require_answer and answer is None:
            raise ValueError(
                f"{where}: missing field {answer_key!r}: held-out records need an answer to be scored"
            )
        known = {key, answer_key, "domain", "metadata", "uid"}
        extra = {k: v for k, v in d.items() if k not in known}
        if (
            answer_key != "answer" and answer_key in d
        ):  # TRL-style rewards get the column under its own name too
            extra[answer_key] = d[answer_key]
        meta = d.get("metadata") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: field 'metadata' must be an object, got {type(meta).__name__}")
        uid = d.get("uid", None if index is None else str(index))
        return cls(
            prompt=text,
            messages=messages,
            answer=answer,
            domain=str(d.get("domain") or "default"),
            metadata=dict(meta, **extra),
            uid=None if uid is None else str(uid),
        )


def _check_messages(value: list, where: str) -> list[dict[str, str]]:
    if not value:
        raise ValueError(f"{where}: the conversation is empty")
    for j, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f'{where}: message {j} must be {{"role": str, "content": str}}, got {m!r}')
    return [{"role": m["role"], "content": m["content"]} for m in value]


class PromptBatch:
    """What one training step receives: prompt records, later annotated with the step's ``Experience``.

    Deliberately a plain class (not a dataclass/tuple) so Lightning's batch-to-device transfer treats it
    as opaque; the RolloutCallback fills ``experience`` in ``on_train_batch_start`` and the module reads it.
    """

    def __init__(self, prompts: list[Prompt]):
        self.prompts = prompts
        self.experience: Experience | None = None  # set by RolloutCallback
        self.metrics: dict[str, float] = {}  # rollout-side metrics, logged by the module

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:
        return f"PromptBatch({len(self.prompts)} prompts, experience={'set' if self.experience else 'none'})"


def collate_prompts(items: list[Prompt]) -> PromptBatch:
    return PromptBatch(list(items))


MAX_REPORTED_ERRORS = 20


class DataError(ValueError):
    """Bad prompt records: one line per record error, each starting with ``file:line``."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        more = (
            f"\n... and {len(errors) - MAX_REPORTED_ERRORS} more" if len(errors) > MAX_REPORTED_ERRORS else ""
        )
        super().__init__(
            f"{len(errors)} bad prompt record(s):\n" + "\n".join(errors[:MAX_REPORTED_ERRORS]) + more
        )


def load_jsonl(
    path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer", require_answer: bool = False
) -> list[Prompt]:
    """Read prompt records, one JSON object per line (see README "Your data"). Every bad line is reported
    (``path:line: why``, lines counted from 1) in one ``DataError``; blank lines are skipped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    out, errors, replaced = [], [], []
    # lit_rl.jsonl: lines end at "\n" only (a prompt may hold U+2028), text with no UTF-8 form is read as U+FFFD
    for line in read_jsonl(path):
        i, where = line.lineno - 1, f"{path}:{line.lineno}"
        if line.replaced:
            replaced.append(line.lineno)
        if line.error is not None:
            errors.append(f"{where}: not valid JSON ({line.error})")
            continue
        try:
            out.append(
                Prompt.from_dict(
                    line.value,
                    index=i,
                    prompt_key=prompt_key,
                    answer_key=answer_key,
                    where=where,
                    require_answer=require_answer,
                )
            )
        except ValueError as e:
            errors.append(str(e))
    if errors:
        raise DataError(errors)
    if replaced:
        warnings.warn(lines_note(path, replaced), UserWarning, stacklevel=2)
    return out


def records_from_rows(
    rows, source: str, prompt_key: str = "prompt", answer_key: str = "answer", require_answer: bool = False
) -> list[Prompt]:
    """Prompt records from an iterable of dict rows (a Hugging Face dataset split); errors name
    ``source:row`` (rows counted from 1)."""
    out, errors = [], []
    for i, row in enumerate(rows):
        try:
            out.append(
                Prompt.from_dict(
                    dict(row),
                    index=i,
                    prompt_key=prompt_key,
                    answer_key=answer_key,
                    where=f"{source}:row {i + 1}",
                    require_answer=require_answer,
                )
            )
        except ValueError as e:
            errors.append(str(e))
    if errors:
        raise DataError(errors)
    return out


def render_prompt(prompt: Prompt, tokenizer, chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of a prompt: raw text as-is, chat messages through the tokenizer's chat template
    (``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``, are the template's extra variables)."""
    if prompt.messages is not None:
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
        )
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding (a mapping, not a dict)
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"]
