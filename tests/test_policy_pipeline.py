"""Component tests of the GRPO pipeline on a real tiny model: hook order, loss terms, validation."""

import functools

import lightning as L
import pytest
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.learners import LossTerm, PolicyModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9}


def _trainer(callbacks, steps=1):
    return L.Trainer(
        max_steps=steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def _module(path, **kw):
    kw.setdefault("optimizer", functools.partial(torch.optim.AdamW, lr=1e-2))
    return PolicyModule(model=str(path), **kw)


def _rollout(**kw):
    kw.setdefault("group_size", 4)
    return RolloutCallback(rewards=ExactAnswerReward(), sampling=SamplingConfig(max_new_tokens=2), **kw)


class Spy(L.Callback):
    def __init__(self):
        self.events = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.events.append(("batch_start", batch.experience is not None))

    def on_experience(self, trainer, module, exp):
        self.events.append(("on_experience", exp.advantages is None, exp.rewards.shape[0]))


def test_experience_hooks_run_before_advantages_and_before_training(tiny_model_dir):
    spy_before, spy_after = Spy(), Spy()
    seen = {}

    class Probe(PolicyModule):
        def training_step(self, batch, batch_idx):
            seen["adv_set"] = batch.experience.advantages is not None
            return super().training_step(batch, batch_idx)

    mod = Probe(model=str(tiny_model_dir))
    # spy_before sits before the RolloutCallback: its batch_start sees no Experience yet
    _trainer([spy_before, _rollout(), spy_after]).fit(
        mod, datamodule=PromptDataModule(task_args=TASK, batch_size=3)
    )
    assert spy_before.events[0] == ("batch_start", False)
    assert ("on_experience", True, 12) in spy_before.events  # hooks see the Experience before advantages
    assert ("on_experience", True, 12) in spy_after.events
    # spy_after's batch_start runs after the RolloutCallback's: the Experience exists by then
    assert ("batch_start", True) in spy_after.events
    assert seen["adv_set"] is True


class ScaledLogprobTerm(L.Callback, LossTerm):
    """A LossTerm: coefficient * mean log-prob of the sampled tokens."""

    def __init__(self, coef):
        self.coef = coef

    def loss_terms(self, module, micro, fwd):
        return {"probe": self.coef * module.aggregate(fwd["logprobs"], fwd["mask"], fwd)}


def _params_after_one_step(path, callbacks):
    torch.manual_seed(0)
    mod = _module(path, seed=0)
    L.seed_everything(0)
    _trainer([_rollout()] + callbacks).fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    return torch.cat([p.detach().flatten() for p in mod.model.parameters()])


def test_loss_terms_from_callbacks_enter_the_gradient(tiny_model_dir):
    base = _params_after_one_step(tiny_model_dir, [])
    zero = _params_after_one_step(tiny_model_dir, [ScaledLogprobTerm(0.0)])
    probe = _params_after_one_step(tiny_model_dir, [ScaledLogprobTerm(100.0)])
    assert torch.equal(base, zero)  # a zero-weighted term changes nothing (same seed, deterministic)
    assert (probe - base).abs().max() > 1e-4


def test_nonfinite_gradient_skips_step_then_raises(tiny_model_dir):
    class NaNTerm(L.Callback, LossTerm):
        def loss_terms(self, module, micro, fwd):
            return {"nan": fwd["logprobs"].sum() * float("nan")}

    mod = _module(tiny_model_dir, max_nonfinite_steps=2)
    before = [p.detach().clone() for p in mod.model.parameters()]
    with pytest.raises(RuntimeError, match="non-finite gradient norm"):
        _trainer([_rollout(), NaNTerm()], steps=5).fit(
            mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2)
        )
    assert mod.skipped_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, mod.model.parameters()))


def test_minibatch_must_divide_rollout_batch(tiny_model_dir):
    mod = _module(tiny_model_dir, minibatch_size=5)
    with pytest.raises(ValueError, match="minibatch_size=5 does not divide the rollout batch of 12 rows"):
        _trainer([_rollout()]).fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"advantage": "grpo2"}, "advantage='grpo2'.*valid names: .*dr_grpo"),
        ({"policy_loss": "ppo"}, "policy_loss='ppo'.*valid names: .*cispo"),
        ({"loss_agg": "mean"}, "loss_agg='mean'.*token_mean"),
        ({"rollout_correction": "is"}, "rollout_correction='is'.*tis"),
        ({"clip_high": 0.0}, "clip_high"),
        ({"minibatch_size": 8, "micro_batch_size": 3}, "micro_batch_size=3 must divide minibatch_size=8"),
        ({"ppo_epochs": 0}, "ppo_epochs"),
    ],
)
def test_module_config_errors_name_the_field(tiny_model_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyModule(model=str(tiny_model_dir), **kwargs)


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="the local path does not exist, and it is not a hub id"):
        PolicyModule(model=str(tmp_path / "nope"))


