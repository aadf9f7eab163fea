"""Issue 36's reproductions through ``lit-rl fit``: with top-k / top-p / min-p / repetition-penalty sampling on the
HF engine (the trainer's own weights), one iteration is at the on-policy point — policy = reference = old policy =
engine — so the reward-form KL is 0, every importance weight is 1 and MIS keeps every token.

Before the fix (``core.processed``): ``kl/mean`` 3.03 per token with top_k 3 (0.50 with top_p 0.6), the mismatch
KL 2.08 and MIS/TIS weights far from 1, because the engine reports the truncated distribution's log-probs and the
trainer compared them with its full softmax."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.cli import main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[1]
KL_REWARD = """
trainer:
  callbacks+:
    - class_path: lit_rl.callbacks.reference_kl.ReferenceKL
      init_args: {kind: k1, where: reward, beta: 0.04}
"""
# (sampling overrides, module overrides): each a setting a user changes alone from the quickstart
CASES = {
    "top_k_tis_token": (["--rollout.sampling.top_k", "3"], ["--model.init_args.rollout_correction", "tis"]),
    "top_p_min_p_penalty_mis_sequence_epochs": (
        [
            "--rollout.sampling.top_p",
            "0.6",
            "--rollout.sampling.min_p",
            "0.05",
            "--rollout.sampling.repetition_penalty",
            "1.4",
        ],
        [
            "--model.init_args.rollout_correction",
            "mis",
            "--model.init_args.correction_level",
            "sequence",
            "--model.init_args.ppo_epochs",
            "2",
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_on_policy_point_with_truncated_sampling(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kl.yaml").write_text(KL_REWARD)
    sampling, module = CASES[case]
    run = tmp_path / "run"
    main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/quickstart.yaml"),
            "-c",
            str(tmp_path / "kl.yaml"),
            "--trainer.default_root_dir",
            str(run),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.max_steps",
            "2" if "epochs" in case else "1",  # optimizer steps: one iteration
            "--data.init_args.batch_size",
            "4",
            "--rollout.group_size",
            "4",
            "--rollout.sampling.max_new_tokens",
            "4",
            *sampling,
            *module,
        ]
    )
    rows = [r for r in log_rows(run / "logs/metrics.csv") if "kl/mean" in r or "is/max_weight" in r]
    got = {k: v for r in rows for k, v in r.items()}
    assert abs(got["kl/mean"]) <= 1e-6, got  # before: 3.03 (top_k 3)
    assert abs(got["rollout/logprob_mismatch_kl"]) <= 1e-6, got  # before: 2.08
    assert got["is/max_weight"] == pytest.approx(1.0, abs=1e-5), got
    assert got["is/clipped_frac"] == 0.0 and got["is/masked_frac"] == 0.0, got  # MIS keeps every token
    if "epochs" not in case:  # one optimizer step: the PPO ratio is exactly the on-policy 1
        assert got["actor/clipfrac"] == 0.0, got
