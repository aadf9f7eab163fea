"""Rewards work through the default RewardPool and fail loudly: error texts, warnings, the invalid-fraction stop,
TRL-style functions adapted or refused at construction."""

import math
import threading
import warnings

import pytest

from lit_rl.data.prompts import Prompt
from lit_rl.rewards import (
    CodeTestsReward,
    ExactAnswerReward,
    MathAnswerReward,
    PrefixMatchReward,
    RegexFormatReward,
    RewardErrorWarning,
    RewardFailureError,
    RewardModelReward,
    RewardPool,
    RewardResult,
)


def P(ans, **meta):
    return Prompt(prompt="q", answer=ans, metadata=meta)


def _score(reward, prompts, texts):
    """Through the default pool configuration, exactly as a YAML `rewards: {x: {class_path: ...}}` builds it."""
    pool = RewardPool({"r": reward})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error", RewardErrorWarning
            )  # a built-in reward must not fail on good input
            rb = pool.score(prompts, texts)
    finally:
        pool.close()
    return pool.executor, rb


# ------------------------------------------------------------- every built-in reward, default pool
def test_math_answer_reward_under_the_default_pool_scores_every_row():
    executor, rb = _score(
        MathAnswerReward(),
        [P("1/2"), P("1/2"), P("\\sqrt{4}"), P("3")],
        ["so \\boxed{0.5}", "\\boxed{\\frac{2}{4}}", "the answer is $2$", "it is 4"],
    )
    assert executor == "process"  # declared by MathAnswerReward, picked by executor="auto"
    assert rb.total.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert rb.valid.all() and rb.errors == [None] * 4


def test_math_answer_reward_also_works_on_a_thread_executor():
    # Before the fix every row was "ValueError: Math-Verify ... doesn't support threaded environment".
    pool = RewardPool({"math": MathAnswerReward(timeout_s=2)}, executor="thread")
    rb = pool.score([P("1/2"), P("3")], ["\\boxed{0.5}", "4"])
    assert rb.total.tolist() == [1.0, 0.0] and rb.errors == [None, None]


def test_math_answer_reward_keeps_its_own_timeout_in_the_main_thread():
    r = MathAnswerReward(timeout_s=1.5)
    assert threading.current_thread() is threading.main_thread()
    assert r._limits() == ({"parsing_timeout": 2}, {"timeout_seconds": 2})  # whole seconds, rounded up
    assert r(P("7"), "7").score == 1.0


def test_exact_prefix_regex_under_the_default_pool():
    prompts, texts = [P("12"), P("12"), P("7")], ["12", "13", "x7"]
    assert _score(ExactAnswerReward(), prompts, texts)[1].total.tolist() == [1.0, 0.0, 0.0]
    assert _score(PrefixMatchReward(), prompts, texts)[1].total.tolist() == [1.0, 0.5, 0.0]
    ex, rb = _score(RegexFormatReward(), prompts, texts)
    assert ex == "thread" and rb.total.tolist() == [1.0, 1.0, 0.0]


def test_code_tests_reward_under_the_default_pool():
    tests = [{"call": "add", "args": [2, 3], "expected": 5}, {"call": "add", "args": [1, 1], "expected": 2}]
    good, bad = "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return 5\n"  # bad passes 1 of 2
    rb = _score(CodeTestsReward("partial", timeout_s=5.0), [P(None, tests=tests)] * 2, [good, bad])[1]
    assert rb.total.tolist() == [1.0, 0.5]


def test_reward_model_reward_under_the_default_pool(tiny_model_dir):
    rm = RewardModelReward(str(tiny_model_dir))
    prompts = [Prompt(prompt="1+2="), Prompt(prompt="3+4=")]
    rb = _score(rm, prompts, ["3", "9"])[1]
    assert rb.valid.all()
    assert rb.total.tolist() == pytest.approx(rm.score_batch(prompts, ["3", "9"]), abs=1e-6)


