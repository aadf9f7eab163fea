"""The yes/no value head asks its question after each prefix (the seed's design), not at the policy's logits."""

from __future__ import annotations

import functools

import lightning as L
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

TOKEN = {"head": "token", "yes_token": "Y", "no_token": "N", "question": " good? "}


def _exp():
    """Row 0: 3-token prompt, 4 completion tokens; row 1: 2-token prompt (left pad), 2 tokens (right pad)."""
    ids = torch.randint(10, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    att = torch.ones((2, 7), dtype=torch.long)
    att[1, 0] = 0
    att[1, 5:] = 0
    mask = att[:, 3:].bool()
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=3,
        group_ids=torch.arange(2),
        rewards=torch.ones(2),
        valid=torch.ones(2, dtype=torch.bool),
        policy_version=torch.zeros(2, dtype=torch.long),
    )


def test_value_is_read_after_the_question_appended_to_each_prefix(tiny_model_dir):
    """z_t from the cached one-pass readout equals logit(Y) − logit(N) of a separate forward over
    prefix s_t (its real tokens) + the question, for every real completion position (float64)."""
    mod = PolicyModule(model=str(tiny_model_dir), critic=CriticModule(**TOKEN)).double()
    exp = _exp()
    with torch.no_grad():
        _, z = mod.critic.predict(mod, exp)
    yes, no = mod.critic.token_ids
    q = mod.critic.question_ids
    for i in range(2):
        for t in range(int(exp.loss_mask[i].sum())):
            prefix = exp.input_ids[i, : 3 + t][exp.attention_mask[i, : 3 + t].bool()]
            with torch.no_grad():
                logits = mod.model(input_ids=torch.cat([prefix, q])[None]).logits[0, -1]
            assert abs(float(z[i, t]) - float(logits[yes] - logits[no])) <= 1e-10 * max(
                1.0, abs(float(z[i, t]))
            )


def test_training_the_detached_token_head_alone_leaves_the_policy_unchanged(tiny_model_dir):
    """detach_backbone: only δ (hidden-size vector) learns from the value loss; after value-only warm-up
    steps the policy's completion log-probs are bitwise unchanged while the values moved."""
    critic = CriticModule(**TOKEN, detach_backbone=True, warmup_steps=100, vf_coef=1.0)
    mod = PolicyModule(
        model=str(tiny_model_dir),
        critic=critic,
        advantage="gae",
        optimizer=functools.partial(torch.optim.SGD, lr=0.5),
    )
    assert critic.delta is not None and critic.delta.numel() == mod.model.config.hidden_size
    exp = _exp()
    with torch.no_grad():
        lp0 = mod.completion_logprobs(exp).clone()
        v0, _ = critic.predict(mod, exp)
    rc = RolloutCallback(rewards=ExactAnswerReward(), group_size=4, sampling=SamplingConfig(max_new_tokens=2))
    L.seed_everything(0)
    L.Trainer(
        accelerator="cpu",
        max_steps=3,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc],
    ).fit(
        mod,
        datamodule=PromptDataModule(
            task="addition", task_args={"answer_width": 1, "max_sum": 9}, batch_size=2
        ),
    )
    with torch.no_grad():
        lp1 = mod.completion_logprobs(exp)
        v1, _ = critic.predict(mod, exp)
    assert torch.equal(lp0, lp1)
    assert float((v1 - v0)[exp.loss_mask].abs().max()) > 1e-4
    assert float(critic.delta.abs().max()) > 0
