"""Chat rendering for episodes: the opening conversation once, then each observation as new tokens only.

``ChatRenderer`` turns an episode's text into token ids through the tokenizer's own chat template, in two
moments and never again:

- ``prompt_ids(messages)``: the opening conversation (system, an optional demonstration exchange, the task),
  rendered once with the generation prompt. Tool schemas go in through the template's ``tools=`` when the
  template renders them (``renders_tools``: it is probed with a tool of a unique name); otherwise through the
  **system-prompt fallback** (``fallback_system``): the schemas as JSON lines and how to write a call, added to
  the system message (a new one when there is none). SmolLM2's template has no tools and takes the fallback.
  With the fallback an assistant message's ``tool_calls`` become ``<tool_call>`` blocks in its text, the form
  the model is asked to write.
- ``observation_ids(action_ids, messages)``: after the engine sampled an action, the tokens that close the
  assistant turn (those of the template's end of turn the action did not end with: a sampled end-of-turn
  token is kept as sampled, a cut or other-eos action gets it added) followed by the observation messages
  (``tool`` results, or a ``user`` turn) and the next generation prompt. The text comes from the template
  rendering a fixed two-message conversation with and without the observation (the template must keep the
  prefix: a clear error otherwise); only that suffix is tokenised.

The context the engine continues from is therefore ``prompt_ids + a_1 + o_1 + a_2 + ...``, exactly the ids that
are trained on: the history is never re-rendered or re-tokenised (re-rendering would turn sampled tokens into the
tokenizer's canonical split and the sampled end of turn into the template's; ``tests/agent/test_token_exact.py``
shows both).
"""

from __future__ import annotations

import json
from typing import Any

_PROBE = "lit_rl_probe_tool_7f3a"
_MARK = "lit_rl_marker_9c1e"
_PROBE_SCHEMA = {
    "type": "function",
    "function": {
        "name": _PROBE,
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


def fallback_system(schemas: list[dict[str, Any]]) -> str:
    """The system-prompt text that describes the tools to a template without tool support."""
    lines = "\n".join(json.dumps(s["function"]) for s in schemas)
    return (
        "You can call tools. To call one, write\n"
        '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
        "and the result comes back in a tool message. Available tools:\n" + lines
    )


def _ids(out: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns a list or a BatchEncoding, depending on the version."""
    return list(out if isinstance(out, list) else out["input_ids"])


def renders_tools(tokenizer) -> bool:
    """Whether the chat template puts ``tools=`` schemas into the prompt (probed with a unique tool name)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}],
            tools=[_PROBE_SCHEMA],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # noqa: BLE001 - a template that fails on tools has none (jinja raises anything)
        return False
    return _PROBE in text


class ChatRenderer:
    """Token ids of an episode's opening conversation and of each observation (module doc).

    Args:
        tokenizer: a tokenizer with a chat template.
        tools: the episode's tool schemas (``ToolBox.schemas``); empty = no tools.
        max_obs_tokens: each observation message's content is cut to this many tokens (``" [truncated]"``).
    """

    def __init__(self, tokenizer, tools: list[dict[str, Any]] | None = None, max_obs_tokens: int = 256):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        self.tok, self.tools, self.max_obs_tokens = tokenizer, list(tools or []), max_obs_tokens
        self.native = bool(self.tools) and renders_tools(tokenizer)
        self._close = self._turn_close()

    # ------------------------------------------------------------------ the template
    def _render(self, messages: list[dict[str, Any]], gen: bool, tokenize: bool = False) -> Any:
        kw: dict[str, Any] = {"tools": self.tools} if self.native else {}
        return self.tok.apply_chat_template(
            self.messages(messages), tokenize=tokenize, add_generation_prompt=gen, **kw
        )

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What the template is given: with the fallback, the tools described in the system message and
        assistant ``tool_calls`` written out as ``<tool_call>`` blocks."""
        if not self.tools or self.native:
            return list(messages)
        out = [_calls_as_text(m) for m in messages]
        desc = fallback_system(self.tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{desc}"}
        else:
            out.insert(0, {"role": "system", "content": desc})
        return out

    def _turn_close(self) -> list[int]:
        """Token ids the template writes after an assistant message's content (e.g. ``<|im_end|>``, newline)."""
        text = self._render(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}], False
        )
        if _MARK not in text:
            raise ValueError("the chat template does not render an assistant message's content")
        return self._encode(text[text.rindex(_MARK) + len(_MARK) :])

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ episodes
    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The opening conversation with the generation prompt."""
        return _ids(self._render(messages, True, tokenize=True))

    def observation_ids(self, action_ids: list[int], messages: list[dict[str, Any]]) -> list[int]:
        """The ids that follow a sampled action: the rest of its end of turn, then ``messages`` (each content cut
        to ``max_obs_tokens``) and the generation prompt."""
        messages = [self._cut(m) for m in messages]
        close = self._close
        keep = next(k for k in range(len(close), -1, -1) if k == 0 or action_ids[-k:] == close[:k])
        rest = self.tok.decode(close[keep:], skip_special_tokens=False)
        return self._encode(rest + self._suffix(messages))

    def _suffix(self, messages: list[dict[str, Any]]) -> str:
        """Template text of ``messages`` + the generation prompt after a fixed user / assistant exchange (the
        assistant's call named like the first tool result, for templates that pair results with calls)."""
        names = [m.get("name") for m in messages if m.get("role") == "tool"]
        asst: dict[str, Any] = {"role": "assistant", "content": _MARK}
        if names:
            asst["tool_calls"] = [
                {"type": "function", "function": {"name": n, "arguments": {}}} for n in names
            ]
        head = [{"role": "user", "content": "u"}, asst]
        prefix, full = self._render(head, False), self._render(head + messages, True)
        if not full.startswith(prefix):
            raise ValueError(
                "the chat template re-renders earlier messages when a message is added (not prefix-preserving): "
                "observations cannot be appended token-exactly; use a template that keeps the prefix"
            )
        return full[len(prefix) :]

    def _cut(self, m: dict[str, Any]) -> dict[str, Any]:
        content = m.get("content")
        if not isinstance(content, str):
            return m
        ids = self._encode(content)
        if len(ids) <= self.max_obs_tokens:
            return m
        return {**m, "content": self.tok.decode(ids[: self.max_obs_tokens]) + " [truncated]"}


def _calls_as_text(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if m.get("role") != "assistant" or not calls:
        return m
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        + "\n</tool_call>"
        for c in calls
    ]
    text = "\n".join([m["content"], *blocks] if m.get("content") else blocks)
    return {k: v for k, v in m.items() if k != "tool_calls"} | {"content": text}
