"""CriticModule: parameter counts, hand-computed values and losses, bad input, PPO through Lightning."""

import functools
import math

import lightning as L
import pytest
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9}
TOKEN = {"head": "token", "yes_token": "Y", "no_token": "N"}


def _module(path, critic=None, **kw):
    kw.setdefault("optimizer", functools.partial(torch.optim.AdamW, lr=1e-2))
    return PolicyModule(model=str(path), critic=critic, **kw)


def _n(module):
    return sum(p.numel() for p in module.parameters())


def _experience(B=2, P=2, C=3):
    ids = torch.randint(5, 40, (B, P + C), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[True, True, True], [True, False, False]])
    att = torch.ones(B, P + C, dtype=torch.long)
    att[1, P + 1 :] = 0
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B),
        rewards=torch.ones(B),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )


def _fwd(mod, exp, hidden=True):
    logits, h = mod.forward_logits(exp, return_hidden=True)
    n = int(exp.loss_mask.sum())
    return {
        "logits": logits,
        "hidden": h if hidden else None,
        "mask": exp.loss_mask,
        "num_tokens": n,
        "num_seqs": int(exp.loss_mask.any(-1).sum()),
    }


def test_parameter_counts_regression_adds_hidden_plus_one_token_adds_zero(tiny_model_dir):
    base = _n(_module(tiny_model_dir))
    hidden = PolicyModule(model=str(tiny_model_dir)).model.config.hidden_size
    assert _n(_module(tiny_model_dir, CriticModule(head="regression"))) - base == hidden + 1 == 65
    assert _n(_module(tiny_model_dir, CriticModule(**TOKEN))) - base == 0


def test_yes_no_value_hand_computed(tiny_model_dir):
    mod = _module(tiny_model_dir, CriticModule(**TOKEN, value_range=(-1.0, 1.0)))
    yes, no = mod.critic.token_ids
    logits = torch.zeros(1, 2, 128, dtype=torch.float64)
    logits[0, 0, yes], logits[0, 0, no] = 2.0, 0.0  # P(yes)/(P(yes)+P(no)) = e^2/(e^2+1)
    logits[0, 1, yes], logits[0, 1, no] = -1.0, 3.0  # e^-1/(e^-1+e^3) = 1/(1+e^4)
    logits[0, :, 7] = 5.0  # other tokens' mass cancels in the renormalisation
    v, z = mod.critic.predict(mod, None, {"question_logits": logits})
    p = [math.exp(2) / (math.exp(2) + 1), 1 / (1 + math.exp(4))]
    assert z.tolist() == [[2.0, -4.0]]
    assert v[0].tolist() == pytest.approx([-1 + 2 * p[0], -1 + 2 * p[1]], rel=1e-12)


def test_token_head_bce_loss_hand_computed(tiny_model_dir):
    mod = _module(tiny_model_dir, CriticModule(**TOKEN, vf_coef=0.5), loss_agg="token_mean")
    yes, _ = mod.critic.token_ids
    exp = _experience()
    logits = torch.zeros(2, 3, 128, dtype=torch.float64)
    logits[..., yes] = 2.0  # z = 2 everywhere
    exp.values = torch.zeros(2, 3)
    exp.returns = torch.tensor([[1.0, 1.0, 0.0], [0.25, 7.0, 7.0]])  # 7.0 is padding: never read
    out = mod.critic.loss_terms(
        mod, exp, {"question_logits": logits, "mask": exp.loss_mask, "num_tokens": 4, "num_seqs": 2}
    )
    sp = math.log1p(math.exp(2.0))  # softplus(2); BCE = softplus(z) - y z
    expected = ((sp - 2) * 2 + sp + (sp - 0.5)) / 4
    assert float(out["value"]) == pytest.approx(0.5 * expected, rel=1e-12)
    exp.returns[0, 0] = 1.5
    with pytest.raises(ValueError, match=r"returns must lie in value_range=\[0.0, 1.0\]"):
        mod.critic.loss_terms(
            mod, exp, {"question_logits": logits, "mask": exp.loss_mask, "num_tokens": 4, "num_seqs": 2}
        )


def test_regression_clipped_value_loss_hand_computed(tiny_model_dir):
    mod = _module(tiny_model_dir, CriticModule(vf_coef=0.5, value_clip=0.2), loss_agg="token_mean")
    with torch.no_grad():
        mod.critic.head.weight.zero_()
        mod.critic.head.bias.fill_(0.5)  # V = 0.5 on every token
    exp = _experience()
    exp.values = torch.tensor([[0.2, 0.2, 0.45], [0.2, 0.0, 0.0]])
    exp.returns = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    out = mod.critic.loss_terms(mod, exp, _fwd(mod, exp))
    # token (0,0): clip(0.5, 0.0, 0.4) = 0.4 -> 0.5·max(0.25, 0.36) = 0.18 (clipped term binds)
    # token (0,1): return 0 -> 0.5·max(0.25, 0.16) = 0.125;  (0,2): old 0.45, inside the clip -> 0.125
    # token (1,0): same as (0,0) = 0.18
    assert float(out["value"]) == pytest.approx(0.5 * (0.18 + 0.125 + 0.125 + 0.18) / 4, rel=1e-6)


def test_attach_values_masks_padding_and_matches_predict(tiny_model_dir):
    mod = _module(tiny_model_dir, CriticModule())
    exp = _experience()
    mod.critic.attach_values(mod, exp)
    with torch.no_grad():
        v, _ = mod.critic.predict(mod, exp, _fwd(mod, exp))
    assert exp.values.shape == (2, 3) and bool((exp.values[~exp.loss_mask] == 0).all())
    torch.testing.assert_close(exp.values[exp.loss_mask], v[exp.loss_mask], rtol=1e-6, atol=1e-7)


