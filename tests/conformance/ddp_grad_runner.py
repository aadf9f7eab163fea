"""One RL iteration of the grpo recipe's module on the hand-built Experience, W ranks (DDP, gloo, float64).

    python tests/conformance/ddp_grad_runner.py OUT.pt MODEL_DIR LOSS_AGG WORLD

Rank r trains on rows [r·B/W, (r+1)·B/W) (whole groups); rank 0 saves the averaged gradient of the step.
Lightning re-executes this script for the extra local rank (used by test_invariance.py).
"""

import sys

import torch
from _conformance import build_module, flat, hand_experience, run_step

if __name__ == "__main__":
    out, model_dir, loss_agg, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    module = build_module("grpo", model_dir, loss_agg=loss_agg)
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)

    def my_rows(e, trainer):
        n = e.batch_size // trainer.world_size
        return e.select(list(range(trainer.global_rank * n, (trainer.global_rank + 1) * n)))

    grads = run_step(module, exp, strategy="ddp" if world > 1 else "auto", devices=world, transform=my_rows)
    if module.trainer.global_rank == 0:
        torch.save(flat(grads[0]), out)
