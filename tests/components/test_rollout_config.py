"""``RolloutCallback(engine, pipeline, ...)``: the flat settings become the rollout settings groups and
``build_pipeline`` builds the stages; a pipeline can be handed in instead (the agent path is one, with no
reward pool)."""

from __future__ import annotations

import threading

import pytest

from lit_rl.callbacks import AgentRolloutCallback, RolloutCallback
from lit_rl.rewards.pool import RewardPool
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.pipeline import build_pipeline
from lit_rl.rollout.settings import FilterSettings, RolloutSettings, SyncSettings


def _reward(prompt, completion):
    return 0.0


def test_flat_settings_build_the_pipeline_the_config_describes():
    rc = RolloutCallback(
        rewards=_reward,
        group_size=4,
        sampling=SamplingConfig(max_new_tokens=16),
        max_prompt_len=64,
        overlong_prompts="drop",
        dynamic_sampling=True,
        max_resample_tries=5,
        overlong_filter=True,
        overlong_buffer=4,
        overlong_penalty_factor=0.5,
        seed=3,
    )
    p = rc.pipeline
    assert rc.settings == RolloutSettings(
        group_size=4,
        sampling=SamplingConfig(max_new_tokens=16),
        max_prompt_len=64,
        overlong_prompts="drop",
        seed=3,
    )
    assert rc.filters == FilterSettings(
        dynamic_sampling=True,
        max_resample_tries=5,
        overlong_filter=True,
        overlong_buffer=4,
        overlong_penalty_factor=0.5,
    )
    assert rc.sync == SyncSettings()
    assert (p.render.max_prompt_len, p.render.overlong, p.render.max_new_tokens) == (64, "drop", 16)
    assert (p.refill.settings.group_size, p.refill.max_resample_tries, p.refill.seed) == (4, 5, 3)
    assert (p.score.shaping.buffer, p.score.shaping.factor, p.score.rewards) == (4, 0.5, rc.rewards)
    # one settings object: the pipeline and its generate stage hold the callback's own
    assert p.build.horizon == 16 and p.filters is rc.filters
    assert p.settings is rc.settings and p.generate.settings is rc.settings
    assert p.generate.lock is rc.engine_lock and p.generate.engine is rc.engine
    assert set(rc.state_dict()) == {
        "last_sync_step",
        "counters",
        "next_group",
        "policy_version",
        "async",
        "engine",
        "engine_ranks",
    }


def test_a_handed_pipeline_is_used_as_is():
    eng, lock = HFEngine(), threading.RLock()
    pool = RewardPool(_reward)
    settings = RolloutSettings(group_size=2, sampling=SamplingConfig(max_new_tokens=3))
    pipe = build_pipeline(eng, pool, settings, lock=lock)
    rc = RolloutCallback(engine=eng, pipeline=pipe)
    assert rc.pipeline is pipe and rc.engine_lock is lock and rc.rewards is pool
    assert rc.settings is settings and rc.filters == FilterSettings()
    pipe.build.next_group, pipe.render.counters["prompts_dropped"] = (
        7,
        2,
    )  # each stage's state, through the pipeline
    state = rc.state_dict()
    assert (state["next_group"], state["counters"]["prompts_dropped"]) == (7, 2)
    other = RolloutCallback(
        engine=eng, pipeline=build_pipeline(eng, pool, RolloutSettings(group_size=2), lock=lock)
    )
    other.load_state_dict(state)
    assert other.pipeline.build.next_group == 7 and other.pipeline.render.counters["prompts_dropped"] == 2
    with pytest.raises(ValueError, match="so max_prompt_len, overlong_filter would be ignored"):
        RolloutCallback(engine=eng, pipeline=pipe, max_prompt_len=7, overlong_filter=True)
    with pytest.raises(ValueError, match="so group_size would be ignored"):  # even equal to the pipeline's 2
        RolloutCallback(engine=eng, pipeline=pipe, group_size=2)
    assert RolloutCallback(engine=eng, pipeline=pipe, group_size=8, sync_every=3).weight_sync.sync_every == 3
    with pytest.raises(ValueError, match="not the engine the pipeline generates with"):
        RolloutCallback(engine=HFEngine(), pipeline=pipe)


def test_the_agent_path_is_a_pipeline_without_a_reward_pool():
    loop = AgentLoop(lambda: None, HFEngine(), max_turns=2)
    rc = AgentRolloutCallback(
        loop, group_size=2, sampling=SamplingConfig(max_new_tokens=5), max_prompt_len=99
    )
    assert rc.rewards is None and isinstance(rc.pipeline.score, EnvRewards) and rc.engine is loop.engine
    assert rc.pipeline.build.horizon == 10 and rc.pipeline.render.max_prompt_len == 99
    assert rc.pipeline.generate.lock is rc.engine_lock
