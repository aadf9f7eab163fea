"""`lit-rl` commands on the vLLM recipe (configs/grpo_vllm.yaml, the tiny model) end to end.

`lit-rl validate` binds the engine inside Lightning's evaluation loop, i.e. under ``torch.inference_mode``;
vLLM started there used to hold inference tensors that its first weight sync could not update in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.cli import main

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--rollout.group_size",
    "2",
    "--data.init_args.batch_size",
    "4",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.logger",
    "false",
]


def _close(cli):
    from lit_rl.callbacks import RolloutCallback

    for cb in cli.trainer.callbacks:
        if isinstance(cb, RolloutCallback):
            cb.engine.close()


def test_validate_a_vllm_checkpoint(tmp_path):
    """fit 2 iterations, then `validate --ckpt_path last`: the checkpoint's held-out accuracy equals the fit's
    final evaluation (greedy, same weights), through a fresh VLLMEngine whose first act is a weight sync."""
    from lit_rl.callbacks import HeldoutEval

    root = tmp_path / "run"
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo_vllm.yaml"),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_steps",
            "2",
            *SMALL,
        ]
    )
    try:
        final = next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval)).history[-1]
        assert final["step"] == 2.0
    finally:
        _close(cli)
    cli = main(
        [
            "validate",
            "-c",
            str(ROOT / "configs/grpo_vllm.yaml"),
            "--trainer.default_root_dir",
            str(root),
            "--ckpt_path",
            "last",
            *SMALL,
        ]
    )
    try:
        m = cli.trainer.callback_metrics
        assert float(m["eval/accuracy"]) == pytest.approx(final["eval/accuracy"], abs=1e-7)
        assert float(m["eval/reward_mean"]) == pytest.approx(final["eval/reward_mean"], abs=1e-7)
    finally:
        _close(cli)
