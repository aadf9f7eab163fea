"""One RL iteration through lit_rl vs the same computation as a bare PyTorch loop, side by side.

Both sides: a tiny local model, HF ``generate`` (same sampling), the same reward functions, GRPO advantages,
one no-grad old-logprob pass, ``ppo_epochs`` passes of PPO-clip updates with AdamW. The lit_rl side runs
through ``lightning.Trainer`` + ``RolloutCallback`` + ``PolicyModule``; the bare side is a hand-written loop.
Rounds alternate (bare, lit, bare, lit, ...) and the table reports medians, so machine noise hits both.

    python scripts/bench_step.py            # default sizes
    python scripts/bench_step.py --quick
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time

import lightning as L
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.data.prompts import render_prompt
from lit_rl.learners import PolicyModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rewards import ExactAnswerReward, PrefixMatchReward
from lit_rl.rollout import SamplingConfig


class _Timer(L.Callback):
    def __init__(self):
        self.iters: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wall = time.perf_counter() - self.t0
        m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("perf/")}
        exp = batch.experience
        self.iters.append({"wall": wall, "tokens": float(exp.attention_mask.sum()), **m})


def run_lit(model_dir, args, seed) -> list[dict[str, float]]:
    timer = _Timer()
    torch.manual_seed(seed)
    module = PolicyModule(
        model=model_dir,
        ppo_epochs=args.epochs,
        clip_low=0.2,
        clip_high=0.2,
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-4),
        seed=seed,
    )
    rc = RolloutCallback(
        rewards={"exact": ExactAnswerReward(), "prefix": PrefixMatchReward()},
        group_size=args.group,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=args.max_new),
    )
    tr = L.Trainer(
        max_steps=args.iters * args.epochs,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer, rc],
    )
    tr.fit(module, datamodule=PromptDataModule(task="addition", batch_size=args.prompts, seed=seed))
    return timer.iters


def run_bare(model_dir, args, seed) -> list[dict[str, float]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dm = PromptDataModule(task="addition", batch_size=args.prompts, seed=seed)
    dm.setup()
    loader = iter(dm.train_dataloader())
    fns = [ExactAnswerReward(), PrefixMatchReward()]
    weights = [1.0, 1.0]
    G, out = args.group, []
    for _ in range(args.iters):
        prompts = next(loader).prompts
        t0 = time.perf_counter()
        # generate
        rows = [render_prompt(p, tok) for p in prompts for _ in range(G)]
        P = max(map(len, rows))
        ids = torch.full((len(rows), P), tok.pad_token_id)
        att = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, P - len(r) :], att[i, P - len(r) :] = torch.tensor(r), 1
        model.eval()
        with torch.no_grad():
            g = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=True,
                temperature=1.0,
                top_k=None,
                max_new_tokens=args.max_new,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                return_dict_in_generate=True,
                output_logits=True,
            )
        model.train()
        new = g.sequences[:, P:]
        is_eos = (new == tok.eos_token_id).long()
        mask = (is_eos.cumsum(-1) - is_eos) == 0  # tokens up to and including the first eos
        t1 = time.perf_counter()
        # reward + advantages
        texts = tok.batch_decode(new.masked_fill(~mask, tok.pad_token_id), skip_special_tokens=True)
        recs = [p for p in prompts for _ in range(G)]
        r = torch.tensor([sum(w * f(p, t) for w, f in zip(weights, fns)) for p, t in zip(recs, texts)])
        rg = r.view(-1, G)
        adv = ((rg - rg.mean(1, keepdim=True)) / (rg.std(1, keepdim=True) + 1e-6)).view(-1, 1).expand_as(mask)
        t2 = time.perf_counter()
        # old logprobs
        seq = g.sequences
        full_att = torch.cat([att, mask.long()], 1)
        pos = (full_att.cumsum(-1) - 1).clamp(min=0)
        C = new.shape[1]

        def logp():
            logits = model(
                input_ids=seq, attention_mask=full_att, position_ids=pos, logits_to_keep=C + 1
            ).logits
            return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)

        with torch.no_grad():
            old = logp()
        t3 = time.perf_counter()
        for _ in range(args.epochs):
            lp = logp()
            ratio = torch.exp(lp - old)
            loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            loss = (loss * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        t4 = time.perf_counter()
        out.append(
            {
                "wall": t4 - t0,
                "tokens": float(full_att.sum()),
                "perf/generate_s": t1 - t0,
                "perf/reward_s": t2 - t1,
                "perf/old_logprob_s": t3 - t2,
                "perf/update_s": t4 - t3,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.iters, args.layers, args.hidden = 2, 3, 2, 64
    d = tempfile.mkdtemp(prefix="bench_step_")
    build_tiny_model(d, layers=args.layers, hidden=args.hidden, heads=4)
    res = {"bare": [], "lit_rl": []}
    for r in range(args.rounds):
        res["bare"] += run_bare(d, args, seed=r)[1:]  # first iteration of each run is warm-up
        res["lit_rl"] += run_lit(d, args, seed=r)[1:]
    keys = ["perf/generate_s", "perf/reward_s", "perf/old_logprob_s", "perf/update_s", "wall"]
    print(
        f"\nmodel: {args.layers} layers, hidden {args.hidden}; {args.prompts} prompts x {args.group} samples, "
        f"max_new_tokens={args.max_new}, ppo_epochs={args.epochs}; medians over {len(res['bare'])} iterations"
    )
    print(f"{'':10s}" + "".join(f"{k.replace('perf/', ''):>16s}" for k in keys) + f"{'tokens/s':>12s}")
    tps = {}
    for name, its in res.items():
        med = {k: statistics.median(i.get(k, 0.0) for i in its) for k in keys}
        tps[name] = statistics.median(i["tokens"] / i["wall"] for i in its)
        print(f"{name:10s}" + "".join(f"{med[k]:16.4f}" for k in keys) + f"{tps[name]:12.0f}")
    ratio = tps["bare"] / tps["lit_rl"]
    print(
        f"\nlit_rl overhead (bare tokens/s / lit_rl tokens/s): {ratio:.3f}x  target <= 1.15x  "
        f"{'PASS' if ratio <= 1.15 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
