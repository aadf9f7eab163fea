"""One RL iteration of the grpo recipe with ``micro_batch_tokens``, W ranks (DDP, gloo, float64), on the hand-built
Experience with group 1's completions cut to one token: rank 0 (group 0, long rows) and rank 1 (group 1, short
rows) form different numbers of token-budget micro-batches.

    python tests/conformance/token_budget_runner.py OUT.pt MODEL_DIR LOSS_AGG WORLD BUDGET [padding_free]

With ``padding_free`` the policy runs its forwards packed (``PolicyModule(padding_free=True)``), with
transformers' RMSNorm computing in float64 (``tests/_float64.py``).

Rank 0 saves the averaged gradient of the step to OUT.pt; every rank r writes OUT.pt.rank{r}.json with the
micro-batches it ran (real ones and zero-weight ones). Used by test_token_budget.py.
"""

import json
import sys

import torch
from _conformance import build_module, flat, hand_experience, run_step


def long_and_short(module):
    """hand_experience with rows 4-7 (group 1) cut to their first completion token."""
    exp = hand_experience(module.tokenizer.pad_token_id, module.model.config.vocab_size, horizon=8)
    P = exp.prompt_len
    for i in range(4, 8):
        exp.attention_mask[i, P + 1 :] = 0
        exp.input_ids[i, P + 1 :] = module.tokenizer.pad_token_id
        exp.loss_mask[i, 1:] = False
        exp.rollout_logprobs[i, 1:] = 0.0
    exp.finish_reasons[4:] = ["stop"] * 4
    return exp


if __name__ == "__main__":
    out, model_dir, loss_agg, world, budget = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    packed = sys.argv[6:] == ["padding_free"]
    if packed:  # the repository root is on PYTHONPATH (test_padding_free.py)
        from transformers.models.qwen2 import modeling_qwen2

        from tests._float64 import rmsnorm_in_input_dtype

        modeling_qwen2.Qwen2RMSNorm.forward = rmsnorm_in_input_dtype  # for this whole process
    module = build_module(  # every row forwarded: row 5 (no reward) would be left out of the plan checked
        "grpo",
        model_dir,
        loss_agg=loss_agg,
        micro_batch_tokens=budget,
        padding_free=packed,
        skip_zero_advantage_rows=False,
    )
    ran = []
    plan = module.train_micro_batches

    def recording(mb, rows=None):
        micros = plan(mb, rows)
        ran.append(
            {
                "real": sum(m is not None for m in micros),
                "zero_weight": sum(m is None for m in micros),
                "rows": [m.batch_size for m in micros if m is not None],
            }
        )
        return micros

    module.train_micro_batches = recording

    def my_rows(e, trainer):
        n = e.batch_size // trainer.world_size
        return e.select(list(range(trainer.global_rank * n, (trainer.global_rank + 1) * n)))

    grads = run_step(
        module,
        long_and_short(module),
        strategy="ddp" if world > 1 else "auto",
        devices=world,
        transform=my_rows,
    )
    with open(f"{out}.rank{module.trainer.global_rank}.json", "w") as f:
        json.dump(ran, f)
    if module.trainer.global_rank == 0:
        torch.save(flat(grads[0]), out)
