"""The update time of one optimizer step with and without ``skip_zero_advantage_rows``, by the fraction of
groups whose rewards are all equal (GRPO advantage 0: no gradient signal).

A tiny local model, a hand-built Experience of ``--prompts`` x ``--group`` rows (completions of random length),
GRPO-style per-row advantages with the chosen fraction of groups zeroed, ppo_clip / token_mean, AdamW, one
``PolicyModule`` optimizer step (forward, backward, clipping, the AdamW step) per measurement. Skip on and off
alternate (in both orders) and the table reports medians.

    python scripts/bench_signal_rows.py
    python scripts/bench_signal_rows.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch

from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule
from lit_rl.models.tiny import build_tiny_model


def experience(args, vocab: int, zero_groups: int) -> Experience:
    g = torch.Generator().manual_seed(0)
    B, P, C = args.prompts * args.group, args.prompt_len, args.max_new
    lens = torch.randint(C // 4, C + 1, (B,), generator=g)
    ids = torch.randint(5, vocab, (B, P + C), generator=g)
    att = torch.zeros(B, P + C, dtype=torch.long)
    mask = torch.zeros(B, C, dtype=torch.bool)
    for i, n in enumerate(lens.tolist()):
        ids[i, :P] = ids[i - i % args.group, :P]  # a group's rows share its prompt
        att[i, : P + n] = 1
        mask[i, :n] = True
    adv = torch.randn(B, generator=g)[:, None] * mask
    adv[: zero_groups * args.group] = 0.0  # the first groups: all-equal rewards
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B) // args.group,
        rewards=torch.zeros(B),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
        horizon=C,
        advantages=adv,
    )


def step_seconds(m: PolicyModule, exp: Experience, skip: bool) -> float:
    m.update_settings(skip_zero_advantage_rows=None if skip else False)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
    t0 = time.perf_counter()
    m._optimizer_step(opt, None, exp)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 reps, 2 layers")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.layers = 2, 2
    path = build_tiny_model(
        tempfile.mkdtemp(), layers=args.layers, hidden=args.hidden, heads=4, tokenizer="char", seed=0
    )
    m = PolicyModule(model=str(path), micro_batch_size=args.micro_batch_size)
    m._trainer = SimpleNamespace(callbacks=[], world_size=1, strategy=None)  # one process, no Trainer
    m.manual_backward = lambda loss: loss.backward()
    vocab = m.model.config.vocab_size
    print(
        f"{args.prompts} prompts x {args.group} rows, micro_batch_size {args.micro_batch_size}, "
        f"{args.layers} layers, hidden {args.hidden}, {torch.get_num_threads()} threads"
    )
    print("| zero-advantage groups | skip off (s) | skip on (s) | on / off |")
    print("|---|---|---|---|")
    step_seconds(m, experience(args, vocab, 0), False)  # warm-up
    for frac in (0.0, 0.5, 1.0):
        exp = experience(args, vocab, round(frac * args.prompts))
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.reps):
            for skip in (False, True) if r % 2 == 0 else (True, False):  # neither always second
                times[skip].append(step_seconds(m, exp, skip))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {frac:.0%} | {off:.3f} | {on:.3f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
