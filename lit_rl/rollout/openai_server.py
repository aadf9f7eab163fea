"""An OpenAI-compatible chat endpoint served from the rollout engine, recording every call's exact token ids.

``OpenAIServer`` listens on localhost (a free port) and answers ``POST /episodes/<id>/v1/chat/completions``
(with ``tools``) and ``GET /episodes/<id>/v1/models``: an agent written against the ``openai`` client runs unchanged
with ``base_url=server.open_episode(id)`` and any ``api_key``. The episode id is in the path, so each episode's
calls are recorded apart whatever the agent puts in ``model`` or its headers.

How a request becomes the engine's input (``_prompt_ids``), never by re-tokenising what the engine already
saw: when the request's messages are an earlier call's messages, then the assistant message that call
returned (content and tool calls equal), then only non-assistant messages (tool results, a user turn), the
input is that call's prompt ids + its sampled ids + ``ChatRenderer.observation_ids`` of the new messages (the
token-exact continuation the agent loop uses). Otherwise (the first call, or an agent that rewrote, dropped or
edited its history) the messages are rendered afresh with the chat template. Which calls of an episode make one
token-exact sequence is decided afterwards on the recorded ids alone (``agent_program.assemble``).

Sampling is the run's (``sampling``: temperature, top-p, ...): a request's own ``temperature`` / ``top_p`` are
ignored, since the trained log-probs must be those of the behaviour policy the trainer configured;
``max_tokens`` / ``max_completion_tokens`` may only lower ``max_new_tokens``. Concurrent requests are batched
(``_Batcher``: what queued while the engine generated goes into its next call). The reply's ``tool_calls`` are
the Hermes ``<tool_call>`` blocks of the sampled text (``tools.parse_tool_calls``) in OpenAI's form, and its
``content`` the text outside them; a reply with a malformed block is returned as text. ``logprobs: true`` returns
the sampled tokens' log-probs (``choices[0].logprobs.content``).

Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "code"}}``): 400 for a bad request (``stream``,
``n`` != 1, no messages, a context over ``max_context_tokens``, an episode over ``max_calls``), 404 for an
unknown episode, 410 once the episode is closed (past its deadline: the agent's thread may still be running and
must not reach the engine), 500 when the engine raised. The ``openai`` client retries none of the 4xx ones.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.chat import ChatRenderer
from lit_rl.rollout.sampling import SamplingConfig
from lit_rl.rollout.tools import CALL_CLOSE, CALL_OPEN, parse_tool_calls

_PATH = re.compile(r"^/episodes/([A-Za-z0-9_.-]+)/v1/(chat/completions|models)/?$")
_BLOCKS = re.compile(re.escape(CALL_OPEN) + r".*?(" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


class RequestError(Exception):
    """A request the endpoint refuses: HTTP ``status`` and an OpenAI error ``code``."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Call:
    """One chat completion as the engine saw it: ``prompt_ids`` in, ``completion_ids`` and their
    ``logprobs`` out. ``messages`` / ``reply`` are the request's and the answer's normalised messages
    (``normalise``), ``tools_key`` the request's tool schemas, ``extended`` whether the input continued an
    earlier call's ids (False: rendered afresh)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    tools_key: str
    extended: bool
    policy_version: int | None = None


@dataclass
class EpisodeRecord:
    """The calls of one episode, in the order they completed; ``closed``: no more calls accepted."""

    id: str
    calls: list[Call] = field(default_factory=list)
    closed: bool = False
    refused: dict[str, int] = field(default_factory=dict)  # refused requests by error code


def normalise(messages: Any) -> list[dict[str, Any]]:
    """Chat messages in the one form used to match requests and to render them: ``role``, ``content`` (a string;
    text parts joined, None -> ""), an assistant's ``tool_calls`` as ``{"type": "function", "function": {name,
    arguments}}`` with the arguments decoded from their JSON string (templates take a dict), a tool message's
    ``name`` (from the ``tool_call_id`` of the call it answers when not given). Other keys (ids, ``refusal``,
    ``annotations``, ...) are dropped: they reach no template."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "invalid_messages", "messages must be a non-empty list of chat messages")
    names: dict[str, str] = {}
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(
                400, "invalid_messages", f"messages[{k}] must be an object with a string 'role'"
            )
        msg: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and calls:
            msg["tool_calls"] = []
            for c in calls:
                fn = (c or {}).get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        pass  # kept as the string: it matches only the same string
                msg["tool_calls"].append(
                    {"type": "function", "function": {"name": fn.get("name"), "arguments": args}}
                )
                if c.get("id") and isinstance(fn.get("name"), str):
                    names[c["id"]] = fn["name"]
        if m["role"] == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id") or "")
            if name:
                msg["name"] = name
        out.append(msg)
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text ones, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RequestError(
        400, "invalid_messages", f"message content must be a string or a list of parts, got {content!r}"
    )


