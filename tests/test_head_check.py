"""The chunked LM-head path is taken only when the model's logits really are ``lm_head(hidden)``: a model that
transforms its logits after the head under a name ``projection_blocker`` does not know (here: a forward hook
scaling the CausalLM's logits, and a config field no list names) falls back to the materialised logits, logged
once, and its log-probs are the model's own."""

from __future__ import annotations

import logging
import types

import torch

from lit_rl.learners import heads


def _scaled(model, factor):
    """Scale the CausalLM's output logits by ``factor`` (what a width multiplier or a soft-cap under an unknown
    config name does)."""

    def hook(mod, args, out):
        out.logits = out.logits * factor
        return out

    return model.register_forward_hook(hook)


def test_unknown_logit_transform_falls_back_to_materialised_logits(tiny_model_dir, caplog):
    from lit_rl.models.loading import load_causal_lm

    plain = load_causal_lm(str(tiny_model_dir))
    assert heads.projection_blocker(plain) is None
    w, _ = heads.lm_head_projection(plain)  # exact: the chunked path stays on
    assert w is plain.get_output_embeddings().weight
    scaled = load_causal_lm(str(tiny_model_dir))
    scaled.config.logit_width_multiplier = 3.0  # a name no list knows; the hook does the scaling
    _scaled(scaled, 3.0)
    assert heads.projection_blocker(scaled) is None  # the config names alone let it through
    with caplog.at_level(logging.WARNING, logger=heads.log.name):
        assert heads.lm_head_projection(scaled) is None
        assert heads.lm_head_projection(scaled) is None  # the verdict is kept: checked once, logged once
    msgs = [r.getMessage() for r in caplog.records if "differs from the model's own logits" in r.getMessage()]
    assert len(msgs) == 1, msgs


def test_policy_logprobs_of_a_scaled_model_are_its_own(tiny_model_dir):
    """End to end through PolicyModule.completion_logprobs: equal to log_softmax of the model's own (scaled)
    logits, computed by hand from one forward."""
    from lit_rl.learners import PolicyModule

    policy = PolicyModule(model=str(tiny_model_dir))
    _scaled(policy.model, 3.0)
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    ids = torch.tensor([prompt + completion])  # the fields forward_outputs reads of an Experience micro-batch
    exp = types.SimpleNamespace(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        completion_len=len(completion),
        completion_ids=torch.tensor([completion]),
        prompt_len=len(prompt),
    )
    policy.update_settings(share_prompt_forward=False)
    with torch.no_grad():
        got = policy.completion_logprobs(exp)[0].double()
        logits = (
            policy.model(input_ids=torch.tensor([prompt + completion]))
            .logits[0, len(prompt) - 1 : -1]
            .double()
        )
    want = torch.log_softmax(logits / policy.temperature, -1).gather(-1, torch.tensor(completion)[:, None])[
        :, 0
    ]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
