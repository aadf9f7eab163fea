"""The one ``ExperienceBuilder``: the episode layout and teacher rollouts go through ``pack`` and get the run's
horizon from the builder (no caller patches it afterwards); a teacher's views of student rows are built here too
(``reprompted``, ``pack`` with the rows' own versions), and no module outside ``rollout/build.py`` constructs an
Experience."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lit_rl.callbacks.teachers import _pack
from lit_rl.data.prompts import Prompt
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.agent_loop import AgentLoop, Episode, Turn
from lit_rl.rollout.build import ExperienceBuilder, Rows, reprompted
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.rollouts import Rollouts


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class _Engine:
    tokenizer, policy_version = _Tok(), 5


def test_pack_actions_observations_logprobs_token_rewards():
    rows = Rows(
        prompt_ids=[[1, 2], [3]],
        completion_ids=[[10, 11, 12], [13]],
        prompts=[Prompt(prompt="a")] * 2,
        rewards=torch.tensor([1.0, float("nan")], dtype=torch.float64),
        valid=torch.tensor([True, False]),
        logprobs=[[-0.5, 0.0, -0.25], [-1.0]],
        action_masks=[[True, False, True], [True]],
        token_rewards=[torch.tensor([0.5, 0.0, 0.0]), torch.tensor([0.0])],
    )
    exp = ExperienceBuilder(horizon=9).pack(rows, pad_id=0, group_ids=torch.tensor([4, 4]), policy_version=2)
    assert exp.input_ids.tolist() == [[1, 2, 10, 11, 12], [0, 3, 13, 0, 0]]
    assert exp.loss_mask.tolist() == [[True, False, True], [True, False, False]]
    assert exp.extras["obs_mask"].tolist() == [[False, True, False], [False, False, False]]
    assert exp.rollout_logprobs.tolist() == [[-0.5, 0.0, -0.25], [-1.0, 0.0, 0.0]]
    assert exp.token_rewards.tolist() == [[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert exp.rewards.dtype == torch.float32 and exp.policy_version.tolist() == [2, 2] and exp.horizon == 9


def test_teacher_rollouts_carry_the_horizon_and_no_rollout_logprobs():
    class Tok:
        pad_token_id = 0

    exp = _pack(
        Tok(),
        [[1], [2, 3]],
        [[4, 5], []],
        [Prompt(prompt="a", domain="x")] * 2,
        torch.tensor([1.0, 1.0]),
        horizon=7,
    )
    assert exp.horizon == 7 and exp.rollout_logprobs is None and exp.group_ids.tolist() == [0, 1]
    assert (
        exp.valid.tolist() == [True, True]
        and exp.domains == ["x", "x"]
        and exp.policy_version.tolist() == [0, 0]
    )


def test_agent_build_stage_horizon_group_ids_and_reward_errors():
    loop = AgentLoop(lambda: None, _Engine(), max_turns=3)
    ep = Episode(
        [1, 2],
        [Turn([7, 8], [-0.5, -0.5], "a", [9], "o", 1.0), Turn([6], [-0.25], "b", [], "", 2.0)],
        done=True,
    )
    rb = RewardBatch(torch.tensor([3.0]), torch.tensor([True]), {}, [None], {})
    build = loop.experience_builder(SamplingConfig(max_new_tokens=4))
    exp = build(Rollouts([Prompt(prompt="p")], [[1, 2]], [[ep]], rb), pad_id=0)
    assert exp.horizon == 12 and exp.policy_version.tolist() == [5] and exp.reward_errors == [None]
    assert exp.rewards.tolist() == [2.0] and exp.token_rewards[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert exp.loss_mask[0].tolist() == [True, True, False, True] and exp.group_ids.tolist() == [0]
    assert build(
        Rollouts([Prompt(prompt="p")], [[1, 2]], [[ep]], rb), pad_id=0, count=False
    ).group_ids.tolist() == [0]
    assert build(Rollouts([Prompt(prompt="p")], [[1, 2]], [[ep]], rb), pad_id=0).group_ids.tolist() == [1]


def test_reprompted_replaces_the_prompt_columns_and_keeps_the_completion_columns():
    rows = Rows(
        prompt_ids=[[1, 2], [3]],
        completion_ids=[[10, 11], [12]],
        prompts=[Prompt(prompt="a")] * 2,
        rewards=torch.tensor([1.0, 0.0]),
        logprobs=[[-0.5, -0.25], [-1.0]],
    )
    exp = ExperienceBuilder().pack(rows, pad_id=0, group_ids=torch.tensor([3, 3]), policy_version=4)
    view = reprompted(exp, [[7], [8, 9, 6]], pad_id=0)
    assert view.prompt_len == 3
    assert view.input_ids.tolist() == [[0, 0, 7, 10, 11], [8, 9, 6, 12, 0]]
    assert view.attention_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert view.loss_mask.tolist() == [[True, True], [True, False]]
    assert view.rollout_logprobs.tolist() == [[-0.5, -0.25], [-1.0, 0.0]]
    assert view.group_ids.tolist() == [3, 3] and view.policy_version.tolist() == [4, 4]


def test_pack_takes_the_per_row_versions_of_rows_built_before():
    rows = Rows(
        prompt_ids=[[1], [2]],
        completion_ids=[[3], [4]],
        prompts=[Prompt(prompt="a")] * 2,
        rewards=torch.tensor([1.0, 0.0]),
    )
    exp = ExperienceBuilder().pack(
        rows, pad_id=0, group_ids=torch.arange(2), policy_version=torch.tensor([2, 5])
    )
    assert exp.policy_version.tolist() == [2, 5] and exp.policy_version.dtype == torch.long


def test_no_experience_is_constructed_outside_the_builder():
    """``Experience(`` appears only in ``rollout/build.py`` and in the dataclass's own copies (select / to /
    trim in ``data/experience.py``)."""
    pkg = Path(__file__).resolve().parents[2] / "lit_rl"
    found = sorted(
        str(f.relative_to(pkg))
        for f in pkg.rglob("*.py")
        if re.search(r"(?<![\w.])Experience\(", f.read_text())
    )
    assert found == ["data/experience.py", "rollout/build.py"]
