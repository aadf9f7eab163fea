"""Every engine on the real checkpoint (SmolLM2-135M-Instruct: BPE tokenizer, ChatML template, eos
``<|im_end|>`` = 2, pad ``<|endoftext|>`` = 0, tied embeddings), through the renderer and the trainer's own
log-prob path (``PolicyModule.completion_logprobs`` on the padded Experience the ExperienceBuilder makes).

Checked:

- the engine's sampled-token log-probs agree with the trainer's recomputation: the k3 mismatch KL (the
  ``rollout/logprob_mismatch_kl`` metric) is printed and bounded;
- generation stops at ``<|im_end|>`` (kept as the last token, finish reason ``stop``);
- pad (0) is never treated as eos: rows end at eos or the budget, padded rows' masks cover exactly their tokens;
- a prompt with multi-byte characters round-trips through render -> generate -> decode.

Run with ``-s`` to see the measured KL per engine. One engine at a time (each started once here).
"""

from __future__ import annotations

import pytest
import torch

from lit_rl.core.importance import k3_mismatch_kl
from lit_rl.data.prompts import Prompt
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.build import ExperienceBuilder
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.generate import decode_with
from lit_rl.rollout.render import PromptRenderer, engine_context_len
from lit_rl.rollout.rollouts import Rollouts
from tests._binding import bind_sampling

pytestmark = [pytest.mark.real_ckpt, pytest.mark.slow]
FRENCH = "Combien font 12 + 7 ? Répondez en chiffres 🙂"
TEXTS = ["What is the capital of France?", FRENCH, "Say OK."]  # the first: greedy "...Paris.<|im_end|>"
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=24, seed=0)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
G = 3
EOS, PAD = 2, 0
KL_BOUND = 1e-3  # fp32 engines against the fp32 trainer; measured values are printed


@pytest.fixture(scope="module")
def policy(smollm2_dir):
    from lit_rl.learners import PolicyModule

    p = PolicyModule(model=smollm2_dir)
    bind_sampling(p, SAMPLING)
    assert (p.tokenizer.eos_token_id, p.tokenizer.pad_token_id) == (EOS, PAD)
    return p


def _check(engine, policy, name: str) -> float:
    tok = policy.tokenizer
    prompts = [Prompt(uid=str(i), messages=[{"role": "user", "content": t}]) for i, t in enumerate(TEXTS)]
    render = PromptRenderer(
        512, "error", context_len=lambda: engine_context_len(engine), max_new_tokens=SAMPLING.max_new_tokens
    )
    kept, ids = render(tok, prompts)
    assert FRENCH in tok.decode(ids[1])  # multi-byte characters survive the chat template and the tokenizer
    greedy = engine.generate(ids[:1], 1, GREEDY)[0][0]
    assert greedy.finish_reason == "stop" and greedy.token_ids[-1] == EOS, greedy  # stops at <|im_end|>
    assert EOS not in greedy.token_ids[:-1]
    groups = engine.generate(ids, G, SAMPLING)
    rows = [c for g in groups for c in g]
    for c in rows:
        assert c.finish_reason in ("stop", "length") and len(c.token_ids) == len(c.logprobs) >= 1
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == EOS), c  # pad id 0 ends nothing
        assert EOS not in c.token_ids[:-1]
        assert isinstance(tok.decode(c.token_ids, skip_special_tokens=True), str)
    assert any(c.finish_reason == "stop" for c in rows)
    B = len(rows)
    rb = RewardBatch(
        total=torch.zeros(B, dtype=torch.float64),
        valid=torch.ones(B, dtype=torch.bool),
        components={},
        errors=[None] * B,
    )
    exp = ExperienceBuilder(engine, decode_with(engine), SAMPLING.max_new_tokens)(
        Rollouts(kept, ids, groups, rb), tok.pad_token_id
    )
    assert exp.loss_mask.sum(1).tolist() == [
        len(c.token_ids) for c in rows
    ]  # padding (id 0) is never a token
    assert (
        len({len(c.token_ids) for c in rows}) > 1 or len({len(p) for p in ids}) > 1
    )  # rows really are padded
    with torch.no_grad():
        lp = policy.completion_logprobs(exp)  # (B, C): the trainer's recomputation on the padded batch
    m = exp.loss_mask
    kl = k3_mismatch_kl(lp.double(), exp.rollout_logprobs.double(), m)
    worst = float((lp.double() - exp.rollout_logprobs.double())[m].abs().max())
    print(
        f"\n[{name}] SmolLM2 mismatch KL (k3) = {kl:.3g}, max |dlogp| = {worst:.3g} over {int(m.sum())} tokens"
    )
    assert kl < KL_BOUND, (name, kl, worst)
    return kl


def test_hf_engine(policy):
    engine = HFEngine(share_weights=False)  # the async default: a private copy of the weights
    engine.bind(policy)
    _check(engine, policy, "HFEngine")


@pytest.mark.vllm
def test_vllm_engine(policy):
    from lit_rl.rollout.vllm import VLLMEngine

    engine = VLLMEngine(max_model_len=512, kv_cache_memory_bytes=256 << 20)
    try:
        engine.bind(policy)
        _check(engine, policy, "VLLMEngine")
    finally:
        engine.close()


@pytest.mark.vllm
def test_vllm_server_engine(policy):
    from lit_rl.rollout.server import VLLMServerEngine

    engine = VLLMServerEngine(
        launch={
            "num_servers": 1,
            "max_model_len": 512,
            "max_num_seqs": 8,
            "kv_cache_gb": 1,
            "timeout_s": 600,
        },
        request_timeout_s=120,
        sync_timeout_s=300,
    )
    try:
        engine.bind(policy)
        _check(engine, policy, "VLLMServerEngine")
    finally:
        engine.close()
