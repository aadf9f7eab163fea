"""The default training path never materialises the (b, C, V) logits, and its gradient equals the materialised
path's (``PolicyModule.materialize_logits = True``, the pre-chunking code) through a real Trainer step (float64):
GRPO with an entropy bonus and a reference-KL loss term, PPO with a shared-backbone critic, and distillation with
every full-vocabulary term. Models whose logits are not ``lm_head(hidden)`` (LoRA on the head) fall back."""

from __future__ import annotations

import copy

import pytest
import torch
from _conformance import build_module, flat, hand_experience, max_rel_diff, run_step

from lit_rl.learners.heads import LazyLogits, projection_blocker

RTOL = 1e-9


def _exp(module):
    return hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)


def _callbacks(name, tmp_path, module):
    from lit_rl.callbacks.entropy import EntropyRegularization
    from lit_rl.callbacks.reference_kl import ReferenceKL

    if name == "grpo":
        rkl = ReferenceKL(kind="k3", where="loss", beta=0.1)
        # float64 reference: the copy ReferenceKL takes at setup precedes Lightning's 64-true conversion
        rkl.ref = copy.deepcopy(module.model).double().eval().requires_grad_(False)
        return [EntropyRegularization(coef=0.05), rkl]
    if name == "distill":
        from lit_rl.callbacks.teachers import Teacher, TeacherRouter
        from lit_rl.models.loading import load_causal_lm
        from lit_rl.models.tiny import build_tiny_model

        tdir = tmp_path / "teacher"
        build_tiny_model(
            str(tdir), layers=2, hidden=32, heads=2, tokenizer="char", seed=7, overwrite=True
        )  # another hidden size than the student
        teacher = load_causal_lm(str(tdir), "float32").double().eval()
        return [TeacherRouter({"default": Teacher(model=teacher)})]
    return []


OVERRIDES = {
    "grpo": {},
    "ppo": {},
    "distill": {
        "losses": {
            "reverse_kl_full": 1.0,
            "forward_kl": 0.3,
            "jsd": 0.5,
            "topk_reverse_kl": 0.7,
            "reverse_kl_sampled": 0.2,
        }
    },
}


@pytest.mark.parametrize("name", ["grpo", "ppo", "distill"])
def test_step_gradient_equals_materialised_path_without_materialising(tiny_model_dir, tmp_path, name):
    grads = {}
    for materialize in (False, True):
        module = build_module(name, str(tiny_model_dir), **OVERRIDES[name])
        module.materialize_logits = materialize
        before = LazyLogits.materialized
        grads[materialize] = run_step(
            module, _exp(module), callbacks=_callbacks(name, tmp_path, module), temperature=0.7
        )
        if not materialize:
            assert LazyLogits.materialized == before, "a consumer read fwd['logits'] on the chunked path"
    assert len(grads[False]) == len(grads[True]) >= 1
    for got, ref in zip(grads[False], grads[True]):
        assert float(flat(ref).abs().max()) > 0
        assert max_rel_diff(flat(got), flat(ref)) <= RTOL


def test_lazy_logits_still_serve_an_unconverted_consumer(tiny_model_dir):
    """A LossTerm that reads fwd["logits"] gets the full logits, differentiably, and the counter says so."""
    module = build_module("grpo", str(tiny_model_dir))
    module.model.double()
    exp = _exp(module)
    out = module.forward_outputs(exp)
    fwd = LazyLogits(head=out["head"])
    before = LazyLogits.materialized
    logits = fwd["logits"]  # (b, C, V)
    assert LazyLogits.materialized == before + 1 and fwd["logits"] is logits  # computed once
    ref = module.forward_outputs(exp, materialize=True)["logits"]
    assert logits.shape == ref.shape and float((logits - ref).abs().max()) <= 1e-12
    assert logits.requires_grad


def test_lora_on_lm_head_falls_back_to_materialised_logits(tiny_model_dir):
    from lit_rl.learners import PolicyModule

    module = PolicyModule(model=str(tiny_model_dir), lora={"r": 2, "target_modules": ["q_proj", "lm_head"]})
    assert "not a plain Linear" in projection_blocker(module.model)
    exp = _exp(module)
    out = module.forward_outputs(exp)
    assert out["head"] is None and out["logits"].shape[-1] == module.model.config.vocab_size


def test_default_lora_keeps_the_chunked_path_and_equal_logprobs(tiny_model_dir):
    from lit_rl.learners import PolicyModule

    module = PolicyModule(model=str(tiny_model_dir), lora={"r": 2})  # all-linear: peft leaves lm_head alone
    module.model.double()
    assert projection_blocker(module.model) is None
    exp = _exp(module)
    lp = module.completion_logprobs(exp)
    ref = module.completion_logprobs(exp, logits=module.forward_logits(exp))
    assert module.forward_outputs(exp)["head"] is not None
    assert float((lp - ref).abs().max()) <= 1e-12


def test_hidden_states_are_the_heads_input(tiny_llama_dir):
    """The decoder-hook hidden states (the critic's regression input) equal the CausalLM's last hidden states
    (final norm applied) at the completion positions, for llama too."""
    from lit_rl.learners import PolicyModule

    module = PolicyModule(model=str(tiny_llama_dir))
    module.model.double()
    exp = _exp(module)
    new = module.forward_outputs(exp, hidden=True)["hidden"]
    old = module.forward_outputs(exp, hidden=True, materialize=True)["hidden"]
    assert new.shape == old.shape and float((new - old).abs().max()) == 0.0
    head = module.forward_outputs(exp)["head"]
    assert head.weight is module.model.get_input_embeddings().weight  # tied: one parameter
    torch.testing.assert_close(head.logits(), module.forward_logits(exp), rtol=0, atol=1e-12)
