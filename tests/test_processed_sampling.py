"""HFEngine samples with top-p / top-k / min-p / repetition penalty and reports the log-probs of the processed
distribution it sampled from (``lit_rl.rollout.sampling``), stop strings end a completion, and the
``generation_kwargs`` / ``chat_template_kwargs`` settings reach (or are refused before) the engine.

The expectations are computed here in float64 from a teacher-forced forward, with the processing written out
independently of ``process_logits`` (top-p as "keep a token while the mass of the more likely ones is below
p", ties highest id first, not the engines' ascending cumulative sum).
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.learners import PolicyModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rollout.engine import HFEngine, SamplingConfig

PROMPT = "the cat sat on the mat; the cat sat"
# At T = 1 the sharpened model (fixture) has 10-30 tokens above 1% at most positions: every rule keeps a
# set whose edge tokens carry mass, so a boundary off by one token moves the log-probs well past the tolerance.
SETTINGS = {
    "top_p": {"temperature": 1.0, "top_p": 0.6},
    "top_k": {"temperature": 1.0, "top_k": 4},
    "min_p": {"temperature": 1.0, "min_p": 0.1},
    "repetition_penalty": {"temperature": 0.8, "repetition_penalty": 1.8},
    "all": {"temperature": 0.9, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3},
}


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    d = build_tiny_model(
        tmp_path_factory.mktemp("proc") / "m", layers=2, hidden=64, heads=2, tokenizer="char", seed=0
    )
    module = PolicyModule(model=str(d))
    with torch.no_grad():  # a random model is nearly uniform; a sharper one makes truncation bite
        module.model.model.norm.weight.mul_(4.0)
    engine = HFEngine()
    engine.bind(module)
    return module, engine


def _ids(module, text=PROMPT):
    return module.tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def _logits(module, ids):
    return module.model(input_ids=torch.tensor([ids])).logits[0].double()  # (L, V)


def _reference_logprobs(logits: torch.Tensor, seen: set[int], sp: SamplingConfig) -> torch.Tensor:
    """float64 log-probs of the processed distribution at one position, written out step by step."""
    x = logits.clone()
    for t in seen:  # repetition penalty on raw logits
        x[t] = x[t] / sp.repetition_penalty if x[t] > 0 else x[t] * sp.repetition_penalty
    if sp.temperature == 0:
        return torch.log_softmax(x, -1)
    x = x / sp.temperature
    keep = torch.ones_like(x, dtype=torch.bool)
    if sp.min_p > 0:
        p = torch.softmax(x, -1)
        keep &= p >= sp.min_p * p.max()
    x = torch.where(keep, x, -math.inf)
    if sp.top_k > 0:
        kth = sorted(x.tolist(), reverse=True)[sp.top_k - 1]
        keep &= x >= kth
    x = torch.where(keep, x, -math.inf)
    if sp.top_p < 1:
        p = torch.softmax(x, -1).tolist()
        above = 0.0
        for t in sorted(range(len(p)), key=lambda t: (-p[t], -t)):
            if above >= sp.top_p:
                keep[t] = False
            above += p[t]
    return torch.log_softmax(torch.where(keep, x, -math.inf), -1)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_logprobs_are_the_processed_distributions(bound, name):
    module, engine = bound
    sp = SamplingConfig(max_new_tokens=6, **SETTINGS[name])
    ids = _ids(module)
    torch.manual_seed(0)
    comps = engine.generate([ids], 8, sp)[0]
    truncated = 0
    for c in comps:
        logits = _logits(module, ids + c.token_ids)
        for t, tok in enumerate(c.token_ids):
            ref = _reference_logprobs(logits[len(ids) - 1 + t], set(ids) | set(c.token_ids[:t]), sp)
            assert math.isfinite(ref[tok]), (name, t, tok)  # sampled only from the kept tokens
            assert c.logprobs[t] == pytest.approx(float(ref[tok]), abs=5e-5), (name, t)
            plain = torch.log_softmax(logits[len(ids) - 1 + t] / sp.temperature, -1)[tok]
            truncated += abs(float(plain) - c.logprobs[t]) > 1e-3
    assert truncated > 0  # the setting changed the distribution (a no-op setting would pass the above)


def test_greedy_with_repetition_penalty_is_the_penalised_argmax(bound):
    module, engine = bound
    sp = SamplingConfig(temperature=0.0, repetition_penalty=1.8, max_new_tokens=6)
    ids = _ids(module)
    c = engine.generate([ids], 2, sp)[0][0]
    logits = _logits(module, ids + c.token_ids)
    for t, tok in enumerate(c.token_ids):
        ref = _reference_logprobs(logits[len(ids) - 1 + t], set(ids) | set(c.token_ids[:t]), sp)
        assert tok == int(ref.argmax())
        assert c.logprobs[t] == pytest.approx(float(ref[tok]), abs=5e-5)


def test_sampling_frequencies_follow_the_processed_distribution(bound):
    module, engine = bound
    sp = SamplingConfig(
        max_new_tokens=1, temperature=1.0, top_p=0.8, top_k=8, min_p=0.05, repetition_penalty=1.3
    )
    ids = _ids(module)
    p = _reference_logprobs(_logits(module, ids)[-1], set(ids), sp).exp()  # (V,)
    torch.manual_seed(1)
    n = 3000
    toks = torch.tensor([c.token_ids[0] for c in engine.generate([ids], n, sp)[0]])
    freq = torch.bincount(toks, minlength=p.numel()).double() / n
    assert float(freq[p == 0].sum()) == 0.0  # nothing outside the kept set
    kept = (p > 0).nonzero()[:, 0]
    assert 2 <= len(kept) <= 8
    for t in kept.tolist():
        sigma = math.sqrt(float(p[t]) * (1 - float(p[t])) / n)
        assert abs(float(freq[t] - p[t])) < 4.5 * sigma, (t, float(freq[t]), float(p[t]))


def test_stop_string_ends_the_completion_at_its_token(bound):
    module, engine = bound
    ids = _ids(module)
    free = engine.generate([ids], 1, SamplingConfig(temperature=0.0, max_new_tokens=12))[0][0]
    text = module.tokenizer.decode(free.token_ids)
    stop = text[3:5]  # char tokenizer: the stop string is completed by token 4 (or earlier, if it repeats)
    first = text.index(stop) + len(stop) - 1
    for seed in (None, 5):  # batched and per-prompt (seeded) generation
        c = engine.generate(
            [ids], 2, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[stop], seed=seed)
        )[0][0]
        assert c.finish_reason == "stop"
        assert c.token_ids == free.token_ids[: first + 1]
        assert c.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-6)
        assert module.tokenizer.decode(c.token_ids).endswith(stop)


def test_generation_kwargs_are_checked_and_passed_through(bound):
    module, engine = bound
    for kw, words in (
        ({"top_p": 0.9}, "use sampling.top_p"),
        ({"max_tokens": 3}, "sampling.max_new_tokens"),
        ({"logit_bias": {1: 5.0}}, "changes the sampled distribution"),
        ({"no_repeat_ngram_size": 2}, "changes the sampled distribution"),
        ({"logprobs": 5}, "set by the engine"),
    ):
        with pytest.raises(ValueError, match=f"generation_kwargs.{next(iter(kw))}.*{words}"):
            SamplingConfig(generation_kwargs=kw)
    with pytest.raises(ValueError, match=r"generation_kwargs \['stop_token_ids'\]: HFEngine"):
        engine.generate([_ids(module)], 1, SamplingConfig(generation_kwargs={"stop_token_ids": [1]}))
    sp = SamplingConfig(temperature=0.0, max_new_tokens=4)
    plain = engine.generate([_ids(module)], 1, sp)[0][0]
    via = engine.generate(
        [_ids(module)],
        1,
        SamplingConfig(temperature=0.0, max_new_tokens=4, generation_kwargs={"use_cache": False}),
    )[0][0]
    assert via.token_ids == plain.token_ids


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("min_p", -0.1, r"min_p must be in \[0, 1\]"),
        ("repetition_penalty", 0.0, "repetition_penalty must be a finite number > 0"),
        ("repetition_penalty", float("nan"), "repetition_penalty must be a finite number > 0"),
        ("stop", [""], "stop must be a list of non-empty strings"),
        ("chat_template_kwargs", ["enable_thinking"], "chat_template_kwargs must be a mapping"),
    ],
)
def test_bad_values_name_the_field(field, value, words):
    with pytest.raises(ValueError, match=f"sampling.{words}"):
        SamplingConfig(**{field: value})


def test_chat_template_kwargs_reach_the_template(bound):
    from lit_rl.data.prompts import Prompt
    from lit_rl.rollout.render import PromptRenderer

    module, _ = bound
    tok = module.tokenizer
    saved = tok.chat_template
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}#{% endif %}"
    )
    try:
        p = Prompt(messages=[{"role": "user", "content": "hi"}], uid="u")
        _, plain = PromptRenderer(512, "truncate")(tok, [p])
        _, off = PromptRenderer(512, "truncate", chat_template_kwargs={"enable_thinking": False})(tok, [p])
    finally:
        tok.chat_template = saved
    assert tok.decode(plain[0]) == "hi" and tok.decode(off[0]) == "hi#"
