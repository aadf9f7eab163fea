"""The on-policy invariants in bfloat16 (``precision="bf16-true"``) with top-p: the rows where ties decide.

A bf16 model's logits carry 8 significand bits, so equal scores are everywhere and top-p's kept count usually
ends inside a group of them (issue 53). The engine (``HFEngine``, ``LogitProcessing.apply``) and the trainer's
fused pass (``core.fused_sampler``) must then keep the same tied ids — or at least the same count, with the
sampled token in it — for the mismatch correction to be 1 at the on-policy point. On this CPU the engine's and the
trainer's bf16 logits agree bit for bit (the materialised trainer path reproduces μ exactly), so the float32
bounds apply. Before the shared rule the fused pass kept every tied token: mismatch KL 4.8e-6 and a weight off
by 1.1e-2 in the first row (the float32 rows, without ties, never saw it).
"""

from __future__ import annotations

import pytest
import torch

from invariants import _checks, _harness

BASE = {
    "family": "grpo",
    "kl": "none",
    "temperature": 1.0,
    "top_p": 0.8,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "stop": None,
    "engine": "hf_shared",
    "padding_free": False,
    "micro_batch_tokens": None,
    "lora": False,
    "gradient_checkpointing": False,
    "ppo_epochs": 1,
}
ROWS = {
    "top_p0.8-tis_token-hf_shared": {**BASE, "correction": "tis/token"},
    "T0.7-top_p0.9-top_k20-mis_sequence-hf_copy-kl_reward_k3": {
        **BASE,
        "correction": "mis/sequence",
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "engine": "hf_copy",
        "kl": "reward/k3",
    },
}


def _cut_ties(run) -> int:
    """Positions whose kept set ends inside a group of equal scores (the trainer's bf16 logits): the row must
    exercise the tie rule, else it checks nothing the float32 rows do not."""
    from lit_rl.core.processed import LogitProcessing

    s, exp = run.settings, run.exp
    pr = LogitProcessing(s["temperature"], s["top_p"], s["top_k"], s["min_p"], s["repetition_penalty"])
    with torch.no_grad():
        logits = run.module.model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits
    C = exp.loss_mask.shape[1]
    x = logits[:, -C - 1 : -1].float()[exp.loss_mask] / pr.temperature  # (n, V) the scores of the completion
    kept = ~pr.removed(x)
    tau = x.masked_fill(~kept, float("inf")).amin(-1, keepdim=True)
    return int(((x == tau) & ~kept).any(-1).sum())


@pytest.mark.parametrize("name", list(ROWS))
def test_bfloat16_on_policy_with_ties(name, tiny_model_dir):  # ~4 s per row
    run = _harness.run(ROWS[name], str(tiny_model_dir), precision="bf16-true")
    assert next(run.module.model.parameters()).dtype == torch.bfloat16
    ties, m = _cut_ties(run), run.metrics
    print(f"\n{name}: {ties} cut tied groups, mismatch_kl {m['rollout/logprob_mismatch_kl']:.2e}")
    assert ties >= 1, "no kept set ended inside a tied group: the row does not test the tie rule"
    bad = _checks.structure(run, _checks.FLOAT32) + _checks.distribution(run, _checks.FLOAT32)
    assert not bad, "\n".join(bad)
