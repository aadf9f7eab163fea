"""scripts/bench_vs_trl.py's compute floor: the real token counts of one rollout and the floor's arithmetic
(hand-computed; the bench itself runs for minutes and is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_vs_trl import compute_floor, token_counts

from lit_rl.data.experience import Experience


def _exp():
    # two groups of two rows; P = 3 (left-padded prompts), C = 3 (right-padded completions)
    att = torch.tensor(
        [
            [0, 1, 1, 1, 1, 0],  # group 7: prompt 2 real, completion 2
            [0, 1, 1, 1, 1, 1],  #          prompt 2 (the same prompt), completion 3
            [1, 1, 1, 1, 0, 0],  # group 9: prompt 3, completion 1
            [1, 1, 1, 0, 0, 0],
        ]
    )  #          prompt 3, completion 0
    B = att.shape[0]
    return Experience(
        input_ids=att.clone(),
        attention_mask=att,
        loss_mask=att[:, 3:].bool(),
        prompt_len=3,
        group_ids=torch.tensor([7, 7, 9, 9]),
        rewards=torch.zeros(B),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )


def test_token_counts_count_each_prompt_once_and_every_generated_token():
    assert token_counts(_exp()) == {
        "work_prompt_tokens": 2.0 + 3.0,
        "work_completion_tokens": 2.0 + 3 + 1 + 0,
    }


@pytest.mark.parametrize("beta, passes", [(0.0, 8), (0.04, 10)])  # 6N update + 2N generation (+ 2N reference)
def test_compute_floor_is_matmul_flops_at_the_peak(beta, passes):
    ph = {"work_matmul_params": 2e6, "work_prompt_tokens": 40.0, "work_completion_tokens": 160.0}
    f = compute_floor(ph, beta, peak_gflops=100.0)
    assert f["tokens"] == 200.0
    assert f["gflop"] == pytest.approx(passes * 2e6 * 200 / 1e9, rel=1e-12)
    assert f["floor_s"] == pytest.approx(passes * 2e6 * 200 / 100e9, rel=1e-12)
    assert f["strict_s"] == pytest.approx(passes * 2e6 * 160 / 100e9, rel=1e-12)


def test_compute_floor_is_absent_without_token_counts():
    assert compute_floor({"update": 1.0}, 0.0, 100.0) is None