# ------------------------------------------------------------- loud failures
def test_each_failing_row_keeps_its_error_type_and_message():
    def flaky(prompt, completion):
        if completion == "boom":
            raise ZeroDivisionError("x" * 1000)
        if completion == "str":
            return "1.0"
        if completion == "down":
            return RewardResult(0.0, ok=False, info={"infra_errors": 1.0})
        if completion == "why":
            return RewardResult(0.0, ok=False, error="service said 503")
        return 1.0

    pool = RewardPool({"flaky": flaky}, max_error_chars=60, max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning) as rec:
        rb = pool.score([P("a")] * 6, ["ok", "boom", "str", "down", "why", "ok"])
    assert rb.errors[0] is None and rb.errors[5] is None
    assert rb.errors[1] == "flaky: ZeroDivisionError: " + "x" * 31 + "..."  # cut to 60 characters
    assert len(rb.errors[1]) == 60
    assert rb.errors[2].startswith("flaky: TypeError: reward function returned str '1.0'")
    assert rb.errors[3] == "flaky: reward reported ok=False (infra_errors=1)"
    assert rb.errors[4] == "flaky: service said 503"
    assert rb.metrics["reward/invalid_frac"] == pytest.approx(4 / 6, rel=1e-12)
    # one warning for the call, naming the reward and quoting the first 3 errors (not the 4th)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "4/6 rows have no reward" in msg and "row 1: flaky: ZeroDivisionError" in msg
    assert "row 3: flaky: reward reported" in msg and "row 4" not in msg


def test_missing_answer_and_gold_parse_errors_are_quoted():
    pool = RewardPool({"exact": ExactAnswerReward(), "math": MathAnswerReward()}, max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning):
        rb = pool.score(
            [Prompt(prompt="q", uid="p7"), P("\\")], ["1", "1"]
        )  # a lone backslash does not parse
    pool.close()
    assert rb.errors[0] == "exact: ValueError: prompt 'p7' has no 'answer' to verify against"
    # row 1: exact scored it (0.0), so only math's component is left out; its error travels in the row's extras
    assert rb.errors[1] is None and rb.valid.tolist() == [False, True] and rb.total[1] == 0.0
    assert rb.extras[1] == {"math/error": "gold answer '\\\\' did not parse with math-verify"}
    assert rb.metrics["reward/math/errors"] == 2.0 and rb.metrics["reward/exact/errors"] == 1.0


def test_a_hung_process_reward_row_says_timed_out():
    import time

    def slow(prompt, completion):
        time.sleep(30)

    pool = RewardPool({"slow": slow}, timeout_s=0.3, executor="process", max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning):
        rb = pool.score([P("a")], ["x"])
    pool.close()
    assert rb.errors == ["slow: timed out after 0.3s"]


def test_invalid_fraction_over_the_window_stops_with_the_most_frequent_error():
    def half_broken(prompt, completion):
        if completion.startswith("bad"):
            raise KeyError("answer_field")
        if completion == "odd":
            raise ValueError("rare")
        return 1.0

    pool = RewardPool({"hb": half_broken}, max_invalid_frac=0.5, window=3, warn_rows=0)
    texts = ["bad", "bad", "odd", "ok"]  # 3 of 4 invalid in every call
    pool.score([P("a")] * 4, texts)
    pool.score([P("a")] * 4, texts)  # window not full yet: no decision before 3 calls
    with pytest.raises(RewardFailureError) as e:
        pool.score([P("a")] * 4, texts)
    msg = str(e.value)
    assert "9/12 rows (75%) of the last 3 scoring calls" in msg
    assert "Most frequent error (6x): hb: KeyError: 'answer_field'" in msg
    assert "max_invalid_frac=0.5" in msg


def test_invalid_fraction_at_or_below_the_limit_keeps_going():
    def f(prompt, completion):
        if completion == "bad":
            raise RuntimeError("x")
        return 0.0

    pool = RewardPool(f, max_invalid_frac=0.5, window=2, warn_rows=0)
    for _ in range(5):
        pool.score([P("a")] * 4, ["bad", "bad", "ok", "ok"])  # exactly 50 %: not more than the limit
    never = RewardPool(f, max_invalid_frac=None, window=1, warn_rows=0)  # not even a call without any reward
    for _ in range(3):
        assert not never.score([P("a")], ["bad"]).valid.any()


def test_window_is_a_sliding_window():
    def f(prompt, completion):
        if completion == "bad":
            raise RuntimeError("x")
        return 0.0

    pool = RewardPool(f, max_invalid_frac=0.5, window=2, warn_rows=0)
    pool.score([P("a")] * 4, ["ok"] * 4)
    pool.score([P("a")] * 4, ["bad", "bad", "bad", "ok"])  # window: 3 of 8: fine
    with pytest.raises(RewardFailureError, match="6/8 rows"):  # the good call slid out
        pool.score([P("a")] * 4, ["bad", "bad", "bad", "ok"])


