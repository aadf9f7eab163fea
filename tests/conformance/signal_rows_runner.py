"""One RL iteration of the grpo recipe's module (token_mean, one row per micro-batch) over W ranks (DDP, gloo,
float64) on the hand-built Experience with group 1's rewards made all equal: rank 0 holds group 0 (4 signal
rows), rank 1 group 1 (no signal row), so with ``skip_zero_advantage_rows`` rank 1 forwards nothing and pads
with zero-weight passes to rank 0's count. Transformers' RMSNorm computes in float64 (``tests/_float64.py``).

    python tests/conformance/signal_rows_runner.py OUT.pt MODEL_DIR WORLD SKIP [MINIBATCH]   # SKIP: null | false

Rank 0 saves the averaged gradient of the first step to OUT.pt; every rank r writes OUT.pt.rank{r}.json with the
micro-batches it ran. With MINIBATCH (``minibatch_size``: several steps, so old log-probs, deferred to the
training step) OUT.pt.old{r}.json lists the rows of each old-log-prob forward (0: a zero-weight one). Used by
tests/test_signal_rows.py and tests/test_old_logprobs.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from _conformance import build_module, flat, hand_experience, run_step


def no_signal_in_group_1(module):
    """hand_experience with rows 4, 6, 7 rewarded 1 (row 5 has no reward): group 1 has no GRPO signal."""
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
    exp.rewards[[4, 6, 7]] = 1.0
    return exp


def run_ranks(out: Path, model_dir, world: int, *args: str) -> None:
    """This runner as ``world`` gloo DDP processes on a free local port (what the tests call); raises with the
    output's tail when it fails."""
    here = Path(__file__).resolve().parent
    from lit_rl.rollout._server_launch import free_port

    port = str(free_port())
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "PYTHONPATH": os.pathsep.join([str(here), str(here.parent.parent), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [sys.executable, __file__, str(out), str(model_dir), str(world), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


if __name__ == "__main__":
    from transformers.models.qwen2 import modeling_qwen2

    from tests._float64 import rmsnorm_in_input_dtype  # the repository root is on PYTHONPATH

    modeling_qwen2.Qwen2RMSNorm.forward = rmsnorm_in_input_dtype  # as test_signal_rows.py, for this process
    out, model_dir, world, skip = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    module = build_module(
        "grpo",
        model_dir,
        loss_agg="token_mean",
        micro_batch_size=1,
        skip_zero_advantage_rows={"null": None, "false": False}[skip],
        minibatch_size=int(sys.argv[5]) if len(sys.argv) > 5 else None,
    )
    old_rows = []
    pair = module.old_logprobs_pair

    def counting(micro):
        old_rows.append(int(micro.train_mask.any(-1).sum()))  # a zero-weight forward trains no row
        return pair(micro)

    module.old_logprobs_pair = counting
    ran = []
    plan = module.train_micro_batches

    def recording(mb, rows=None):
        micros = plan(mb, rows)
        ran.append(
            {"real": sum(m is not None for m in micros), "zero_weight": sum(m is None for m in micros)}
        )
        return micros

    module.train_micro_batches = recording

    def my_rows(e, trainer):
        n = e.batch_size // trainer.world_size
        return e.select(list(range(trainer.global_rank * n, (trainer.global_rank + 1) * n)))

    grads = run_step(
        module,
        no_signal_in_group_1(module),
        strategy="ddp" if world > 1 else "auto",
        devices=world,
        transform=my_rows,
    )
    with open(f"{out}.rank{module.trainer.global_rank}.json", "w") as f:
        json.dump(ran, f)
    with open(f"{out}.old{module.trainer.global_rank}.json", "w") as f:
        json.dump(old_rows, f)
    if module.trainer.global_rank == 0:
        torch.save(flat(grads[0]), out)
