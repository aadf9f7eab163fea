"""HFEngine samples from exactly the distribution its log-probs describe, whatever the checkpoint's
``generation_config.json`` says (here: repetition_penalty=2.0, top_k=5, top_p=0.5, min_p=0.5, temperature=0.2, as
hub checkpoints ship such defaults).

- reported log-probs == a teacher-forced forward's log_softmax(logits / T) at the sampled tokens;
- over many samples of one position, the frequencies follow the untruncated softmax(logits / T): tokens outside
  the top 5 are sampled with their full mass, tokens of the prompt are not penalised;
- top-k from the run's own SamplingConfig (not the checkpoint's) gives the truncated log-probs
  (``tests/test_processed_sampling.py`` covers every setting).
"""

import math

import pytest
import torch
from transformers import GenerationConfig

from lit_rl.learners import PolicyModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rollout.engine import HFEngine, SamplingConfig

PROMPT = "abcdefghijklmnopqrstuvwxyz0123456789"  # 36 distinct tokens the repetition penalty would push down
T = 0.5


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    d = build_tiny_model(
        tmp_path_factory.mktemp("gencfg") / "m", layers=2, hidden=64, heads=2, tokenizer="char", seed=0
    )
    GenerationConfig(
        repetition_penalty=2.0,
        top_k=5,
        top_p=0.5,
        min_p=0.5,
        temperature=0.2,
        do_sample=True,
        eos_token_id=1,
        pad_token_id=0,
    ).save_pretrained(d)
    module = PolicyModule(model=str(d))
    assert module.model.generation_config.repetition_penalty == 2.0  # the checkpoint's defaults were loaded
    assert module.model.generation_config.top_k == 5
    engine = HFEngine()
    engine.bind(module)
    return module, engine


def _next_token_logits(module, ids):
    with torch.no_grad():
        return module.model(input_ids=torch.tensor([ids])).logits[0].double()  # (L, V)


def test_reported_logprobs_are_the_teacher_forced_ones(bound):
    module, engine = bound
    ids = module.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    comps = engine.generate([ids], 8, SamplingConfig(temperature=T, max_new_tokens=6))[0]
    assert len(comps) == 8
    for c in comps:
        logits = _next_token_logits(module, ids + c.token_ids)  # position P+t-1 predicts completion token t
        lp = torch.log_softmax(logits / T, -1)[len(ids) - 1 : -1].gather(
            -1, torch.tensor(c.token_ids)[:, None]
        )[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), lp, rtol=0, atol=2e-5)
    assert (
        module.model.generation_config.repetition_penalty == 2.0
    )  # the model's own config is left as it was


def test_sampling_frequencies_follow_the_untruncated_distribution(bound):
    module, engine = bound
    ids = module.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    p = torch.softmax(
        _next_token_logits(module, ids)[-1] / T, -1
    )  # (V,) the distribution the log-probs describe
    torch.manual_seed(1)
    N = 4000
    toks = torch.tensor(
        [
            c.token_ids[0]
            for c in engine.generate([ids], N, SamplingConfig(temperature=T, max_new_tokens=1))[0]
        ]
    )
    outside_top5 = torch.ones_like(p, dtype=torch.bool)
    outside_top5[p.topk(5).indices] = False
    in_prompt = torch.zeros_like(p, dtype=torch.bool)
    in_prompt[ids] = True
    for name, region in (("outside the top 5", outside_top5), ("prompt tokens", in_prompt)):
        mass = float(p[region].sum())
        freq = float(region[toks].double().mean())
        sigma = math.sqrt(mass * (1 - mass) / N)
        assert abs(freq - mass) < 4 * sigma, (name, freq, mass, sigma)
    assert float(outside_top5[toks].double().mean()) > 0.5  # top_k=5 from the checkpoint would make this 0


def test_top_k_of_the_sampling_config_reports_the_truncated_logprobs(bound):
    module, engine = bound
    ids = module.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    torch.manual_seed(2)
    comps = engine.generate([ids], 200, SamplingConfig(temperature=T, top_k=5, max_new_tokens=1))[0]
    logits = _next_token_logits(module, ids)[-1] / T
    top = logits.topk(5).indices
    trunc = torch.full_like(logits, -math.inf)
    trunc[top] = logits[top]
    want = torch.log_softmax(trunc, -1)  # the top-5 renormalised distribution actually sampled from
    for c in comps:
        assert c.token_ids[0] in top.tolist()
        assert c.logprobs[0] == pytest.approx(float(want[c.token_ids[0]]), abs=2e-5)


def test_private_copy_of_a_lora_policy_takes_merged_weights(tmp_path):
    """HFEngine(share_weights=False) (the async default) with a LoRA policy: its first update_weights gets
    merged checkpoint names (``merged_state_items``) and must load them, not fail on the PEFT-prefixed copy."""
    from lit_rl.models.loading import merged_state_items

    d = build_tiny_model(tmp_path / "m", layers=2, hidden=64, heads=2, tokenizer="char", seed=0)
    module = PolicyModule(model=str(d), lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    engine = HFEngine(share_weights=False)
    engine.bind(module)
    with torch.no_grad():  # a trained adapter: B != 0, so merged weights differ from the base weights
        for n, p in module.model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    merged = dict(merged_state_items(module.model))
    engine.update_weights(merged.items())
    assert engine.policy_version == 1
    got = engine.model.state_dict()
    assert set(got) == set(merged)
    for n, t in merged.items():
        assert torch.equal(got[n], t), n
    ids = module.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    with torch.no_grad():  # the engine's greedy tokens are the merged policy's argmax path
        want = module.model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=4,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    c = engine.generate([ids], 1, greedy)[0][0]
    assert c.token_ids == want[: len(c.token_ids)] and (c.finish_reason == "stop" or len(c.token_ids) == 4)
    with pytest.raises(ValueError, match="unknown"):
        engine.update_weights([("not.a.weight", torch.zeros(1))])


def _seeded(engine, prompts, seed=5, n=4):
    groups = engine.generate(prompts, n, SamplingConfig(temperature=1.0, max_new_tokens=6, seed=seed))
    return [[c.token_ids for c in g] for g in groups]


def test_seeded_duplicate_prompts_get_their_own_samples_and_reruns_replay(bound):
    """``sampling.seed``: the same prompt twice in one batch is two independent groups (the seed folds in the
    row's occurrence), and an engine at the same call count replays every group exactly. Before, both
    occurrences were seeded by (seed, call, tokens) alone, so the second group copied the first."""
    module, _ = bound
    ids = module.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    runs = []
    for prompts in ([ids, ids], [ids, ids], [ids]):  # fresh engines: same seed, rank and call
        engine = HFEngine()
        engine.bind(module)
        torch.manual_seed(len(runs))  # the global stream must not matter to seeded sampling
        runs.append(_seeded(engine, prompts))
    a, b = runs[0]
    assert a != b, "the duplicate prompt's group copied the first occurrence's samples"
    assert len({tuple(t) for t in a + b}) > 4  # 8 samples of 6 tokens at T = 1: not one repeated draw
    assert runs[1] == runs[0]  # reproducible
    assert runs[2] == [a]  # the first occurrence does not depend on what else is in the batch
