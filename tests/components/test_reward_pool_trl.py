"""RewardPool with TRL's reward forms (no model): signature detection, async rewards (gathered, timed out),
log_extra / log_metric, TRL's weight list, the per-component failure rule and unscored rows."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from lit_rl.data.prompts import Prompt
from lit_rl.rewards import RewardErrorWarning, RewardFailureError, RewardPool, TrainerState

pytestmark = pytest.mark.filterwarnings("ignore::lit_rl.rewards.RewardErrorWarning")


def P(ans, **meta):
    return Prompt(prompt="q", answer=ans, metadata=meta)


def test_any_subset_of_trl_arguments_is_called_trl_style():
    def by_ids(completion_ids, **kwargs):  # TRL's Example 1: no completions parameter
        return [float(len(ids)) for ids in completion_ids]

    def by_column(level, **kwargs):  # only a dataset column
        return [float(lv) for lv in level]

    def anything(**kwargs):
        return [float(len(kwargs["completions"]))] * len(kwargs["completions"])

    def by_state(trainer_state, completions):
        return [float(trainer_state.max_steps)] * len(completions)

    pool = RewardPool({"ids": by_ids, "col": by_column, "any": anything, "state": by_state})
    pool.trainer_state = TrainerState(global_step=3, max_steps=10)
    rb = pool.score([P("1", level=2), P("1", level=5)], ["ab", "c"], completion_ids=[[1, 2, 3], [4]])
    assert rb.components["ids"].tolist() == [3.0, 1.0]
    assert rb.components["col"].tolist() == [2.0, 5.0]
    assert rb.components["any"].tolist() == [2.0, 2.0]
    assert rb.components["state"].tolist() == [10.0, 10.0]
    assert rb.total.tolist() == [17.0, 18.0]


def test_per_row_functions_and_refusals_stay_as_they_were():
    def row(prompt, completion, **kwargs):  # fits fn(prompt, completion): per row
        return float(len(completion))

    assert RewardPool({"row": row}).score([P("1")] * 2, ["ab", "c"]).total.tolist() == [2.0, 1.0]
    with pytest.raises(TypeError, match=r"reward 'one' has signature \(completion\)"):
        RewardPool({"one": lambda completion: 1.0})
    with pytest.raises(TypeError, match=r"reward 'pos' has positional-only parameters \['completions'\]"):
        RewardPool({"pos": lambda completions, /, **kw: [1.0]})

    async def per_row(prompt, completion):
        return 1.0

    with pytest.raises(TypeError, match=r"reward 'arow' is an async per-row function"):
        RewardPool({"arow": per_row})


def test_async_rewards_run_concurrently_and_each_under_the_timeout():
    async def slow_a(completions, **kwargs):
        await asyncio.sleep(0.4)
        return [1.0] * len(completions)

    async def slow_b(completions, **kwargs):
        await asyncio.sleep(0.4)
        return [2.0] * len(completions)

    pool = RewardPool({"a": slow_a, "b": slow_b, "sync": lambda prompt, completion: 4.0})
    t0 = time.monotonic()
    rb = pool.score([P("1")] * 3, ["x", "y", "z"])
    took = time.monotonic() - t0
    assert rb.total.tolist() == [7.0] * 3 and rb.valid.all()
    assert took < 0.7  # gathered: 0.4 s, not 0.8 s one after the other

    async def hangs(completions, **kwargs):
        await asyncio.sleep(30)

    slow = RewardPool({"a": slow_a, "hang": hangs}, timeout_s=0.6, max_invalid_frac=None)
    t0 = time.monotonic()
    rb = slow.score([P("1")] * 2, ["x", "y"])
    assert time.monotonic() - t0 < 1.5
    assert rb.total.tolist() == [1.0, 1.0] and rb.valid.all()  # a's component carries the rows
    assert rb.extras == [{"hang/error": "timed out after 0.6s"}] * 2
    assert rb.metrics["reward/hang/errors"] == 2.0 and rb.metrics["reward/timeouts"] == 2.0
    # with the default max_invalid_frac a reward failing on every row of a call stops the run
    with pytest.raises(
        RewardFailureError,
        match=r"reward 'hang' failed on all 2 rows of this scoring call\. "
        r"Most frequent error \(2x\): hang: timed out after 0\.6s",
    ):
        RewardPool({"a": slow_a, "hang": hangs}, timeout_s=0.6).score([P("1")] * 2, ["x", "y"])


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_log_extra_and_log_metric(executor):
    def judged(completions, answer, log_extra=None, log_metric=None, **kwargs):
        scores = [float(c == a) for c, a in zip(completions, answer)]
        log_extra("gold", list(answer))
        log_metric("acc", sum(scores) / len(scores))
        log_metric("acc", 0.0)  # two values in one call: the step's mean
        return scores

    pool = RewardPool({"j": judged}, executor=executor)
    rb = pool.score([P("1"), P("2"), P("3"), P("4")], ["1", "2", "x", "y"])
    pool.close()
    assert rb.extras == [{"gold": "1"}, {"gold": "2"}, {"gold": "3"}, {"gold": "4"}]
    assert rb.metrics["reward/j/acc"] == 0.25  # (0.5 + 0.0) / 2


def test_wrong_log_extra_length_fails_that_reward_only():
    def bad_log(completions, log_extra, **kwargs):
        log_extra("col", [1])
        return [1.0] * len(completions)

    rb = RewardPool({"bad": bad_log, "ok": lambda prompt, completion: 1.0}, max_invalid_frac=None).score(
        [P("1")] * 2, ["a", "b"]
    )
    assert rb.valid.all() and rb.total.tolist() == [1.0, 1.0]
    assert rb.extras[0]["bad/error"] == (
        "ValueError: log_extra('col'): 1 values for 2 completions; give one value per completion"
    )


def test_trl_weight_list_in_reward_order_and_its_errors():
    rewards = {"a": lambda prompt, completion: 1.0, "b": lambda prompt, completion: 10.0}
    assert RewardPool(rewards, weights=[0.5, 0.01]).score([P("1")], ["x"]).total.tolist() == [0.6]
    with pytest.raises(ValueError, match=r"weights has 3 entries but there are 2 rewards \(a, b\)"):
        RewardPool(rewards, weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"weights must be finite numbers, got \{'b': nan\}"):
        RewardPool(rewards, weights=[1.0, math.nan])


def test_per_component_failure_rule():
    """Rows: 0 all fine; 1 'a' fails (b carries it); 2 both fail (infra error); 3 a fails, b None (infra error);
    4 only the weight-0 reward scores (no reward); 5 every reward None (unscored, not a failure)."""

    def a(prompt, completion):
        if completion in ("1", "2", "3"):
            raise RuntimeError("a down")
        return None if completion in ("4", "5") else 1.0

    def b(prompt, completion):
        if completion == "2":
            raise RuntimeError("b down")
        return None if completion in ("3", "4", "5") else 10.0

    def zero(prompt, completion):
        return None if completion == "5" else 100.0

    pool = RewardPool({"a": a, "b": b, "zero": zero}, weights={"a": 2.0, "zero": 0.0}, max_invalid_frac=None)
    rb = pool.score([P("1")] * 6, ["0", "1", "2", "3", "4", "5"])
    assert rb.valid.tolist() == [True, True, False, False, False, False]
    assert rb.total[:2].tolist() == [12.0, 10.0] and all(math.isnan(x) for x in rb.total[2:].tolist())
    assert rb.errors == [
        None,
        None,
        "a: RuntimeError: a down",
        "a: RuntimeError: a down",
        "only rewards with weight 0 scored this row",
        "no reward applies to this row (every reward returned None)",
    ]
    assert rb.extras[1] == {"a/error": "RuntimeError: a down"}
    m = rb.metrics
    assert (m["reward/a/errors"], m["reward/b/errors"], m["reward/zero/errors"]) == (3.0, 1.0, 0.0)
    assert (
        m["reward/none_rows"] == 1.0 and m["reward/invalid_frac"] == 4 / 6 and m["reward/infra_errors"] == 4.0
    )


def test_every_row_none_does_not_raise_and_is_not_a_failure():
    pool = RewardPool({"never": lambda completions, **kw: [None] * len(completions)}, window=1)
    for _ in range(3):  # the window is full after one call: a failure count would raise here
        rb = pool.score([P("1")] * 4, ["a", "b", "c", "d"])
    assert not rb.valid.any() and rb.metrics["reward/none_rows"] == 4.0
    assert rb.metrics["reward/never/none_frac"] == 1.0 and rb.metrics["reward/infra_errors"] == 0.0


def test_a_component_failing_over_the_window_stops_the_run_although_rows_stay_valid():
    def flaky(prompt, completion):
        if completion != "ok":
            raise ValueError("no judge")
        return 1.0

    pool = RewardPool({"flaky": flaky, "fmt": lambda prompt, completion: 0.5}, max_invalid_frac=0.5, window=2)
    pool.score([P("1")] * 4, ["ok", "ok", "x", "y"])  # 2/4 failed: at the limit, and the window is not full
    with (
        pytest.warns(RewardErrorWarning, match="reward calls failed on rows that other rewards scored"),
        pytest.raises(
            RewardFailureError,
            match=r"reward 'flaky' failed on 5/8 rows \(62%\) of the last 2 "
            r"scoring calls",
        ),
    ):
        pool.score([P("1")] * 4, ["ok", "x", "y", "z"])


def test_other_awaitable_forms_are_awaited():
    class Judge:  # a callable object with an async __call__, as a client class would be
        async def __call__(self, completions, **kwargs):
            await asyncio.sleep(0)
            return [3.0] * len(completions)

    async def score(completions):
        return [5.0] * len(completions)

    def wrapper(completions, **kwargs):  # a sync function handing back a coroutine
        return score(completions)

    rb = RewardPool({"obj": Judge(), "wrapped": wrapper}).score([P("1")] * 2, ["a", "b"])
    assert rb.total.tolist() == [8.0, 8.0] and rb.valid.all()


def test_trainer_state_from_a_run_without_max_steps():
    from types import SimpleNamespace

    # the Lightning Trainer attributes from_trainer reads: 3 epochs of 4 batches, no max_steps
    trainer = SimpleNamespace(
        max_steps=-1,
        max_epochs=3,
        num_training_batches=4,
        current_epoch=1,
        global_step=6,
        estimated_stepping_batches=12,
    )
    st = TrainerState.from_trainer(trainer, batch_idx=2, log_history=({"step": 5},))
    assert (st.global_step, st.max_steps, st.epoch, st.num_train_epochs) == (6, 12, 1.5, 3)
    assert st.log_history == ({"step": 5},)
    steps_only = SimpleNamespace(
        max_steps=10,
        max_epochs=-1,
        num_training_batches=4,
        current_epoch=0,
        global_step=0,
        estimated_stepping_batches=float("inf"),
    )
    assert TrainerState.from_trainer(steps_only).num_train_epochs == 3  # ceil(10 / 4)
