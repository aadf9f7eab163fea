"""PolicyModule(gradient_checkpointing=True): the same log-probs and gradients as the plain path, in float64,
through the chunked-head forward (the shared-prompt pass is skipped under checkpointing), the materialised
path, and a LoRA policy; the decoder layers really are checkpointed (fewer tensors saved for backward)."""

from __future__ import annotations

import pytest
import torch

from lit_rl.learners import PolicyModule
from lit_rl.learners.forward import _checkpoint_layers
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling
from tests._float64 import float64_rmsnorm
from tests.test_shared_prompt import COMPLETIONS, PROMPTS, _experience


@pytest.fixture(autouse=True)
def _float64_norm():
    with float64_rmsnorm():
        yield


def _module(path, gc: bool, **kw) -> PolicyModule:
    m = PolicyModule(model=str(path), gradient_checkpointing=gc, **kw)
    m.model.double()
    bind_sampling(m, SamplingConfig(temperature=0.7))
    return m


def _logprobs_and_grads(m: PolicyModule, exp, materialize: bool = False):
    m.model.train()
    m.model.zero_grad(set_to_none=True)
    w = torch.linspace(-1.0, 2.0, exp.completion_len, dtype=torch.float64)
    if materialize:
        lp = m.completion_logprobs(exp, logits=m.forward_logits(exp))
    else:
        lp = m.completion_logprobs(exp)
    (lp * w * exp.loss_mask).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in m.model.named_parameters() if p.grad is not None}


def _saved_tensors(m: PolicyModule, exp) -> int:
    n = [0]

    def pack(t):
        n[0] += 1
        return t

    m.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m.completion_logprobs(exp).sum()
    return n[0]


@pytest.mark.parametrize("materialize", [False, True], ids=["chunked_head", "materialised"])
@pytest.mark.parametrize("share", [None, True], ids=["share_auto", "share_forced"])
def test_checkpointed_gradients_equal_the_plain_path_in_float64(tiny_model_dir, materialize, share):
    exp = _experience(PROMPTS, COMPLETIONS)
    plain, ckpt = _module(tiny_model_dir, False), _module(tiny_model_dir, True)
    for m in (plain, ckpt):
        m.update_settings(share_prompt_forward=share)
    assert not _checkpoint_layers(plain.model) and len(_checkpoint_layers(ckpt.model)) == 2
    lp0, g0 = _logprobs_and_grads(plain, exp, materialize)
    lp1, g1 = _logprobs_and_grads(ckpt, exp, materialize)
    torch.testing.assert_close(lp1, lp0, rtol=1e-12, atol=1e-12)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-9, atol=1e-12, msg=n)
    assert not ckpt._shares_prompt(ckpt.model)  # the cache-writing prompt pass is never checkpointed


def test_checkpointing_saves_fewer_tensors_and_is_off_in_eval(tiny_model_dir):
    exp = _experience(PROMPTS, COMPLETIONS)
    plain, ckpt = _module(tiny_model_dir, False), _module(tiny_model_dir, True)
    plain.update_settings(share_prompt_forward=False)
    n_plain, n_ckpt = _saved_tensors(plain, exp), _saved_tensors(ckpt, exp)
    assert n_ckpt < n_plain / 2, (n_ckpt, n_plain)  # the layers keep only their inputs
    ckpt.model.eval()  # the engines generate in eval mode: the cache works there
    with torch.no_grad():
        out = ckpt.model(input_ids=exp.input_ids[:1], use_cache=True)
    assert out.past_key_values is not None and out.past_key_values.get_seq_length() == exp.input_ids.shape[1]


def test_checkpointing_with_lora_equals_plain_lora(tiny_model_dir):
    exp = _experience(PROMPTS, COMPLETIONS)
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False}
    torch.manual_seed(0)
    plain = _module(tiny_model_dir, False, lora=lora)
    torch.manual_seed(0)
    ckpt = _module(tiny_model_dir, True, lora=lora)
    ckpt.model.load_state_dict(plain.model.state_dict())
    lp0, g0 = _logprobs_and_grads(plain, exp)
    lp1, g1 = _logprobs_and_grads(ckpt, exp)
    torch.testing.assert_close(lp1, lp0, rtol=1e-12, atol=1e-12)
    assert g0.keys() == g1.keys() and all("lora_" in n for n in g0) and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-9, atol=1e-12, msg=n)
