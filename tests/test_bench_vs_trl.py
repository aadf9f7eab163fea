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
        "work_decode_steps": 3.0,  # the longest completion: one decode step per token of it
    }


@pytest.mark.parametrize("beta, passes", [(0.0, 8), (0.04, 10)])  # 6N update + 2N generation (+ 2N reference)
def test_compute_floor_is_matmul_flops_at_the_peak(beta, passes):
    ph = {"work_matmul_params": 2e6, "work_prompt_tokens": 40.0, "work_completion_tokens": 160.0}
    f = compute_floor(ph, beta, peak_gflops=100.0)
    assert f["tokens"] == 200.0
    assert f["gflop"] == pytest.approx(passes * 2e6 * 200 / 1e9, rel=1e-12)
    assert f["floor_s"] == pytest.approx(passes * 2e6 * 200 / 100e9, rel=1e-12)
    assert f["strict_s"] == pytest.approx(passes * 2e6 * 160 / 100e9, rel=1e-12)


@pytest.mark.parametrize("beta, passes", [(0.0, 6), (0.04, 8)])  # at the peak: update (+ reference)
@pytest.mark.parametrize(
    "read_s, decode_s",
    [
        (0.01, 12 * 0.01),  # memory-bound: 12 steps, each reads every weight (0.12 s > 160 tokens' 6.4 ms)
        (1e-5, 2 * 2e6 * 160 / 100e9),  # compute-bound: the 160 completion tokens' FLOPs at the peak
    ],
)
def test_machine_floor_prices_decoding_as_weight_reads_or_flops(beta, passes, read_s, decode_s):
    ph = {
        "work_matmul_params": 2e6,
        "work_prompt_tokens": 40.0,
        "work_completion_tokens": 160.0,
        "work_decode_steps": 12.0,
    }
    f = compute_floor(ph, beta, peak_gflops=100.0, read_s=read_s)
    gen = 2 * 2e6 * 40 / 100e9 + decode_s  # the prompts' prefill at the peak, then decoding
    assert f["gen_floor_s"] == pytest.approx(gen, rel=1e-12)
    assert f["machine_s"] == pytest.approx(passes * 2e6 * 200 / 100e9 + gen, rel=1e-12)
    assert "machine_s" not in compute_floor(ph, beta, peak_gflops=100.0)  # nothing read: no machine floor


def test_decode_shapes_cover_every_matmul_weight_once(tmp_path):
    """The decode sweep multiplies exactly the weights matmul_params counts (vLLM's fused layout of them)."""
    from bench_mfu import decode_shapes, decode_sweep_seconds, matmul_params, weight_read_seconds
    from transformers import AutoModelForCausalLM

    from lit_rl.models.tiny import build_tiny_model

    path = build_tiny_model(
        str(tmp_path), arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, seed=0
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    assert sum(i * o for i, o in decode_shapes(model.config)) == matmul_params(model)
    assert decode_sweep_seconds(model.config, rows=2, reps=1) > 0
    assert weight_read_seconds(1000, reps=1) > 0


def test_compute_floor_is_absent_without_token_counts():
    assert compute_floor({"update": 1.0}, 0.0, 100.0) is None
