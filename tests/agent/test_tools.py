"""Tools as users write them (issue 54.1): schemas from typed functions, calls parsed from the model's text,
every failure an observation with its kind, rendering through the chat template or the system-prompt fallback."""

from __future__ import annotations

import json

import pytest
from _tool_helpers import TOOL_TEMPLATE, async_add, multiply
from transformers import AutoTokenizer

from lit_rl.rollout.chat import ChatRenderer, renders_tools
from lit_rl.rollout.tools import Tool, ToolBox, ToolCall, ToolResult, parse_tool_calls

MULTIPLY_SCHEMA = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiplies two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first integer."},
                "b": {"type": "integer", "description": "The second integer."},
            },
            "required": ["a", "b"],
        },
        "return": {"type": "integer", "description": "The product of the two integers."},
    },
}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


# ---------------------------------------------------------------- schemas
def test_schema_comes_from_the_signature_and_docstring():
    assert Tool(multiply).schema == MULTIPLY_SCHEMA and Tool(multiply).name == "multiply"
    given = {"type": "function", "function": {"name": "times", "parameters": {"type": "object"}}}
    assert Tool(multiply, given).name == "times"  # an explicit schema wins


def test_a_tool_without_docstring_or_hints_is_refused_by_name():
    def bare(x):
        return x

    with pytest.raises(ValueError, match="tool 'bare': no JSON schema.*type hint.*docstring"):
        Tool(bare)
    with pytest.raises(ValueError, match="tools with the same name: \\['multiply'\\]"):
        ToolBox([multiply, multiply])
    with pytest.raises(ValueError, match="tool schema must be"):
        Tool(multiply, {"name": "multiply"})


# ---------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, calls",
    [
        (
            'I will call it.<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
            [ToolCall('{"name": "multiply", "arguments": {"a": 3, "b": 4}}', "multiply", {"a": 3, "b": 4})],
        ),
        (  # two calls in one reply, the second with OpenAI-style string arguments
            '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>',
            [
                ToolCall('{"name": "a", "arguments": {}}', "a", {}),
                ToolCall('{"name": "b", "arguments": "{\\"x\\": 1}"}', "b", {"x": 1}),
            ],
        ),
        ("the answer is 12", []),
        (
            "<tool_call>{name: multiply}</tool_call>",
            [
                ToolCall(
                    "{name: multiply}",
                    error="malformed tool call: not JSON (Expecting property name enclosed in double quotes "
                    "at character 1)",
                )
            ],
        ),
        (
            '<tool_call>{"arguments": {"a": 1}}</tool_call>',
            [
                ToolCall(
                    '{"arguments": {"a": 1}}',
                    error='malformed tool call: expected {"name": "<tool>", "arguments": {...}}',
                )
            ],
        ),
        (
            '<tool_call>{"name": "multiply", "arguments": [3, 4]}</tool_call>',
            [
                ToolCall(
                    '{"name": "multiply", "arguments": [3, 4]}',
                    "multiply",
                    error="malformed tool call: arguments must be a JSON object",
                )
            ],
        ),
        (
            '<tool_call>{"name": "multiply", "arguments": {"a": 3',
            [
                ToolCall(
                    '{"name": "multiply", "arguments": {"a": 3',
                    error="malformed tool call: no closing </tool_call>",
                )
            ],
        ),
    ],
    ids=["one", "two", "none", "not_json", "no_name", "args_not_object", "unclosed"],
)
def test_parse_tool_calls(text, calls):
    assert parse_tool_calls(text) == calls


# ---------------------------------------------------------------- execution: every failure is an observation
def _boom(x: int) -> int:
    """Always fails.

    Args:
        x: ignored.
    """
    raise ZeroDivisionError("division by zero")


def _lookup(key: str) -> dict:
    """A record.

    Args:
        key: its key.
    """
    return {"key": key, "n": 2}


