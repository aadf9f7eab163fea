"""Tools as users write them: typed Python functions, their calls parsed from the model's text, run, and
answered.

A tool is a plain function (or a bound method, or an ``async def``) with type hints and a Google-style docstring;
its JSON schema is transformers' ``get_json_schema`` of the function (the format chat templates take as
``tools=``), or a schema given explicitly (``Tool(fn, schema)``). That is what TRL's ``GRPOTrainer(tools=...)``
takes, so a TRL tool list is used unchanged.

Calls are parsed from the action text in the Hermes / Qwen format the ChatML template family uses::

    <tool_call>
    {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    </tool_call>

(several blocks = several calls, run in order; ``arguments`` may also be a JSON string holding the object, as
OpenAI-style clients send it). Nothing a model writes can crash the loop: each call ends as a ``ToolResult`` whose
``content`` the model reads in the next ``tool`` message, with ``error`` one of ``ERROR_KINDS`` (counted per
episode, ``agent_loop.EnvRewards``) when it failed:

- ``malformed``: a ``<tool_call>`` block that is not a JSON object with a string ``name`` (or has no closing tag);
- ``unknown_tool``: a name that is not one of the tools (the message lists them);
- ``bad_arguments``: arguments the function's signature does not accept (missing, unexpected);
- ``raised``: the function raised (the message has the exception's type and text).

Where TRL departs: its parser turns a malformed call into plain text (the episode ends without telling the
model); here it is an error observation, as an unknown tool or a raising tool are in both. A result that is not a
string is sent as JSON when it is JSON-serialisable (``str(result)`` otherwise, TRL's rule for everything).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "raised")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A callable the model may call, with its JSON schema (``{"type": "function", "function": {name,
    description, parameters}}``). ``schema=None``: transformers' ``get_json_schema(fn)`` (type hints + docstring;
    a clear error names the function when they are missing)."""

    fn: Callable[..., Any]
    schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a tool must be callable, got {type(self.fn).__name__}")
        if self.schema is None:
            from transformers.utils import get_json_schema

            try:
                object.__setattr__(self, "schema", get_json_schema(self.fn))
            except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
                raise ValueError(
                    f"tool {getattr(self.fn, '__name__', self.fn)!r}: no JSON schema from its signature ({e}); "
                    "give every argument a type hint and a Google-style docstring with an Args section, or pass "
                    "Tool(fn, schema={...})"
                ) from e
        fn = (self.schema or {}).get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(
                f"tool schema must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}, "
                f"got {self.schema!r}"
            )

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]  # type: ignore[index]  # never None after __post_init__


def as_tools(tools: Iterable[Callable[..., Any] | Tool]) -> list[Tool]:
    """``Tool`` for each function (a ``Tool`` is kept); duplicate names are refused (a call must name one)."""
    out = [t if isinstance(t, Tool) else Tool(t) for t in tools]
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tools with the same name: {dup}; each tool needs its own name")
    return out


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block: ``name`` and ``arguments`` when it parsed, else ``error`` says why."""

    raw: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None

    def as_message_call(self) -> dict[str, Any]:
        """The OpenAI / chat-template form of the call (``assistant`` messages' ``tool_calls`` entries)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments or {}}}


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text`` in order (an opening tag left open runs to the end
    and is malformed). Text outside the blocks is the model's prose and is ignored."""
    calls = []
    for m in _BLOCK.finditer(text):
        body, closed = m.group(1).strip(), bool(m.group(2))
        calls.append(_parse_body(body, closed))
    return calls


def _parse_body(body: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall(body, error=f"malformed tool call: no closing {CALL_CLOSE}")
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(body, error=f"malformed tool call: not JSON ({e.msg} at character {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(body, error='malformed tool call: expected {"name": "<tool>", "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # OpenAI-style: the arguments object serialised as a string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(body, obj["name"], error="malformed tool call: arguments must be a JSON object")
    return ToolCall(body, obj["name"], args)


@dataclass(frozen=True)
class ToolResult:
    """What a call came to: the ``tool`` message's ``content`` and, for a failed call, its ``ERROR_KINDS`` kind."""

    name: str
    content: str
    error: str | None = None

    def message(self) -> dict[str, str]:
        return {"role": "tool", "name": self.name, "content": self.content}


class ToolBox:
    """The tools of one episode by name; ``execute`` runs a parsed call and never raises."""

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool]):
        self.tools = {t.name: t for t in as_tools(tools)}

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]  # type: ignore[misc]  # set by Tool.__post_init__

    def execute(self, call: ToolCall) -> ToolResult:
        name = call.name or "unknown"
        if call.error is not None:
            return _failed(name, "malformed", call.error)
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return _failed(name, "unknown_tool", f"unknown tool {name[:60]!r}; tools: {known}")
        args = call.arguments or {}
        try:
            inspect.signature(tool.fn).bind(**args)
        except TypeError as e:
            return _failed(name, "bad_arguments", f"bad arguments for {name}: {e}")
        try:
            result = tool.fn(**args)
            if inspect.isawaitable(result):
                result = run_awaitable(result)
        except Exception as e:  # noqa: BLE001 - whatever a tool raises, the model reads it; the loop goes on
            return _failed(name, "raised", f"{type(e).__name__}: {e}")
        return ToolResult(name, _content(result))


def _failed(name: str, kind: str, why: str) -> ToolResult:
    return ToolResult(name, json.dumps({"error": why}), kind)


def _content(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)


def run_awaitable(awaitable: Any) -> Any:
    """Run an async tool to completion: on a fresh event loop here, or in a worker thread when this thread
    already runs one (a notebook)."""

    async def run():
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