def test_a_call_where_no_row_has_a_reward_stops_at_once():
    """Issue 26: a reward failing on every row ended a 2-step run rc 0 (window 5 never filled)."""

    def broken(prompt, completion):
        raise KeyError("solution")

    pool = RewardPool({"broken": broken}, window=5, warn_rows=0)
    with pytest.raises(
        RewardFailureError,
        match=r"none of the 3 rows of this scoring call has a reward. Most "
        r"frequent error \(3x\): broken: KeyError: 'solution'",
    ):
        pool.score([P("a")] * 3, ["x", "y", "z"])


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_invalid_frac", 1.0),
        ("max_invalid_frac", -0.1),
        ("max_invalid_frac", math.nan),
        ("window", 0),
        ("max_error_chars", 5),
        ("warn_rows", -1),
    ],
)
def test_new_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        RewardPool(ExactAnswerReward(), **{field: value})


# ------------------------------------------------------------- TRL-style functions
def test_trl_style_function_is_adapted_with_columns():
    seen = {}

    def accuracy(prompts, completions, answer, **kwargs):
        seen.update(prompts=prompts, kwargs=sorted(kwargs))
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    pool = RewardPool(accuracy)
    rb = pool.score([P("3", level=2), P("4", level=1)], ["3", " 5"])
    assert rb.total.tolist() == [1.0, 0.0] and rb.valid.all()
    assert seen["prompts"] == ["q", "q"]
    assert seen["kwargs"] == ["domain", "level", "log_extra", "log_metric", "trainer_state", "uid"]


def test_trl_style_chat_prompts_get_message_lists_and_none_is_not_applicable():
    def fmt(prompts, completions, **kwargs):
        return [
            None if p[0]["content"] == "skip" else float(len(c[0]["content"]))
            for p, c in zip(prompts, completions)
        ]

    chat = [
        Prompt(messages=[{"role": "user", "content": "hi"}]),
        Prompt(messages=[{"role": "user", "content": "skip"}]),
    ]
    pool = RewardPool(
        {"fmt": fmt, "one": lambda prompt, completion: 1.0}, weights={"fmt": 2.0}, max_invalid_frac=None
    )
    rb = pool.score(chat, ["abc", "abc"])
    # row 1: fmt does not apply, so its total is the other reward alone (TRL's nansum), and the row is valid
    assert rb.total.tolist() == [7.0, 1.0] and rb.valid.all() and rb.errors == [None, None]
    assert rb.metrics["reward/fmt/none_frac"] == 0.5
    alone = RewardPool({"fmt": fmt}, max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning):
        rb = alone.score(chat, ["abc", "abc"])
    assert rb.valid.tolist() == [True, False]  # no reward applies: no reward, never a silent 0
    assert rb.errors[1] == "no reward applies to this row (every reward returned None)"


def test_trl_style_function_without_kwargs_gets_only_what_it_names():
    def only_completions(completions):
        return [1.0 for _ in completions]

    assert RewardPool(only_completions).score([P("1")], ["x"]).total.tolist() == [1.0]


def test_wrong_signatures_are_refused_when_the_pool_is_built():
    def one_arg(completion):
        return 1.0

    with pytest.raises(TypeError) as e:
        RewardPool({"one": one_arg})
    msg = str(e.value)
    assert "reward 'one' has signature (completion)" in msg
    assert "fn(prompt, completion) -> float | RewardResult" in msg
    assert "fn(prompts, completions, **kwargs) -> list[float] (one call per batch)" in msg
    with pytest.raises(TypeError, match="reward 'three'"):
        RewardPool({"three": lambda a, b, c: 1.0})


def test_a_per_row_function_returning_a_list_points_at_the_trl_signature():
    pool = RewardPool({"batched": lambda prompt, completion: [1.0]}, max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning):
        rb = pool.score([P("1")], ["x"])
    assert "TRL-style batched function must name its parameters (prompts, completions" in rb.errors[0]


def test_a_process_reward_returning_an_unpicklable_value_is_an_error_not_a_dead_worker():
    def returns_a_lambda(prompt, completion):
        return (lambda: 1.0) if completion == "odd" else 1.0

    pool = RewardPool({"lam": returns_a_lambda}, executor="process", max_invalid_frac=None)
    with pytest.warns(RewardErrorWarning):
        rb = pool.score([P("a")] * 3, ["ok", "odd", "ok"])
    pool.close()
    assert rb.valid.tolist() == [True, False, True]
    assert rb.errors[1].startswith("lam: reward result could not be sent back from the worker process: ")
