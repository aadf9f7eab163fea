"""Shared-prompt forward (models/shared_prompt.py): same log-probs and gradients as the plain forward, in
float64, while each distinct prompt runs once."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from lit_rl.core.logprobs import token_logprobs
from lit_rl.data.experience import Experience, pad_prompts_completions
from lit_rl.learners import PolicyModule
from lit_rl.learners.heads import lm_head_projection
from lit_rl.models.shared_prompt import distinct_prompts, shared_prompt_logits
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling
from tests._float64 import rmsnorm_in_input_dtype as _rmsnorm_in_input_dtype


@contextmanager
def embedding_inputs(model):
    """The (rows, tokens) shape of every forward ``model`` runs inside the block, in order."""
    seen: list[tuple[int, ...]] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        yield seen
    finally:
        hook.remove()


def _experience(prompts, completions) -> Experience:
    ids, att, mask, P = pad_prompts_completions(0, prompts, completions)
    B = len(prompts)
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B),
        rewards=torch.zeros(B),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )


# Two prompts of different lengths (left padding differs), rows of a group not adjacent, one empty completion
# (all padding) and completions of different lengths.
PROMPTS = [[5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [9, 10]]
COMPLETIONS = [[11, 12, 13], [14], [15, 16, 17, 18, 1], [], [19, 20], [21, 22, 23, 24, 25]]


@pytest.fixture(scope="module")
def module64(tiny_model_dir):
    from transformers.models.qwen2 import modeling_qwen2

    mp = pytest.MonkeyPatch()
    mp.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rmsnorm_in_input_dtype)
    yield _build64(tiny_model_dir)
    mp.undo()


def _build64(tiny_model_dir):
    m = PolicyModule(model=str(tiny_model_dir))
    m.model.double()  # float64: the two paths must agree to summation-order rounding (~1e-15)
    m.update_settings(share_prompt_forward=True)  # auto (None) leaves float64 models on the plain forward
    bind_sampling(m, SamplingConfig(temperature=0.7))
    return m


def test_distinct_prompts_groups_by_tokens_and_padding():
    exp = _experience(
        PROMPTS + [[7, 8]], COMPLETIONS + [[3]]
    )  # [7, 8] = the tail of [5, 6, 7, 8], other padding
    first, inverse = distinct_prompts(exp.input_ids, exp.attention_mask, exp.prompt_len)
    assert sorted(first.tolist()) == [0, 1, 6]  # the first row holding each distinct prompt
    assert [first[i].item() for i in inverse] == [0, 1, 0, 1, 0, 1, 6]


def test_distinct_prompts_none_when_no_prompt_repeats():
    exp = _experience([[5, 6], [7, 8]], [[1], [2]])
    assert distinct_prompts(exp.input_ids, exp.attention_mask, exp.prompt_len) is None


def _plain_and_shared(module, exp, backward: bool):
    """Completion log-probs (and the gradient of a weighted sum of them) via the plain and the shared path."""
    out = []
    w = torch.linspace(-1.0, 2.0, exp.completion_len, dtype=torch.float64)
    for share in (False, True):
        module.update_settings(share_prompt_forward=share)
        module.model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(backward):
            lp = module.completion_logprobs(exp)  # (B, C)
            if backward:
                (lp * w * exp.loss_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
        out.append((lp.detach(), grads))
    module.update_settings(share_prompt_forward=True)
    return out


def test_auto_keeps_float64_models_on_the_plain_forward(tiny_model_dir):
    """share_prompt_forward=None: float32 shares the prompt pass, float64 (exact invariance checks) does not.

    padding_free false: these uneven rows would otherwise be packed, which shares the prompt its own way.
    """
    m = PolicyModule(model=str(tiny_model_dir), padding_free=False)
    lm_head_projection(m.model)  # the head's one-time numerical check (one small forward) is not counted here
    exp = _experience(PROMPTS, COMPLETIONS)
    for dtype, expect in (
        (torch.float32, [(2, exp.prompt_len), (6, exp.completion_len - 1)]),
        (torch.float64, [(6, exp.prompt_len + exp.completion_len)]),
    ):
        m.model.to(dtype)
        with embedding_inputs(m.model) as seen, torch.no_grad():
            m.completion_logprobs(exp)
        assert seen == expect, dtype


def _assert_same_grads(g0: dict, g1: dict) -> None:
    """The same parameters got gradients in both passes, equal to float64 round-off."""
    assert set(g0) == set(g1) and len(g0) > 0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-9, atol=1e-12, msg=n)


def test_shared_prompt_logprobs_and_gradients_match_plain_forward_float64(module64):
    exp = _experience(PROMPTS, COMPLETIONS)
    (lp0, g0), (lp1, g1) = _plain_and_shared(module64, exp, backward=True)
    mask = exp.loss_mask
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=1e-10, atol=1e-12)
    _assert_same_grads(g0, g1)


def test_shared_prompt_single_completion_column(module64):
    exp = _experience([[5, 6, 7], [5, 6, 7], [8, 9]], [[11], [12], [13]])  # C = 1: only the prompt pass
    (lp0, _), (lp1, _) = _plain_and_shared(module64, exp, backward=False)
    torch.testing.assert_close(lp1, lp0, rtol=1e-10, atol=1e-12)


def test_each_distinct_prompt_runs_once(module64):
    """The prompt pass sees U distinct prompts x P tokens, the completion pass B rows x (C-1) tokens."""
    exp = _experience(PROMPTS, COMPLETIONS)
    with embedding_inputs(module64.model) as seen, torch.no_grad():
        module64.completion_logprobs(exp)
    P, C = exp.prompt_len, exp.completion_len
    assert seen == [(2, P), (6, C - 1)]


def test_reference_and_training_paths_use_it(module64):
    """forward_logits (the reference and old-log-prob forwards) goes through the shared path; asking for hidden
    states (a critic on the shared backbone) keeps the plain forward: one (B, P+C) pass."""
    exp = _experience(PROMPTS, COMPLETIONS)
    with embedding_inputs(module64.model) as seen, torch.no_grad():
        logits = module64.forward_logits(exp)
        _, hidden = module64.forward_logits(exp, return_hidden=True)
    assert seen[:2] == [(2, exp.prompt_len), (6, exp.completion_len - 1)]
    assert seen[2:] == [(6, exp.prompt_len + exp.completion_len)]
    assert hidden.shape[:2] == logits.shape[:2]
    lp = token_logprobs(logits, exp.completion_ids, None, module64.temperature)
    assert torch.isfinite(lp[exp.loss_mask]).all()


def test_share_prompt_forward_off_is_the_plain_forward(module64):
    exp = _experience(PROMPTS, COMPLETIONS)
    module64.update_settings(share_prompt_forward=False)
    try:
        with embedding_inputs(module64.model) as seen, torch.no_grad():
            module64.completion_logprobs(exp)
    finally:
        module64.update_settings(share_prompt_forward=True)
    assert seen == [(6, exp.prompt_len + exp.completion_len)]


def test_shared_prompt_logits_declines_without_repeats(module64):
    exp = _experience([[5, 6], [7, 8]], [[1, 2], [3]])
    att = exp.attention_mask
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    assert shared_prompt_logits(module64.model, exp.input_ids, att, pos, exp.prompt_len) is None


# ------------------------------------------------------------------ HFEngine: one prefill per distinct prompt
def _engine_run(module, share: bool, sampling, prompts, n):
    from lit_rl.rollout import HFEngine

    eng = HFEngine(share_prefill=share)
    eng.bind(module)
    seen = []
    hook = module.model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: seen.append(tuple(i[0].shape))
    )
    try:
        torch.manual_seed(11)  # the unseeded path samples from the global generator
        comps = eng.generate(prompts, n, sampling)
    finally:
        hook.remove()
    return comps, seen


@pytest.mark.parametrize("seed", [None, 5])  # one batched generate call | one call per prompt (seeded)
def test_hf_engine_shared_prefill_samples_the_same_tokens(module64, seed):
    from lit_rl.rollout import SamplingConfig

    prompts, n = [[5, 6, 7, 8], [9, 10]], 3
    sp = SamplingConfig(temperature=1.0, max_new_tokens=6, seed=seed)
    plain, seen0 = _engine_run(module64, False, sp, prompts, n)
    shared, seen1 = _engine_run(module64, True, sp, prompts, n)
    for g0, g1 in zip(plain, shared):
        for c0, c1 in zip(g0, g1):
            assert c1.token_ids == c0.token_ids and c1.finish_reason == c0.finish_reason
            torch.testing.assert_close(
                torch.tensor(c1.logprobs), torch.tensor(c0.logprobs), rtol=1e-10, atol=1e-12
            )
    if (
        seed is None
    ):  # 6 rows, 2 distinct prompts: prefill 2 x (P-1) tokens, then the last prompt token per row
        assert seen0[0] == (6, 4) and seen1[:2] == [(2, 3), (6, 1)]
    else:  # per prompt: its n rows share one prefill
        assert seen0[0] == (3, 4) and seen1[:2] == [(1, 3), (3, 1)]


def test_shared_prompt_hidden_states_match_plain_forward_float64(module64):
    """project=False returns the LM head's input at the completion-predicting positions, (B, C, H), equal to the
    plain forward's last hidden states there, and its gradient equals the plain one's."""
    from lit_rl.models.shared_prompt import shared_prompt_outputs

    exp = _experience(PROMPTS, COMPLETIONS)
    att = exp.attention_mask.long()
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    P, C = exp.prompt_len, exp.completion_len
    model = module64.model
    w = torch.randn(
        C, model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    res = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        if shared:
            h = shared_prompt_outputs(model, exp.input_ids, att, pos, P, project=False)
        else:
            h = model(
                input_ids=exp.input_ids, attention_mask=att, position_ids=pos, output_hidden_states=True
            ).hidden_states[-1][:, P - 1 : -1]
        assert h.shape == (len(PROMPTS), C, model.config.hidden_size)
        (h * w * exp.loss_mask[..., None]).sum().backward()
        res.append(
            (h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        )
    (h0, g0), (h1, g1) = res
    m = exp.loss_mask
    torch.testing.assert_close(h1[m], h0[m], rtol=1e-10, atol=1e-12)
    _assert_same_grads(g0, g1)


def test_default_float32_path_shares_the_prompt_and_never_builds_logits(tiny_model_dir):
    """The default path composes both savings: the shared prompt pass returns the LM head's input, and the
    log-probs come chunk by chunk through the head (no (B, C, V) logits read), equal to the plain forward's."""
    from lit_rl.learners.heads import LazyLogits

    # float32, share_prompt_forward=None (auto: on); padding_free false: the padded path (full-length rows take
    # it by default; these uneven ones would be packed, tests/test_packed.py)
    m = PolicyModule(model=str(tiny_model_dir), padding_free=False)
    lm_head_projection(m.model)  # the head's one-time numerical check (one small forward) is not counted here
    exp = _experience(PROMPTS, COMPLETIONS)
    seen = []
    hook = m.model.get_input_embeddings().register_forward_hook(
        lambda mod, i, o: seen.append(tuple(i[0].shape))
    )
    before = LazyLogits.materialized
    try:
        with torch.no_grad():
            out = m.forward_outputs(exp)
            lp = m.completion_logprobs(exp)
    finally:
        hook.remove()
    assert out["head"] is not None and out["head"].hidden.shape == (
        6,
        exp.completion_len,
        m.model.config.hidden_size,
    )
    assert LazyLogits.materialized == before
    assert seen == [(2, exp.prompt_len), (6, exp.completion_len - 1)] * 2
    m.update_settings(share_prompt_forward=False)
    with torch.no_grad():
        plain = m.completion_logprobs(exp)
    torch.testing.assert_close(lp[exp.loss_mask], plain[exp.loss_mask], rtol=1e-5, atol=1e-5)
