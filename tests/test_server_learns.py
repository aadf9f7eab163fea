"""The quickstart task learned through vLLM server processes (configs/grpo_server.yaml), synchronous and
asynchronous with max_staleness=2: the same bar as the in-process engine's learning test
(tests/test_vllm_engine.py::test_quickstart_learns_through_vllm). Slow: 150 iterations each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _learning import record, seed_args

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_quickstart_learns_through_servers(mode, tmp_path, monkeypatch):
    from lit_rl.callbacks import HeldoutEval, RolloutCallback
    from lit_rl.cli import main
    from lit_rl.rollout.server import VLLMServerEngine

    monkeypatch.chdir(tmp_path)
    extra = (
        []
        if mode == "sync"
        else [
            "--rollout.mode",
            "async",
            "--rollout.max_staleness",
            "2",
            "--model.init_args.rollout_correction",
            "tis",
        ]
    )
    cli = main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/grpo_server.yaml"),
            "--trainer.max_steps",
            "150",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            *extra,
            *seed_args(0, "--rollout.engine.init_args.seed"),
        ]
    )
    rc = next(cb for cb in cli.trainer.callbacks if isinstance(cb, RolloutCallback))
    assert isinstance(rc.engine, VLLMServerEngine) and rc.engine.pool is None  # servers stopped at teardown
    acc = [
        h["eval/accuracy"]
        for h in next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval)).history
    ]
    assert acc[0] <= 0.15, acc
    rows = [json.loads(line) for line in (tmp_path / "runs/grpo_server/rollouts/metrics.jsonl").open()]
    reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
    first, last = sum(reward[:25]) / 25, sum(reward[-25:]) / 25
    record(
        f"server/{mode}",
        reward_first25=first,
        reward_last25=last,
        acc_first=acc[0],
        acc_best_last3=max(acc[-3:]),
    )
    assert last >= first + 0.30, (first, last)
    # 11 held-out prompts (one is 0.09). Best of the last 3 evaluations over seeds x kernels (docs/learning_tests.md):
    # sync 0.545 / 0.636 / 0.727, async 0.455 / 0.545 / 0.273: async asserts 2 prompts learned, sync 3.
    assert max(acc[-3:]) >= acc[0] + (0.25 if mode == "sync" else 0.18), acc
    counted = [
        r["rollout/server_errors"] for r in rows if "rollout/server_errors" in r
    ]  # eval rows have none
    assert len(counted) == len(reward) and counted[-1] == 0.0
    if mode == "sync":  # fp32 server and trainer agree on the sampled tokens' log-probs
        assert float(cli.trainer.callback_metrics["rollout/logprob_mismatch_kl"]) < 1e-6
    else:
        assert max(r.get("async/staleness_max", 0.0) for r in rows) <= 2