def reply_message(text: str) -> tuple[dict[str, Any], str | None]:
    """(the OpenAI ``message`` of a sampled text, its tool-call finish reason or None): ``tool_calls`` when the
    text has ``<tool_call>`` blocks that all parse, ``content`` the text outside them (None when empty); a
    malformed block leaves the whole text as ``content``."""
    calls = parse_tool_calls(text)
    if not calls or any(c.error is not None for c in calls):
        return {"role": "assistant", "content": text}, None
    rest = _BLOCKS.sub("", text).strip()
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments or {})},
        }
        for c in calls
    ]
    return {"role": "assistant", "content": rest or None, "tool_calls": tool_calls}, "tool_calls"


class _Batcher:
    """One thread that calls ``engine.generate``: requests that queued while it generated go into one call
    (grouped by sampling settings), so concurrent episodes share the engine's batches."""

    def __init__(self, engine: EngineBase, before_generate: Callable[[], None] | None = None):
        self.engine, self.before_generate = engine, before_generate
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="lit_rl-openai-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], sampling: SamplingConfig) -> Future:
        fut: Future = Future()
        self._q.put((prompt_ids, sampling, fut))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            items = [item]
            while True:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)  # finish this batch, then stop
                    break
                items.append(nxt)
            groups: dict[str, list] = {}
            for it in items:
                groups.setdefault(repr(it[1]), []).append(it)
            for group in groups.values():
                try:
                    if self.before_generate is not None:  # pushed weights load here, never during a call
                        self.before_generate()
                    version = self.engine.policy_version
                    out = self.engine.generate([it[0] for it in group], 1, group[0][1])
                    for it, (c,) in zip(group, out):
                        it[2].set_result(
                            c if c.policy_version is not None else replace(c, policy_version=version)
                        )
                except Exception as e:  # noqa: BLE001 - each waiting request answers with the engine's error
                    for it in group:
                        it[2].set_exception(e)


