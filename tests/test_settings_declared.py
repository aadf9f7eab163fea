"""Every learner setting is declared once (``core.settings``): the signature, the docs, the CLI's ``--help``
and the errors all come from that one declaration (issue 37)."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields

import pytest

from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.cli.app import main
from lit_rl.core.settings import doc_of
from lit_rl.learners.config import POLICY_GROUPS, PolicyConfig
from lit_rl.learners.critic import CriticModule
from lit_rl.learners.distill import DISTILL_GROUPS, DistillConfig, DistillModule
from lit_rl.learners.policy import PolicyModule
from lit_rl.learners.reward_model import RewardModelModule

LEARNERS = [PolicyModule, DistillModule, CriticModule, RewardModelModule]


def _settings_classes() -> list[type]:
    # RolloutCallback takes its settings through flat_settings once it declares them in groups
    return LEARNERS + ([RolloutCallback] if "settings_groups" in vars(RolloutCallback) else [])


@pytest.mark.parametrize("cls", _settings_classes(), ids=lambda c: c.__name__)
def test_each_parameter_is_documented_exactly_once(cls):
    doc = cls.__doc__
    params = [p for p in inspect.signature(cls).parameters if p != "self"]
    assert len(params) == len(set(params))
    for name in params:
        entries = re.findall(rf"^ {{8}}{name}: (.*)$", doc, flags=re.MULTILINE)
        assert len(entries) == 1, (cls.__name__, name, entries)
        assert entries[0].strip(), (cls.__name__, name)
    for g in cls.settings_groups:  # and every group field is a parameter, with its declared doc
        for f in fields(g):
            assert f.name in params and doc_of(f), (g.__name__, f.name)


# ``seed`` is each component's own RNG key (the policy's, the rollout refills', an engine's, the data's), all
# defaulting to the run's ``seed_everything`` (``core.seeds``): one name per owner, as TRL / Lightning users expect.
_PER_OWNER = {"seed"}


def test_no_setting_is_a_field_of_two_groups():
    owner: dict[str, type] = {}
    groups = {g for cls in _settings_classes() for g in cls.settings_groups}
    # model, precision, forward, advantages, objective, step, distill, critic, reward model
    assert len(groups) >= 9
    for g in groups:
        for f in fields(g):
            if f.name in _PER_OWNER:
                continue
            assert owner.setdefault(f.name, g) is g, f"{f.name}: {owner[f.name].__name__} and {g.__name__}"


def test_the_flat_signature_and_the_config_holder_have_the_same_groups():
    assert PolicyModule.settings_groups == POLICY_GROUPS == PolicyConfig.groups()
    assert DistillModule.settings_groups == DISTILL_GROUPS == DistillConfig.groups()
    sig = inspect.signature(PolicyModule).parameters
    assert next(iter(sig)) == "model" and list(sig)[-3:] == ["optimizer", "lr_scheduler", "critic"]
    assert sig["loss_agg"].default == "token_mean" and sig["clip_low"].default == 0.2
    assert inspect.signature(DistillModule).parameters["losses"].default == {"reverse_kl_sampled": 1.0}


def test_the_settings_reach_the_config_and_the_flat_record(tiny_model_dir):
    m = PolicyModule(
        str(tiny_model_dir),
        loss_agg="seq_mean_token_sum_norm",
        loss_horizon=7,
        ppo_epochs=2,
        clip_high=0.28,
        seed=3,
    )
    c = m.config
    assert (c.objective.loss_agg, c.objective.loss_horizon, c.objective.clip_high) == (
        "seq_mean_token_sum_norm",
        7,
        0.28,
    )
    assert (c.step.ppo_epochs, c.load.seed, c.precision.dtype) == (2, 3, "float32")
    assert m.hparams["loss_agg"] == "seq_mean_token_sum_norm" and m.hparams["model"] == str(tiny_model_dir)
    assert len(m.hparams) == 1 + sum(len(fields(g)) for g in POLICY_GROUPS)
    m.update_settings(share_prompt_forward=False)
    assert m.config.forward.share_prompt_forward is False and m.hparams["share_prompt_forward"] is False
    assert m.config.objective == c.objective and c.forward.share_prompt_forward is None  # c itself is frozen
    with pytest.raises(ValueError, match=r"^update_settings: dtype take effect only when the model is built"):
        m.update_settings(dtype="float64")


def test_a_misspelt_setting_is_one_line_naming_the_setting(tiny_model_dir):
    with pytest.raises(
        TypeError, match=r"^PolicyModule: unknown setting 'los_agg'; did you mean 'loss_agg'\?$"
    ):
        PolicyModule(str(tiny_model_dir), los_agg="seq_mean_token_mean")
    with pytest.raises(TypeError, match=r"^DistillModule: unknown setting 'los'; did you mean 'losses'"):
        DistillModule(str(tiny_model_dir), los={"jsd": 1.0})
    with pytest.raises(
        TypeError, match=r"^CriticModule: unknown setting 'vf_coeff'; did you mean 'vf_coef'\?$"
    ):
        CriticModule(vf_coeff=0.5)
    with pytest.raises(ValueError, match=r"^head='linear'; valid values: regression, token$"):
        CriticModule(head="linear")


def test_cli_help_lists_loss_agg_once_with_its_doc(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "lit_rl.learners.PolicyModule"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("--model.loss_agg ") == 2  # once in the usage line, once with its doc
    assert (
        "--model.loss_agg {token_mean,seq_mean_token_mean,seq_mean_token_sum,seq_mean_token_sum_norm} "
        "How token losses combine: token_mean (DAPO)" in out
    )
    assert out.count("--model.ppo_epochs PPO_EPOCHS Passes over each Experience.") == 1