def test_rollout_config_errors():
    with pytest.raises(ValueError, match="overlong_prompts"):
        RolloutCallback(rewards=ExactAnswerReward(), overlong_prompts="cut")
    with pytest.raises(ValueError, match="group_size"):
        RolloutCallback(rewards=ExactAnswerReward(), group_size=0)
    with pytest.raises(ValueError, match="rewards is required"):
        RolloutCallback()
    with pytest.raises(ValueError, match="dynamic_sampling needs group_size >= 2"):
        RolloutCallback(rewards=ExactAnswerReward(), group_size=1, dynamic_sampling=True)
    with pytest.raises(ValueError, match="sampling.top_p"):
        SamplingConfig(top_p=0.0)


def test_datamodule_errors(tmp_path):
    with pytest.raises(
        ValueError,
        match="task='mul' is not a built-in task; valid names: addition, agent_guess, agent_lookup, agent_multiply, "
        "chat_addition, chat_compare, chat_largest, "
        "chat_mixed, chat_multiply_digit, reverse",
    ):
        PromptDataModule(task="mul")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(
        ValueError, match="empty"
    ):  # records are read and checked when the datamodule is built
        PromptDataModule(train_files=[str(empty)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: missing field 'prompt'"):  # file:line, lines from 1
        PromptDataModule(train_files=[str(bad)])


def test_overlong_prompts_truncate_drop_error(tiny_model_dir):
    from lit_rl.data.prompts import Prompt

    tok = PolicyModule(model=str(tiny_model_dir)).tokenizer
    prompts = [Prompt(prompt="1+1="), Prompt(prompt="123456789+1=")]
    for mode, expect_n, counter in (("truncate", 2, "prompts_truncated"), ("drop", 1, "prompts_dropped")):
        rc = RolloutCallback(rewards=ExactAnswerReward(), max_prompt_len=5, overlong_prompts=mode)
        kept, ids = rc.pipeline.render(tok, prompts)
        assert len(kept) == expect_n and rc.pipeline.render.counters[counter] == 1 and max(map(len, ids)) <= 5
    rc = RolloutCallback(rewards=ExactAnswerReward(), max_prompt_len=5, overlong_prompts="error")
    with pytest.raises(ValueError, match="max_prompt_len=5"):
        rc.pipeline.render(tok, prompts)


def test_metric_reduction_keeps_extremes_across_micro_batches():
    from lit_rl.learners.policy import _reduce

    assert _reduce("is/max_weight", [1.0, 7.5, 2.0]) == 7.5  # a spike in one micro-batch stays visible
    assert _reduce("actor/ratio_min", [0.9, 0.4]) == 0.4
    assert _reduce("actor/entropy", [1.0, 2.0, 4.5]) == 2.5


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_accumulation_is_exact(tiny_model_dir, loss_agg):
    """1 × 8 rows vs 4 × 2 vs 8 × 1 micro-batches: the same parameters after 2 optimizer steps (≤ 1e-6).

    Each micro-batch divides by the minibatch's token / sequence counts, so the accumulated gradient is the
    minibatch gradient exactly (up to float summation order)."""
    from lit_rl.rewards import RegexFormatReward

    finals = []
    for micro in (None, 2, 1):
        L.seed_everything(0)
        # no clipping (it would rescale a wrongly-scaled gradient back) and plain SGD (no Adam normalisation)
        mod = _module(
            tiny_model_dir,
            loss_agg=loss_agg,
            micro_batch_size=micro,
            max_grad_norm=1e9,
            optimizer=functools.partial(torch.optim.SGD, lr=0.05),
        )
        rc = RolloutCallback(
            rewards={"digit": RegexFormatReward(pattern=".*[0-9].*")},
            group_size=4,
            sampling=SamplingConfig(max_new_tokens=3, seed=3),
        )
        _trainer([rc], steps=2).fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
        finals.append({k: v.detach().clone().double() for k, v in mod.model.state_dict().items()})
    base = PolicyModule(model=str(tiny_model_dir)).model.state_dict()
    moved = max(float((finals[0][k] - base[k].double()).abs().max()) for k in base)
    assert moved > 1e-4, moved  # the steps really changed the weights (non-zero advantages)
    for other in finals[1:]:
        assert max(float((finals[0][k] - other[k]).abs().max()) for k in base) <= 1e-6
