"""The chat_addition task (two-digit chat prompts, fixed held-out pairs) and LastIntReward (last integer)."""

import pytest

from lit_rl.data.prompts import Prompt
from lit_rl.data.tasks import get_task
from lit_rl.rewards import LastIntReward, RewardPool


def _p(answer):
    return Prompt(prompt="q", answer=answer)


@pytest.mark.parametrize(
    "completion,score",
    [
        ("42", 1.0),
        ("17 + 25 = 42", 1.0),
        ("The answer is 42.", 1.0),
        (" 42<|im_end|>", 1.0),
        ("42 is not right, it is 43", 0.0),
        ("4 2", 0.0),
        ("", 0.0),
        ("forty-two", 0.0),
        ("142", 0.0),
        ("-42", 0.0),
        ("42.5", 0.0),
    ],
)
def test_last_int_reads_the_last_integer_only(completion, score):
    assert LastIntReward()(_p("42"), completion) == score


def test_last_int_negative_answers_and_a_broken_gold_answer():
    r = LastIntReward()
    assert r(_p("-3"), "2 - 5 = -3") == 1.0
    bad = r(_p("forty"), "40")
    assert not bad.ok and "not an integer" in bad.error  # a data error is masked, not a wrong answer


def test_last_int_through_a_reward_pool():
    pool = RewardPool({"last_int": LastIntReward()})
    batch = pool.score([_p("42"), _p("42")], ["= 42", "41"])
    assert batch.total.tolist() == [1.0, 0.0] and batch.valid.all()


def test_chat_addition_splits_are_fixed_disjoint_and_chat_formatted():
    train, held = get_task("chat_addition")
    assert len(held) == 200 and len(train) + len(held) == 90 * 90
    assert {p.uid for p in train}.isdisjoint({p.uid for p in held})
    _again_train, again_held = get_task("chat_addition")
    assert [p.uid for p in again_held] == [p.uid for p in held]  # the split is seeded, not random per run
    p = held[0]
    a, b = map(int, p.uid.split("-")[1:])
    assert 10 <= a <= 99 and 10 <= b <= 99 and p.answer == str(a + b) and p.prompt is None
    assert p.messages == [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}]
    _, with_sys = get_task("chat_addition", heldout=5, system="Be brief.")
    assert len(with_sys) == 5 and with_sys[0].messages[0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(ValueError, match="heldout"):
        get_task("chat_addition", heldout=0)
