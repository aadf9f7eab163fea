"""A server whose weights change during a generate round (issue 53 item 1): synced by another client, or
restarted, between two of our requests, or under two requests in flight.

The server is a real stdlib HTTP server on 127.0.0.1 that speaks the routes ``VLLMServerEngine`` uses (models,
server info, reload, prefix-cache reset, weight version, completions) and stands in for vLLM's generation:
each completion token is ``OURS`` when the server holds the weights of our last sync (the file the engine
wrote, reloaded through ``/collective_rpc``) and ``OTHER`` otherwise, so every row says which weights made it.
A real vLLM server cannot be told to switch weights between two requests of one round on cue: this is the
timing under test, not a stand-in for vLLM's numbers (``test_server_restart.py`` restarts a real one between
rounds).

Before the fix the weight version was checked only before a round: rows made with other weights came back
labelled with the current policy version and ``rollout/server_resyncs`` stayed 0.
"""

from __future__ import annotations

import json
import re
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.rollout.engine import SamplingConfig

OURS, OTHER = 7, 9  # the token a completion is made of: our last sync's weights, or any other weights
WAIT_S = 60.0  # the stand-in's own bound on an event (a broken engine fails the test, never hangs it)


class StandIn:
    """The server; ``mode`` says what happens to its weights.

    * ``other_client``: another client syncs it (other weights, version ``someone-else``) just before it
      generates its 3rd completion;
    * ``restart``: it restarts there (its checkpoint's weights, vLLM's initial version ``default``);
    * ``overlap``: two completions arrive together; the 2nd to arrive switches the weights to another client's
      (and answers with them), the 1st is answered only once our weights and version are back (the engine's
      resync), with the other weights' tokens it generated meanwhile: its server reports our version by then;
    * ``flapping``: another client syncs it before every completion.
    """

    def __init__(self, model_dir: str, mode: str):
        self.mode, self.model_dir = mode, model_dir
        self.weights, self.version = "base", "default"
        self.completions = 0
        self.lock = threading.Lock()
        self.arrived = [threading.Event(), threading.Event()]
        self.resynced = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(outer.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                self._send(outer.post(self.path, body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.resynced.set()
        for e in self.arrived:
            e.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _switch(self, weights: str, version: str) -> None:
        with self.lock:
            self.weights, self.version = weights, version

    def get(self, path: str) -> dict:
        if path.startswith("/v1/models"):
            return {"data": [{"id": self.model_dir, "max_model_len": 64}]}
        if path.startswith("/server_info"):
            return {
                "vllm_config": {
                    "model_config": {"logprobs_mode": "processed_logprobs", "model": self.model_dir},
                    "scheduler_config": {"max_num_seqs": 8},
                    "lora_config": None,
                }
            }
        if path.startswith("/weight_info"):
            return {"weight_version": self.version}
        raise AssertionError(f"unexpected GET {path}")

    def post(self, path: str, body) -> dict:
        if path == "/collective_rpc":
            assert body["method"] == "reload_weights" and body["kwargs"]["weights_path"]
            self._switch("ours", self.version)
            return {}
        if path.startswith("/reset_prefix_cache"):
            return {"success": True}
        if path == "/update_weight_version":
            self._switch(self.weights, body["new_version"])
            if self.weights == "ours" and self.completions >= 2:
                self.resynced.set()
            return {}
        if path == "/v1/completions":
            return self.complete(body)
        raise AssertionError(f"unexpected POST {path}")

    def complete(self, body: dict) -> dict:
        with self.lock:
            self.completions += 1
            k = self.completions
        if self.mode == "flapping" or (k == 3 and self.mode == "other_client"):
            self._switch("other", "someone-else")
        elif k == 3 and self.mode == "restart":
            self._switch("base", "default")
        elif self.mode == "overlap" and k <= 2:
            self.arrived[k - 1].set()
            if not self.arrived[2 - k].wait(WAIT_S):
                raise AssertionError("the two completions were not in flight together")
            if k == 2:  # another client syncs while both are generating
                self._switch("other", "someone-else")
            elif not self.resynced.wait(WAIT_S):  # the 1st: its rows were made with the other weights
                raise AssertionError("the engine never gave the server our weights back")
            return _answer(OTHER, body["n"])
        return _answer(OURS if self.weights == "ours" else OTHER, body["n"])


def _answer(token: int, n: int) -> dict:
    choice = {"token_ids": [token] * 3, "logprobs": {"token_logprobs": [-0.5] * 3}, "finish_reason": "length"}
    return {"choices": [{"index": i, **choice} for i in range(n)]}


@pytest.fixture
def module(tiny_model_dir):
    path = str(tiny_model_dir)
    return types.SimpleNamespace(model=load_causal_lm(path), tokenizer=load_tokenizer(path), model_path=path)


def _engine(server: StandIn, module, concurrency: int):
    from lit_rl.rollout.server import VLLMServerEngine

    engine = VLLMServerEngine(
        urls=[server.url], request_timeout_s=WAIT_S, sync_timeout_s=WAIT_S, max_concurrency=concurrency
    )
    engine.bind(module)
    return engine


SP = SamplingConfig(temperature=1.0, max_new_tokens=3)


@pytest.mark.parametrize(
    "mode,prompts,concurrency,stale",
    [("other_client", 4, 1, 1), ("restart", 4, 1, 1), ("overlap", 2, 2, 2)],
)
def test_rows_made_with_other_weights_are_regenerated_never_mislabelled(
    module, mode, prompts, concurrency, stale
):
    server = StandIn(module.model_path, mode)
    engine = _engine(server, module, concurrency)
    try:
        engine.update_weights(engine.sync_items(module.model))  # sync 1: the server holds our weights
        out = engine.generate([[5 + i, 6] for i in range(prompts)], 2, SP)
        tokens = [c.token_ids for g in out for c in g]
        m = engine.metrics()
        print(
            f"{mode}: rows {sum(t == [OTHER] * 3 for t in tokens)}/{len(tokens)} from other weights, "
            f"server_resyncs={m['rollout/server_resyncs']}, stale_answers={m.get('rollout/stale_answers')}"
        )
        assert tokens == [[OURS] * 3] * (2 * prompts), "rows of other weights labelled as ours"
        assert all(c.policy_version == engine.policy_version == 1 for g in out for c in g)
        # one resync of the server; the answers made with other weights were thrown away and asked again
        assert (m["rollout/server_resyncs"], m["rollout/stale_answers"]) == (1.0, float(stale)), m
        assert (server.completions, server.weights) == (prompts + stale, "ours")
        # a resync's version is sync 1's with a fresh token: requests in flight across it see it move
        assert re.fullmatch(r"1\+[0-9a-f]{8}", server.version), server.version
        assert m["rollout/servers_alive"] == 1.0 and m["rollout/server_errors"] == 0.0
    finally:
        engine.close()
        server.close()


def test_a_server_whose_weights_keep_changing_is_dropped_not_retried_forever(module):
    server = StandIn(module.model_path, "flapping")
    engine = _engine(server, module, 1)
    try:
        engine.update_weights(engine.sync_items(module.model))
        with pytest.raises(RuntimeError, match=r"no rollout server is reachable .*weights changed under"):
            engine.generate([[5, 6]], 2, SP)
        m = engine.metrics()
        assert (m["rollout/stale_answers"], m["rollout/servers_alive"]) == (3.0, 0.0), m
        assert server.completions == 3
    finally:
        engine.close()
        server.close()


@pytest.mark.parametrize(
    "got,ours",
    [
        ("3", True),
        ("3+0a1b2c3d", True),
        ("33", False),
        ("2+0a1b2c3d", False),
        ("default", False),
        (None, False),
    ],
)
def test_which_versions_are_the_syncs_own(got, ours):
    """Sync 3's weights report "3" (the sync) or "3+<token>" (a resync of it); anything else is other weights."""
    from lit_rl.rollout._server_http import _ours

    assert _ours(got, "3") is ours and _ours(got, "3+ffffffff") is ours
