"""Every rollout setting is declared once (``lit_rl.rollout.settings``) and ``RolloutCallback``,
``AgentRolloutCallback``, the pipeline and the CLI's early check all read that one declaration."""

from __future__ import annotations

import inspect
import re
import threading
from dataclasses import fields
from pathlib import Path

import pytest

from lit_rl.callbacks import AgentRolloutCallback, RolloutCallback
from lit_rl.cli import precheck
from lit_rl.core.settings import declared
from lit_rl.rewards.pool import RewardPool
from lit_rl.rollout.agent_loop import AgentLoop
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.pipeline import build_pipeline
from lit_rl.rollout.settings import FilterSettings, RolloutSettings, SyncSettings

GROUPS = (RolloutSettings, FilterSettings, SyncSettings)
LIT_RL = Path(__file__).resolve().parents[1] / "lit_rl"


def _reward(prompt, completion):
    return 0.0


@pytest.mark.parametrize("cls", [RolloutCallback, AgentRolloutCallback])
def test_each_parameter_appears_once_in_the_docstring_with_a_doc(cls):
    names = list(inspect.signature(cls).parameters)
    for name in names:
        lines = [ln for ln in cls.__doc__.splitlines() if ln.startswith(f"        {name}: ")]
        assert len(lines) == 1, (name, lines)
        assert len(lines[0].split(": ", 1)[1].strip()) > 10, name
    # the settings are exactly the groups' fields, in group order, each once (declared() refuses a repeat)
    own = {RolloutCallback: ["engine", "rewards", "pipeline"], AgentRolloutCallback: ["agent"]}[cls]
    assert [n for n in names if n not in own] == list(declared(GROUPS))


def test_signature_defaults_are_the_declarations():
    params = inspect.signature(RolloutCallback).parameters
    for group in GROUPS:
        default = group()
        for f in fields(group):
            assert params[f.name].default == getattr(default, f.name), f.name
    assert (params["group_size"].default, params["max_prompt_len"].default) == (8, 512)
    # the agent callback: the same names and defaults (it used to say group_size 4, max_prompt_len 1024)
    agent = inspect.signature(AgentRolloutCallback).parameters
    assert {n: p.default for n, p in agent.items() if n != "agent"} == {
        n: p.default for n, p in params.items() if n not in ("engine", "rewards", "pipeline")
    }
    # the two single-turn filter settings would do nothing to episodes: refused, naming the setting
    with pytest.raises(ValueError, match=r"^overlong_filter is a single-turn setting"):
        AgentRolloutCallback(AgentLoop(lambda: None, HFEngine()), overlong_filter=True)


def test_a_misspelt_setting_is_one_line_naming_the_setting():
    with pytest.raises(TypeError) as e:
        RolloutCallback(rewards=_reward, group_sise=4)
    assert str(e.value) == "RolloutCallback: unknown setting 'group_sise'; did you mean 'group_size'?"
    with pytest.raises(
        TypeError,
        match=r"^AgentRolloutCallback: unknown setting 'max_prompt_length'; "
        r"did you mean 'max_prompt_len'\?$",
    ):
        AgentRolloutCallback(AgentLoop(lambda: None, HFEngine()), max_prompt_length=9)


def test_a_pipeline_with_a_differing_flat_setting_is_refused_naming_it():
    eng, pool = HFEngine(), RewardPool(_reward)
    pipe = build_pipeline(eng, pool, RolloutSettings(group_size=2), lock=threading.RLock())
    with pytest.raises(
        ValueError,
        match=r"^RolloutCallback: pipeline= carries its own settings, so "
        r"dynamic_sampling, sampling would be ignored; .* drop pipeline=$",
    ):
        RolloutCallback(
            engine=eng, pipeline=pipe, sampling=SamplingConfig(max_new_tokens=3), dynamic_sampling=True
        )
    # at their declared defaults they say nothing, and the sync settings are the callback's own
    rc = RolloutCallback(engine=eng, pipeline=pipe, group_size=8, sampling=SamplingConfig(), sync_every=2)
    assert rc.settings.group_size == 2 and rc.sync.sync_every == 2


def test_group_size_below_one_is_refused_once_with_one_message():
    message = "rollout.group_size must be an integer >= 1, got 0"
    for build in (
        lambda: RolloutSettings(group_size=0),
        lambda: RolloutCallback(rewards=_reward, group_size=0),
        lambda: AgentRolloutCallback(AgentLoop(lambda: None, HFEngine()), group_size=0),
    ):
        with pytest.raises(ValueError) as e:
            build()
        assert str(e.value) == message
    # the rule is written once in the package (core/group_size.py), called by RolloutSettings and the CLI
    holders = sorted(
        str(p.relative_to(LIT_RL))
        for p in LIT_RL.rglob("*.py")
        if re.search(r"group_size\s*<\s*1\b", p.read_text(encoding="utf-8"))
    )
    assert holders == ["core/group_size.py"]


def test_each_setting_is_declared_once_in_the_package():
    """A declaration with a default (``name: type = value``: a parameter or a dataclass field) of each rollout
    setting exists only in rollout/settings.py (it used to be in the callback twice, RolloutConfig, the agent
    callback and the render stage)."""
    for name in (
        "group_size",
        "max_prompt_len",
        "dynamic_sampling",
        "max_resample_tries",
        "overlong_filter",
        "overlong_buffer",
        "overlong_penalty_factor",
        "max_staleness",
        "queue_size",
        "stale_policy",
        "sync_every",
    ):
        pattern = re.compile(rf"(^|[(,])\s*{name}\s*:\s*[\w\[\]. |]*=(?!=)")
        holders = sorted(
            str(p.relative_to(LIT_RL))
            for p in LIT_RL.rglob("*.py")
            if any(pattern.search(ln) for ln in p.read_text(encoding="utf-8").splitlines())
        )
        assert holders == ["rollout/settings.py"], name


def test_bad_values_name_the_field():
    cases = [
        (
            lambda: RolloutSettings(overlong_prompts="cut"),
            r"^overlong_prompts='cut'; valid values: truncate, drop, error$",
        ),
        (lambda: SyncSettings(mode="asynch"), r"^mode='asynch'; valid values: sync, async$"),
        (lambda: SyncSettings(sync_every=0), r"^sync_every must be >= 1, got 0$"),
        (lambda: FilterSettings(overlong_penalty_factor=-1.0), r"^overlong_penalty_factor must be >= 0"),
        (lambda: RolloutSettings(max_prompt_len=0), r"^max_prompt_len must be >= 1, got 0$"),
    ]
    for build, message in cases:
        with pytest.raises(ValueError, match=message):
            build()


def test_the_cli_precheck_reads_the_same_declarations():
    params, takes_kwargs = precheck.signature(*precheck.SECTIONS["rollout"])
    assert not takes_kwargs  # unknown keys are checked against the groups' fields
    assert sorted(params) == sorted(inspect.signature(RolloutCallback).parameters)
    assert params["group_size"][0] == 8 and params["overlong_penalty_factor"][0] == 1.0
    assert precheck.section_keys("rollout.sampling") == sorted(f.name for f in fields(SamplingConfig))


def test_help_shows_each_doc_once():
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser()
    parser.add_class_arguments(
        RolloutCallback, "rollout", fail_untyped=False, instantiate=False, sub_configs=True
    )
    text = parser.format_help()
    assert text.count("Completions per prompt (G).") == 1
    assert "--rollout.group_size GROUP_SIZE" in text and "--rollout.sampling.max_new_tokens" in text
    assert text.count("Completion budget (tokens).") == 1  # SamplingConfig's field doc, nested