def test_detach_backbone_stops_value_gradient_at_the_backbone(tiny_model_dir):
    for detach, expect_backbone_grad in ((True, False), (False, True)):
        mod = _module(tiny_model_dir, CriticModule(detach_backbone=detach, value_clip=None))
        with torch.no_grad():  # the head starts at zero, which alone would block the backbone gradient
            mod.critic.head.weight.fill_(0.1)
        exp = _experience()
        exp.values, exp.returns = torch.zeros(2, 3), torch.ones(2, 3)
        mod.critic.loss_terms(mod, exp, _fwd(mod, exp))["value"].backward()
        grads = [p.grad for p in mod.model.parameters() if p.grad is not None and p.grad.abs().sum() > 0]
        assert bool(grads) is expect_backbone_grad
        assert mod.critic.head.weight.grad.abs().sum() > 0


def test_regression_head_starts_at_zero_value(tiny_model_dir):
    """V ≡ 0 before training: first advantages are the rewards, and no value-loss gradient reaches a shared
    backbone until the head has moved (a random head gave |V| ~ 1 and collapsed PPO's entropy)."""
    mod = _module(tiny_model_dir, CriticModule())
    exp = _experience()
    mod.critic.attach_values(mod, exp)
    assert bool((exp.values == 0).all())


def test_bad_input_errors(tiny_model_dir, tiny_llama_dir):
    with pytest.raises(ValueError, match=r"not single tokens: ' yes' -> 4 tokens"):
        _module(tiny_model_dir, CriticModule(head="token"))
    with pytest.raises(ValueError, match="share_backbone=True but critic model .*llama.*qwen2"):
        _module(tiny_model_dir, CriticModule(model=str(tiny_llama_dir)))
    for kw, match in (
        ({"head": "mlp"}, "head='mlp'.*regression, token"),
        ({"vf_coef": -1.0}, "vf_coef"),
        ({"value_clip": 0.0}, "value_clip"),
        ({"value_range": (1.0, 0.0)}, "value_range"),
    ):
        with pytest.raises(ValueError, match=match):
            CriticModule(**kw)
    mod = _module(tiny_model_dir, CriticModule())
    with pytest.raises(RuntimeError, match="advantage='gae'"):
        mod.critic.loss_terms(mod, _experience(), _fwd(mod, _experience()))


def _fit(mod, steps):
    rc = RolloutCallback(rewards=ExactAnswerReward(), group_size=4, sampling=SamplingConfig(max_new_tokens=2))
    trainer = L.Trainer(
        max_steps=steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    return trainer


@pytest.mark.parametrize("critic_kw", [{}, {"share_backbone": False}])
def test_ppo_with_critic_runs_through_lightning(tiny_model_dir, critic_kw):
    mod = _module(
        tiny_model_dir, CriticModule(**critic_kw), advantage="gae", lam=0.95, ppo_epochs=2, minibatch_size=4
    )
    with torch.no_grad():  # non-zero values, so the value loss has a gradient even if every reward is 0
        torch.manual_seed(0)
        mod.critic.head.weight.normal_(std=0.1)
    head0 = mod.critic.head.weight.detach().clone()
    trainer = _fit(mod, steps=4)  # one iteration: ppo_epochs 2 x (8 rows / minibatch 4) optimizer steps
    m = trainer.callback_metrics
    for k in ("critic/value_loss", "critic/explained_variance", "loss/value", "loss/policy"):
        assert k in m and math.isfinite(float(m[k])), k
    assert not torch.equal(head0, mod.critic.head.weight)  # the head was trained by the joint loss
    if critic_kw.get("share_backbone") is False:
        assert mod.critic.backbone is not None and mod.critic.backbone is not mod.model


def test_ppo_config_runs_under_the_cli(tiny_model_dir, tmp_path):
    from lit_rl.cli import main

    # one iteration = ppo_epochs 2 x (2 prompts x 8 samples / minibatch 4) = 8 optimizer steps (max_steps counts those)
    main(
        [
            "fit",
            "-c",
            "configs/ppo.yaml",
            "--trainer.max_steps",
            "8",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--model.init_args.model",
            str(tiny_model_dir),
            "--data.init_args.batch_size",
            "2",
            "--model.init_args.minibatch_size",
            "4",
        ]
    )
    assert "lit_rl.learners.critic.CriticModule" in (tmp_path / "config.yaml").read_text()


def test_value_only_warmup_leaves_a_detached_policy_untouched(tiny_model_dir):
    # weight_decay=0: AdamW's decoupled decay would move parameters even with all-zero gradients
    mod = _module(
        tiny_model_dir,
        CriticModule(warmup_steps=1, detach_backbone=True),
        advantage="gae",
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.0),
    )
    before = [p.detach().clone() for p in mod.model.parameters()]
    with torch.no_grad():  # non-zero values: the value loss has a gradient even if every reward is 0
        torch.manual_seed(0)
        mod.critic.head.weight.normal_(std=0.1)
    head0 = mod.critic.head.weight.detach().clone()
    _fit(mod, steps=1)
    assert all(torch.equal(a, b) for a, b in zip(before, mod.model.parameters()))
    assert not torch.equal(head0, mod.critic.head.weight)
    with pytest.raises(ValueError, match="warmup_steps"):
        CriticModule(warmup_steps=-1)