class OpenAIServer:
    """``/v1/chat/completions`` per episode from ``engine`` (module doc). A context manager; ``close`` stops it.

    Args:
        engine: a bound ``EngineBase`` (its tokenizer renders the messages).
        sampling: the run's sampling settings (``sampling`` may be replaced between batches).
        max_context_tokens: prompt + ``max_new_tokens`` at most (a request over it: 400 ``context_length_exceeded``).
        max_obs_tokens: each new message's content is cut to this many tokens (``ChatRenderer``).
        max_calls: chat completions per episode at most (more: 400 ``max_calls``).
        before_generate: called in the engine thread before each generate call (``AgentLoop``'s
            ``apply_pending_weights``: weights pushed during a batch load between calls, each call recording the
            ``policy_version`` that sampled it).
    """

    def __init__(
        self,
        engine: EngineBase,
        sampling: SamplingConfig | None = None,
        max_context_tokens: int = 4096,
        max_obs_tokens: int = 1024,
        max_calls: int = 16,
        model_name: str = "lit-rl-policy",
        before_generate: Callable[[], None] | None = None,
    ):
        if max_context_tokens < 2 or max_obs_tokens < 1 or max_calls < 1:
            raise ValueError(
                f"OpenAIServer: max_context_tokens >= 2, max_obs_tokens >= 1 and max_calls >= 1; got "
                f"{max_context_tokens}, {max_obs_tokens}, {max_calls}"
            )
        self.engine, self.sampling = engine, sampling or SamplingConfig()
        self.max_context_tokens, self.max_obs_tokens, self.max_calls = (
            max_context_tokens,
            max_obs_tokens,
            max_calls,
        )
        self.model_name = model_name
        self.episodes: dict[str, EpisodeRecord] = {}
        self._lock = threading.Condition()
        self._pending = 0  # requests queued or generating (close_episodes waits for 0)
        self._closed: set[str] = set()  # ids of closed episodes: a late call gets 410, not 404
        self._renderers: dict[str, ChatRenderer] = {}
        self._batcher = _Batcher(engine, before_generate)
        self._http = _HTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="lit_rl-openai-http", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._batcher.close()

    # ------------------------------------------------------------------ episodes
    def open_episode(self, episode_id: str | None = None) -> str:
        """Start recording an episode; returns its ``base_url`` for the ``openai`` client."""
        eid = episode_id or uuid.uuid4().hex
        if not _PATH.match(f"/episodes/{eid}/v1/models"):
            raise ValueError(f"episode id {eid!r}: letters, digits, '_', '.', '-' only")
        with self._lock:
            if eid in self.episodes:
                raise ValueError(f"episode {eid!r} is already open")
            self.episodes[eid] = EpisodeRecord(eid)
        return f"{self.url}/episodes/{eid}/v1"

    def close_episodes(self, episode_ids: list[str], timeout: float | None = None) -> list[EpisodeRecord]:
        """Refuse further calls of these episodes, wait until no request is queued or generating (a generation
        started before the close finishes and is recorded), and hand their records over (forgotten here)."""
        with self._lock:
            for eid in episode_ids:
                self.episodes[eid].closed = True
            self._lock.wait_for(lambda: self._pending == 0, timeout=timeout)
            self._closed.update(episode_ids)
            return [self.episodes.pop(eid) for eid in episode_ids]

    # ------------------------------------------------------------------ one request
    def chat(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for a request ``body`` of an episode (what the HTTP handler answers)."""
        if not isinstance(body, dict):
            raise RequestError(400, "invalid_request", "the request body must be a JSON object")
        if body.get("stream"):
            raise RequestError(400, "unsupported", "stream: true is not supported; request without streaming")
        if body.get("n", 1) != 1:
            raise RequestError(400, "unsupported", f"n={body.get('n')!r}: only n=1 is supported")
        messages = normalise(body.get("messages"))
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, dict) and "function" in t for t in tools):
            raise RequestError(
                400, "invalid_tools", "tools must be a list of {'type': 'function', 'function': {...}}"
            )
        tools_key = json.dumps(tools, sort_keys=True)
        sp = self._sampling(body)
        with self._lock:
            rec = self._open(episode_id)
            prompt_ids, extended = self._prompt_ids(rec, messages, tools, tools_key)
            if len(prompt_ids) + sp.max_new_tokens > self.max_context_tokens:
                rec.refused["context_length_exceeded"] = rec.refused.get("context_length_exceeded", 0) + 1
                raise RequestError(
                    400,
                    "context_length_exceeded",
                    f"the prompt has {len(prompt_ids)} tokens; with max_tokens {sp.max_new_tokens} that is over "
                    f"max_context_tokens={self.max_context_tokens}",
                )
            self._pending += 1
        try:
            comp = self._batcher.submit(prompt_ids, sp).result()
            text = self.engine.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
            message, calls_reason = reply_message(text)
            call = Call(
                list(prompt_ids),
                list(comp.token_ids),
                [float(x) for x in comp.logprobs],
                comp.finish_reason,
                text,
                messages,
                normalise([message])[0],
                tools_key,
                extended,
                comp.policy_version,
            )
            with self._lock:  # recorded before the pending count drops: close_episodes then sees it
                rec.calls.append(call)
        finally:
            with self._lock:
                self._pending -= 1
                self._lock.notify_all()
        finish = "length" if comp.finish_reason == "length" else calls_reason or "stop"
        tok = self.engine.tokenizer
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(call.completion_ids, call.logprobs)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(call.completion_ids),
                "total_tokens": len(prompt_ids) + len(call.completion_ids),
            },
        }

    def _open(self, episode_id: str) -> EpisodeRecord:
        rec = self.episodes.get(episode_id)
        if rec is None and episode_id in self._closed:
            raise RequestError(410, "episode_closed", f"episode {episode_id!r} is closed (past its deadline)")
        if rec is None:
            raise RequestError(
                404, "unknown_episode", f"no open episode {episode_id!r} (open_episode gives the URL)"
            )
        if rec.closed:
            raise RequestError(410, "episode_closed", f"episode {episode_id!r} is closed (past its deadline)")
        if len(rec.calls) + sum(rec.refused.values()) >= self.max_calls:
            rec.refused["max_calls"] = rec.refused.get("max_calls", 0) + 1
            raise RequestError(
                409, "max_calls", f"episode {episode_id!r} used its max_calls={self.max_calls}"
            )
        return rec

    def _sampling(self, body: dict[str, Any]) -> SamplingConfig:
        sp = self.sampling
        for key in ("max_completion_tokens", "max_tokens"):
            v = body.get(key)
            if v is not None:
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise RequestError(400, "invalid_request", f"{key}={v!r}: a positive integer")
                sp = replace(sp, max_new_tokens=min(sp.max_new_tokens, v))
        return sp

    def _renderer(self, tools: list[dict[str, Any]], key: str) -> ChatRenderer:
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.engine.tokenizer, tools, self.max_obs_tokens)
        return self._renderers[key]

    def _prompt_ids(
        self, rec: EpisodeRecord, messages: list[dict[str, Any]], tools: list, tools_key: str
    ) -> tuple[list[int], bool]:
        """(the engine's input, whether it continues an earlier call's ids): module doc."""
        renderer = self._renderer(tools, tools_key)
        for c in reversed(rec.calls):
            n = len(c.messages)
            new = messages[n + 1 :]
            if (
                c.tools_key == tools_key
                and messages[:n] == c.messages
                and len(messages) > n + 1
                and messages[n] == c.reply
                and all(m["role"] != "assistant" for m in new)
            ):
                return c.prompt_ids + c.completion_ids + renderer.observation_ids(c.completion_ids, new), True
        return renderer.prompt_ids(messages), False


class _HTTPServer(ThreadingHTTPServer):
    # A batch opens all its episodes at once: with the default listen backlog (5) a loaded machine dropped one of
    # 32 simultaneous first connections (the agent's APIConnectionError, in a SmolLM2 run at load 32).
    request_queue_size = 1024
    daemon_threads = True


def _handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would flood a training run's output

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: RequestError) -> None:
            kind = "invalid_request_error" if e.status == 400 else "lit_rl_error"
            self._send(e.status, {"error": {"message": str(e), "type": kind, "code": e.code, "param": None}})

        def do_GET(self) -> None:
            m = _PATH.match(self.path)
            if not m or m.group(2) != "models":
                return self._error(RequestError(404, "not_found", f"no route GET {self.path}"))
            model = {"id": server.model_name, "object": "model", "created": 0, "owned_by": "lit_rl"}
            self._send(200, {"object": "list", "data": [model]})

        def do_POST(self) -> None:
            m = _PATH.match(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not m or m.group(2) != "chat/completions":
                return self._error(
                    RequestError(
                        404, "not_found", f"no route POST {self.path}: /episodes/<id>/v1/chat/completions"
                    )
                )
            try:
                body = json.loads(raw or b"null")
                self._send(200, server.chat(m.group(1), body))
            except json.JSONDecodeError as e:
                self._error(RequestError(400, "invalid_json", f"the body is not JSON: {e}"))
            except RequestError as e:
                self._error(e)
            except Exception as e:  # noqa: BLE001 - the engine failed: the agent gets a 500, the server lives
                self._error(RequestError(500, "engine_error", f"{type(e).__name__}: {e}"))

    return Handler