@pytest.mark.parametrize(
    "text, result",
    [
        (
            '<tool_call>{"name": "multiply", "arguments": {"a": 347, "b": 829}}</tool_call>',
            ToolResult("multiply", "287663"),
        ),
        (
            '<tool_call>{"name": "async_add", "arguments": {"a": 2, "b": 40}}</tool_call>',
            ToolResult("async_add", "42"),
        ),
        (
            '<tool_call>{"name": "_lookup", "arguments": {"key": "k"}}</tool_call>',
            ToolResult("_lookup", '{"key": "k", "n": 2}'),
        ),
        (
            '<tool_call>{"name": "divide", "arguments": {"a": 1}}</tool_call>',
            ToolResult(
                "divide",
                '{"error": "unknown tool \'divide\'; tools: multiply, async_add, _boom, _lookup"}',
                "unknown_tool",
            ),
        ),
        (
            '<tool_call>{"name": "multiply", "arguments": {"a": 3}}</tool_call>',
            ToolResult(
                "multiply",
                '{"error": "bad arguments for multiply: missing a required argument: \'b\'"}',
                "bad_arguments",
            ),
        ),
        (
            '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4, "c": 5}}</tool_call>',
            ToolResult(
                "multiply",
                '{"error": "bad arguments for multiply: got an unexpected keyword argument \'c\'"}',
                "bad_arguments",
            ),
        ),
        (
            '<tool_call>{"name": "_boom", "arguments": {"x": 1}}</tool_call>',
            ToolResult("_boom", '{"error": "ZeroDivisionError: division by zero"}', "raised"),
        ),
        (
            "<tool_call>not json</tool_call>",
            ToolResult(
                "unknown",
                '{"error": "malformed tool call: not JSON (Expecting value at character 0)"}',
                "malformed",
            ),
        ),
    ],
    ids=["ok", "async", "json_result", "unknown", "missing_arg", "extra_arg", "raises", "malformed"],
)
def test_execute_never_raises_and_names_the_failure(text, result):
    box = ToolBox([multiply, async_add, _boom, _lookup])
    (call,) = parse_tool_calls(text)
    assert box.execute(call) == result
    assert result.message() == {"role": "tool", "name": result.name, "content": result.content}


# ---------------------------------------------------------------- rendering
FALLBACK = (
    "You can call tools. To call one, write\n"
    '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
    "and the result comes back in a tool message. Available tools:\n"
    '{"name": "multiply", "description": "Multiplies two integers.", "parameters": {"type": "object", '
    '"properties": {"a": {"type": "integer", "description": "The first integer."}, "b": {"type": "integer", '
    '"description": "The second integer."}}, "required": ["a", "b"]}, "return": {"type": "integer", '
    '"description": "The product of the two integers."}}'
)
DEMO = [
    {"role": "user", "content": "What is 12 * 34?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "multiply", "arguments": {"a": 12, "b": 34}}}
        ],
    },
    {"role": "tool", "name": "multiply", "content": "408"},
    {"role": "assistant", "content": "408"},
]
CALL_TEXT = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'


def test_templates_without_tools_take_the_system_prompt_fallback(tok, smollm2_dir):
    """The tiny ChatML template and SmolLM2's ignore ``tools=``: the schemas go into the system message, and
    the demonstration's call is written the way the model is asked to write one."""
    smol = AutoTokenizer.from_pretrained(smollm2_dir)
    for t in (tok, smol):
        assert not renders_tools(t)
        r = ChatRenderer(t, [MULTIPLY_SCHEMA])
        assert not r.native
        ids = r.prompt_ids(
            [{"role": "system", "content": "Be brief."}, *DEMO, {"role": "user", "content": "Q"}]
        )
        assert t.decode(ids) == (
            f"<|im_start|>system\nBe brief.\n\n{FALLBACK}<|im_end|>\n"
            "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
            f"<|im_start|>assistant\n{CALL_TEXT}<|im_end|>\n"
            "<|im_start|>tool\n408<|im_end|>\n"
            "<|im_start|>assistant\n408<|im_end|>\n"
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
        )
    # without a system message of its own, the fallback is the system message (SmolLM2's default one is replaced)
    ids = ChatRenderer(smol, [MULTIPLY_SCHEMA]).prompt_ids([{"role": "user", "content": "Q"}])
    assert smol.decode(ids) == (
        f"<|im_start|>system\n{FALLBACK}<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    # no tools: the template as it is (SmolLM2 adds its default system prompt)
    ids = ChatRenderer(smol).prompt_ids([{"role": "user", "content": "Q"}])
    assert smol.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_template_with_tools_renders_them_itself(tiny_model_dir):
    t = AutoTokenizer.from_pretrained(tiny_model_dir)
    t.chat_template = TOOL_TEMPLATE
    assert renders_tools(t)
    r = ChatRenderer(t, [MULTIPLY_SCHEMA])
    assert r.native
    ids = r.prompt_ids([*DEMO, {"role": "user", "content": "Q"}])
    schema = json.dumps(MULTIPLY_SCHEMA)  # transformers' tojson: json.dumps with the keys in order
    call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
    assert t.decode(ids) == (
        f"<|im_start|>system\n# Tools\n{schema}\n<|im_end|>\n"
        "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n"
        "<|im_start|>tool\n408<|im_end|>\n"
        "<|im_start|>assistant\n408<|im_end|>\n"
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    assert FALLBACK not in t.decode(ids)
