"""core.microbatch: token-budget grouping, hand-computed plans."""

import pytest

from lit_rl.core.microbatch import padded_tokens, token_budget_groups

# (prompt, completion) real tokens of the conformance harness's 8 rows (hand_experience)
P = [3, 3, 3, 3, 2, 2, 2, 2]
C = [3, 1, 5, 2, 4, 2, 3, 5]


def test_budget_16_hand_plan():
    # longest first: 2 (3+5), 7 (2+5), 0 (3+3), 4 (2+4), 3 (3+2), 6 (2+3), 1 (3+1), 5 (2+2)
    # [2, 7]: 2 x (3 + 5) = 16 fits; + 0 would be 3 x 8 = 24. [0, 4]: 2 x (3 + 4) = 14; + 3: 3 x 7 = 21.
    # [3, 6]: 2 x (3 + 3) = 12; + 1: 3 x 6 = 18. [1, 5]: 2 x (3 + 2) = 10.
    groups = token_budget_groups(P, C, 16)
    assert groups == [[2, 7], [0, 4], [3, 6], [1, 5]]
    assert [padded_tokens(P, C, g) for g in groups] == [16, 14, 12, 10]


def test_every_row_once_and_each_block_within_budget():
    import random

    rng = random.Random(0)
    p = [rng.randint(1, 20) for _ in range(50)]
    c = [rng.randint(1, 200) for _ in range(50)]
    groups = token_budget_groups(p, c, 600)
    assert sorted(i for g in groups for i in g) == list(range(50))
    assert all(padded_tokens(p, c, g) <= 600 for g in groups)


def test_row_over_budget_is_alone():
    assert token_budget_groups(P, C, 1) == [[2], [7], [0], [4], [3], [6], [1], [5]]
    assert token_budget_groups([3, 1], [20, 1], 8) == [[0], [1]]  # row 0 (23 tokens) alone, over budget


def test_max_rows_caps_the_group():
    assert token_budget_groups([1] * 5, [1] * 5, 100, max_rows=2) == [[0, 1], [2, 3], [4]]
    assert token_budget_groups([1] * 5, [1] * 5, 100) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_budget_names_the_field(bad):
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        token_budget_groups(P, C, bad)
