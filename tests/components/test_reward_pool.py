import math
import time

import pytest

from lit_rl.data.prompts import Prompt
from lit_rl.rewards import ExactAnswerReward, PrefixMatchReward, RewardPool, RewardResult


def P(ans):
    return Prompt(prompt="q", answer=ans)


def test_weighted_components_and_metrics():
    pool = RewardPool({"exact": ExactAnswerReward(), "prefix": PrefixMatchReward()}, weights={"prefix": 0.5})
    rb = pool.score([P("12"), P("12"), P("7")], ["12", "13", "x"])
    assert rb.components["exact"].tolist() == [1.0, 0.0, 0.0]
    assert rb.components["prefix"].tolist() == [1.0, 0.5, 0.0]
    assert rb.total.tolist() == [1.5, 0.25, 0.0]
    assert rb.valid.tolist() == [True, True, True]
    assert rb.metrics["reward/exact"] == pytest.approx(1 / 3, rel=1e-12)
    assert rb.metrics["reward/infra_errors"] == 0.0


@pytest.mark.filterwarnings("ignore::lit_rl.rewards.RewardErrorWarning")
def test_crash_non_number_and_not_ok_are_masked_and_counted():
    def flaky(prompt, completion):
        if completion == "boom":
            raise RuntimeError("verifier crashed")
        if completion == "str":
            return "1.0"
        if completion == "nan":
            return float("nan")
        if completion == "down":
            return RewardResult(0.0, ok=False)
        return 1.0

    pool = RewardPool(flaky)
    rb = pool.score([P("a")] * 5, ["ok", "boom", "str", "nan", "down"])
    assert rb.valid.tolist() == [True, False, False, False, False]
    assert rb.total[0] == 1.0 and all(math.isnan(x) for x in rb.total[1:].tolist())
    assert rb.metrics["reward/infra_errors"] == 4.0
    assert "verifier crashed" in rb.errors[1] and "str" in rb.errors[2]


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_hanging_reward_is_cut_at_timeout(executor):
    def slow(prompt, completion):
        if completion == "hang":
            time.sleep(30)
        return 1.0

    pool = RewardPool({"slow": slow}, timeout_s=0.5, num_workers=2, executor=executor)
    t0 = time.monotonic()
    rb = pool.score([P("a")] * 3, ["ok", "hang", "ok"])
    took = time.monotonic() - t0
    pool.close()
    assert took < 0.5 + 1.0
    assert rb.valid.tolist() == [True, False, True]
    assert rb.metrics["reward/timeouts"] == 1.0
    # the pool keeps working after a timeout
    pool2 = RewardPool({"slow": slow}, timeout_s=0.5, executor=executor)
    assert pool2.score([P("a")], ["ok"]).valid.tolist() == [True]
    pool2.close()


def test_construction_errors_name_the_field():
    with pytest.raises(ValueError, match="executor"):
        RewardPool(ExactAnswerReward(), executor="gpu")
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool(ExactAnswerReward(), timeout_s=0)
    with pytest.raises(ValueError, match="weights name unknown"):
        RewardPool({"a": ExactAnswerReward()}, weights={"b": 1.0})
    with pytest.raises(TypeError, match="not callable"):
        RewardPool({"a": 3})
