"""Tokens/s of one update step: token-budget micro-batches (``micro_batch_tokens``) and padding-free packing
(``padding_free``) vs fixed-row micro-batches.

A long-tailed length mix: completion lengths log-normal (median ``--median``, sigma ``--sigma``), capped at 8x the
sample's median, with the longest row exactly at the cap. The same Experience trains one update step
(forward + backward + a stateless SGD step at lr 0, so every repetition sees the same weights) of a real
``PolicyModule`` in a real Lightning Trainer under each plan (``--plans``), interleaved in one process:

* ``fixed``: ``micro_batch_size`` rows per micro-batch, as rows come, padded (``padding_free: false``: every
  micro-batch has the width of the minibatch's longest row);
* ``fixed+trim``: the same rows, each micro-batch trimmed to its own longest row (what trimming alone buys), padded;
* ``tokens``: padded ``micro_batch_tokens`` = ``micro_batch_size`` x the longest row, i.e. the padded area of one fixed
  micro-batch, so the peak activation size is the same bound; rows sorted by length and cut at the budget;
* ``packed``: ``padding_free: true`` with the same fixed rows: each micro-batch's real tokens only, each prompt
  once (``models/packed.py``);
* ``auto``: the default ``padding_free: null``, the same fixed rows (packed where the model allows it: the same
  as ``packed`` for a float32 model that takes a packed forward);
* ``all packed``: ``padding_free`` with the whole minibatch in one micro-batch (no ``micro_batch_size``).

    python scripts/bench_microbatch.py [--rows 32 --median 32 --micro-batch-size 4 --layers 4 --hidden 256 --reps 3]
    python scripts/bench_microbatch.py --model ~/.cache/lit_rl/smollm2-135m-instruct --group 4 --median 19 \
        --micro-batch-size 8 --prompt 12 --reps 2
    python scripts/bench_microbatch.py --sigma 0 --cap 1.5 --plans fixed,packed,auto   # one completion fill

``--sigma 0 --cap X``: every row at the median but one at X times it, a completion fill of about 1 / X: the sweep
behind ``padding_free``'s default (docs/guides/scaling-out.md "No padding at all").

``--group G``: rows of a group share their prompt (the RL layout; 1 = every prompt distinct). ``--model``: a
checkpoint directory instead of the tiny model (token ids stay in 5..59, inside any vocabulary).

Prints per plan: micro-batches, padded tokens, median update wall and CPU seconds, tokens/s (real tokens / wall
s and / CPU s) and the ratio to ``fixed``. CPU time (getrusage, all threads) is the robust figure on a shared
machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

PLANS = ["fixed", "fixed+trim", "tokens", "packed", "auto", "all packed"]


def _cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def lengths(rows: int, median: int, sigma: float, seed: int, cap_x: float = 8.0) -> list[int]:
    """Log-normal completion lengths around ``median``, capped at ``cap_x`` times the sample's median; the longest
    row is set to that cap, so the mix's max is exactly ``cap_x`` x its median (``sigma`` 0: every row at the
    median but one at the cap, so the completion fill is about 1 / cap_x)."""
    import statistics

    import torch

    g = torch.Generator().manual_seed(seed)
    raw = (
        (median * torch.exp(sigma * torch.randn(rows, generator=g, dtype=torch.float64))).round().clamp(min=1)
    )
    out = raw.long().tolist()
    cap = max(1, round(cap_x * statistics.median_low(out)))
    out = [min(n, cap) for n in out]
    out[max(range(rows), key=lambda i: out[i])] = cap
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--median", type=int, default=32, help="median completion length (tokens)")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the completion lengths")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens per row")
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group", type=int, default=1, help="rows per prompt (1: every prompt distinct)")
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny qwen2 built here)")
    ap.add_argument("--cap", type=float, default=8.0, help="the longest row, in multiples of the median")
    ap.add_argument("--plans", default=None, help=f"comma list of plans to run (default: all of {PLANS})")
    args = ap.parse_args()
    chosen = PLANS if args.plans is None else args.plans.split(",")
    if not chosen or any(c not in PLANS for c in chosen):
        ap.error(f"--plans: a comma list of {PLANS}, got {args.plans!r}")
    if args.group < 1 or args.rows % args.group:
        ap.error(f"--group must be >= 1 and divide --rows ({args.rows}), got {args.group}")

    import lightning as L
    import torch

    from lit_rl.data import PromptDataModule
    from lit_rl.data.experience import Experience
    from lit_rl.learners import PolicyModule
    from lit_rl.models.tiny import build_tiny_model

    tmp = tempfile.mkdtemp(prefix="bench_microbatch_")
    model = args.model or str(
        build_tiny_model(
            tmp,
            arch="qwen2",
            layers=args.layers,
            hidden=args.hidden,
            heads=max(2, args.hidden // 64),
            tokenizer="char",
            seed=0,
        )
    )
    lens = lengths(args.rows, args.median, args.sigma, args.seed, args.cap)
    B, P, C = args.rows, args.prompt, max(lens)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(5, 60, (B, P + C), generator=g)
    att = torch.zeros(B, P + C, dtype=torch.long)
    mask = torch.zeros(B, C, dtype=torch.bool)
    for i, n in enumerate(lens):
        ids[i, :P] = ids[i - i % args.group, :P]  # a group's rows share its prompt
        att[i, : P + n] = 1
        mask[i, :n] = True
        ids[i, P + n :] = 0
    exp = Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B) // args.group,
        rewards=torch.rand(B, generator=g),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
        horizon=C,
    )
    real_tokens = int(att.sum())
    sgd = lambda params: torch.optim.SGD(params, lr=0.0)  # noqa: E731  same weights every repetition
    mbs = args.micro_batch_size
    budget = mbs * (P + C)

    class TrimmedFixed(PolicyModule):
        """Fixed rows per micro-batch, each trimmed to its own width (not a lit_rl option: the comparison row)."""

        def train_micro_batches(self, mb, rows=None):
            mb = mb if rows is None else mb.select(rows)  # the signal rows (all of them: random rewards)
            return [m.trim() for m in mb.micro_batches(self.config.step.micro_batch_size)]

    make = {
        "fixed": lambda: PolicyModule(model=model, micro_batch_size=mbs, padding_free=False, optimizer=sgd),
        "fixed+trim": lambda: TrimmedFixed(
            model=model, micro_batch_size=mbs, padding_free=False, optimizer=sgd
        ),
        "tokens": lambda: PolicyModule(
            model=model, micro_batch_tokens=budget, padding_free=False, optimizer=sgd
        ),
        "packed": lambda: PolicyModule(model=model, micro_batch_size=mbs, padding_free=True, optimizer=sgd),
        # the default, padding_free null: packed wherever the model allows it (not a float64 model)
        "auto": lambda: PolicyModule(model=model, micro_batch_size=mbs, optimizer=sgd),
        "all packed": lambda: PolicyModule(model=model, padding_free=True, optimizer=sgd),
    }
    plans = {name: make[name]() for name in chosen}
    shape = {}
    for name, mod in plans.items():
        micros = mod.train_micro_batches(exp.trim())
        packed = [mod._packed(m, mod.model) for m in micros]
        shape[name] = (
            len(micros),
            sum(p.computed_tokens if p is not None else m.input_ids.numel() for p, m in zip(packed, micros)),
        )

    times: dict[str, list[tuple[float, float]]] = {k: [] for k in plans}

    class Synthetic(L.Callback):
        def __init__(self, name):
            self.name, self.t = name, (0.0, 0.0)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            pl_module.on_experience(trainer, pl_module, e := exp.to(pl_module.device))
            batch.metrics = pl_module.compute_advantages(e)
            batch.experience = e
            self.t = (time.perf_counter(), _cpu_s())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times[self.name].append((time.perf_counter() - self.t[0], _cpu_s() - self.t[1]))

    for _ in range(args.reps):
        for name, mod in plans.items():  # interleaved: load on the machine hits every plan alike
            trainer = L.Trainer(
                max_steps=1,
                max_epochs=-1,
                accelerator="cpu",
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=[Synthetic(name)],
            )
            trainer.fit(
                mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=2)
            )

    print(
        f"\none update step: {B} rows, prompt {P}, completion lengths log-normal (median {args.median}, sigma "
        f"{args.sigma}, cap {args.cap:g}x the sample median): min {min(lens)}, median {statistics.median_low(lens)}, "
        f"max {max(lens)}; {real_tokens} real tokens; completion fill "
        f"{sum(lens) / (len(lens) * max(lens)):.2f}; "
        f"{args.model or f'qwen2 {args.layers} layers x {args.hidden}'}, groups of "
        f"{args.group}, float32, CPU, "
        f"median of {args.reps} interleaved repetitions; token budget {budget} = {mbs} rows x {P + C}"
    )
    print(
        "(padded tok: the tokens the forwards compute; packed plans: real tokens plus the packed rows' padding)"
    )
    print(
        f"{'plan':<12}{'micro':>7}{'padded tok':>12}{'wall s':>9}{'CPU s':>9}{'tok/s wall':>12}{'tok/s CPU':>11}"
        f"{'x ' + chosen[0] + ' (wall)':>16}{'x ' + chosen[0] + ' (CPU)':>15}"
    )
    base = None
    for name in plans:
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        tw, tc = real_tokens / wall, real_tokens / cpu
        base = base or (tw, tc)
        print(
            f"{name:<12}{shape[name][0]:>7}{shape[name][1]:>12}{wall:>9.2f}{cpu:>9.2f}{tw:>12.0f}{tc:>11.0f}"
            f"{tw / base[0]:>16.2f}{tc / base[1]:>15.2f}"
        )
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
