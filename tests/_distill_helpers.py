"""Helpers for the distillation tests: quick supervised teachers, greedy accuracy, and a distillation fit.

Teachers here are trained by plain teacher-forced cross-entropy on (prompt, answer + eos) pairs — seconds on a
CPU, and deterministic — rather than by RL (scripts/bench_distill.py trains its teacher with GRPO instead).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from _learning import seed

from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.models.tiny import build_tiny_model

TINY = {"layers": 2, "hidden": 64, "heads": 2, "tokenizer": "char"}


class Spy(torch.nn.Module):
    """Wraps a real teacher model and records every batch of input ids it is asked to score.

    Only passes that start their sequences are recorded: under the shared-prompt forward a teacher sees each
    distinct prompt once (recorded) and then the completion tokens on top of that prompt's KV cache
    (``past_key_values`` given: no prompt text in them to attribute, not recorded)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, input_ids=None, **kw):
        if kw.get("past_key_values") is None:
            self.seen.append(input_ids.detach().cpu().clone())
        return self.inner(input_ids=input_ids, **kw)


def sft_model(
    out_dir,
    pairs: list[tuple[str, str]],
    steps: int = 300,
    seed: int = 0,
    lr: float = 3e-3,
    base: str | None = None,
    decay: bool = False,
    **tiny,
) -> Path:
    """A tiny model trained with CE on ``pairs`` (prompt text, completion text; eos appended), saved to out_dir."""
    out_dir = Path(out_dir)
    path = base or build_tiny_model(out_dir, seed=seed, overwrite=True, **{**TINY, **tiny})
    torch.manual_seed(seed)
    model, tok = load_causal_lm(str(path)).train(), load_tokenizer(str(path))
    rows = []
    for p, a in pairs:
        pi = tok(p, add_special_tokens=False)["input_ids"]
        ai = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((pi, ai))
    L_ = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), L_), tok.pad_token_id)
    labels = torch.full((len(rows), L_), -100)
    att = torch.zeros((len(rows), L_), dtype=torch.long)
    for i, (p, a) in enumerate(rows):  # left padding, as generate() sees prompts
        s = L_ - len(p) - len(a)
        ids[i, s:] = torch.tensor(p + a)
        labels[i, L_ - len(a) :] = torch.tensor(a)
        att[i, s:] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # decay=True: linear decay to 0. At a constant 3e-3 the loss spikes late (add teacher, default
    # kernels: held-out 0.98 at step 75, 0.68 at step 100), so the last step's accuracy depended on which
    # CPU kernels ran. Decaying lets the final iterate settle (docs/learning_tests.md has the sweep).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / steps if decay else 1.0)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=att, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


@torch.no_grad()
def greedy_accuracy(
    model_or_path, prompts: list[Prompt], max_new_tokens: int, tokenizer=None, per_char: bool = False
) -> float:
    """Fraction of prompts whose greedy completion (special tokens dropped, stripped) equals the answer; with
    ``per_char``, the fraction of answer characters the completion gets right at their position (partial
    credit, so progress shows before whole answers are right)."""
    if isinstance(model_or_path, (str, Path)):
        model, tokenizer = load_causal_lm(str(model_or_path)), load_tokenizer(str(model_or_path))
    else:
        model = model_or_path
    was = model.training
    model.eval()
    rows = [render_prompt(p, tokenizer) for p in prompts]
    P = max(map(len, rows))
    ids = torch.full((len(rows), P), tokenizer.pad_token_id)
    att = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :] = torch.tensor(r)
        att[i, P - len(r) :] = 1
    dev = next(model.parameters()).device
    out = model.generate(
        input_ids=ids.to(dev),
        attention_mask=att.to(dev),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.train(was)
    texts = [t.strip() for t in tokenizer.batch_decode(out[:, P:], skip_special_tokens=True)]
    if per_char:
        hits = sum(sum(a == b for a, b in zip(t, str(p.answer))) for t, p in zip(texts, prompts))
        return hits / sum(len(str(p.answer)) for p in prompts)
    return sum(t == str(p.answer) for t, p in zip(texts, prompts)) / len(prompts)


def write_jsonl(path, prompts: list[Prompt]) -> str:
    with open(path, "w") as f:
        f.writelines(
            json.dumps(
                {"prompt": p.prompt, "answer": p.answer, "domain": p.domain, "uid": p.uid, **p.metadata}
            )
            + "\n"
            for p in prompts
        )
    return str(path)


def fit(module, datamodule, callbacks: list, steps: int) -> L.Trainer:
    L.seed_everything(seed(0), verbose=False)  # rollout sampling draws from the global RNG
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        log_every_n_steps=1,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer
