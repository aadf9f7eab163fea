"""Why the experts-to-student table's self-distillation (``opsd``) collapses on addition: the measurements.

The ``opsd`` teacher is the student's own weights reading the chat prompt with the answer appended (the script's
``PRIVILEGED`` template). This prints, for a model (``--model``, optionally with a Lightning checkpoint of a run
``--ckpt``) on chat-addition prompts:

1. **What the teacher scores**: the teacher's prompt as ``TeacherRouter`` renders it, the student's completion
   tokens after it, and the largest gap between the router's teacher log-probs and a single-row forward of the
   same text (an alignment error would show here: off by one, a missing assistant header, another hint place).
2. **The signal on right and wrong completions**: log π_T − log π_S per token and the advantage (``DistillModule``
   with the leave-one-out baseline, as the recipe) on the student's own samples, by row (right / wrong) and token
   class (the answer's digits, eos, the rest).
3. **Which answer format the teacher rewards**: the first token's probability under student and teacher for
   "The" (the reply "The answer is N") and for the first operand's digit (the base model's reply "A + B = N");
   the summed log π_T − log π_S over the format tokens and over the answer tokens of both replies with the right
   sum; the greedy accuracy with the completion forced to start in each format, plain and hinted; and the share of
   plain greedy replies in each format, and of those whose number is one of the prompt's operands (copied).

    lit-rl models smollm2 runs/smollm2
    python scripts/experts_to_student_opsd.py --model runs/smollm2 --json runs/opsd_probe/start.json
    python scripts/experts_to_student_opsd.py --model runs/smollm2 \
        --ckpt runs/e2s/students/opsd/seed0/checkpoints/last.ckpt      # a run's weights (teacher = student)
    python scripts/experts_to_student_opsd.py --model runs/smollm2 --frozen \
        --ckpt runs/e2s/students/opsd_frozen/seed0/checkpoints/last.ckpt   # teacher = the start's weights
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from experts_to_student import PRIVILEGED

from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.callbacks.teacher_inputs import privileged_prompt, teacher_view
from lit_rl.callbacks.teachers import Teacher, TeacherRouter, _pack
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.data.tasks import get_task
from lit_rl.learners.distill import DistillModule
from lit_rl.rewards import LastIntReward
from lit_rl.rollout.engine import HFEngine, SamplingConfig

FORMATS = {"eq": lambda a, b: f"{a} + {b} = ", "the": lambda a, b: "The answer is "}  # reply formats, by name


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/smollm2", help="the student's starting checkpoint (a directory)")
    ap.add_argument(
        "--ckpt", default=None, help="a run's Lightning checkpoint: its weights replace the model's"
    )
    ap.add_argument("--prompts", type=int, default=64, help="held-out addition prompts for sections 1 and 3")
    ap.add_argument(
        "--sampled", type=int, default=16, help="training prompts sampled for section 2 (x 4 rows)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=16, help="the recipe's completion budget")
    ap.add_argument(
        "--template", default=PRIVILEGED, help="the teacher's privileged template (default: the script's)"
    )
    ap.add_argument(
        "--frozen",
        action="store_true",
        help="the teacher is --model's weights (opsd_frozen) while --ckpt's are the student's; default: one model",
    )
    ap.add_argument("--json", default=None, help="also write the numbers here")
    return ap.parse_args(argv)


def load(
    model: str, ckpt: str | None, template: str = PRIVILEGED, frozen: bool = False
) -> tuple[DistillModule, TeacherRouter]:
    """The recipe's student module and its teacher with the privileged ``template`` (both domains): ``self``, or
    with ``frozen`` ``self_frozen`` (copied from ``model`` before ``ckpt``'s weights are loaded)."""
    mod = DistillModule(
        model=model, losses={"reverse_kl_sampled": 1.0}, opd_baseline=True, micro_batch_size=16
    )
    source = "self_frozen" if frozen else "self"
    # one teacher for both domains (the fallback), as the script's opsd_frozen: one copy of the weights
    router = TeacherRouter({"addition": Teacher(source, template=template)}, fallback="addition")
    router.setup(None, mod, "fit")  # self_frozen: the copy is taken here, from the starting weights
    # what RolloutCallback.setup does in a fit: the module reaches its router through its rollout binding
    mod.bind_rollout(RolloutCallback(rewards=lambda prompt, completion: 0.0).binding(teacher_router=router))
    if ckpt:
        sd = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
        mod.model.load_state_dict(
            {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")}
        )
    mod.setup("fit")
    mod.model.eval()
    return mod, router


def operands(p: Prompt) -> tuple[int, int]:
    a, b = re.findall(r"\d+", p.messages[-1]["content"])[:2]
    return int(a), int(b)


@torch.no_grad()
def ref_logprobs(model, prompt_ids: list[int], comp: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One unpadded forward: log π of each completion token (position P+t-1 predicts token t), float64, and the
    first completion position's full log-distribution."""
    lp = model(torch.tensor([prompt_ids + comp])).logits[0].double().log_softmax(-1)
    P = len(prompt_ids)
    return lp[P - 1 : P - 1 + len(comp)].gather(-1, torch.tensor(comp)[:, None])[:, 0], lp[P - 1]


def alignment(mod, router, teacher, prompts: list[Prompt], template: str) -> dict:
    """Section 1: the router's teacher log-probs of a right and a wrong reply against single-row forwards."""
    tok = mod.tokenizer
    rows = [(p, c) for p in prompts[:4] for c in (p.answer, str(int(p.answer) + 10))]
    comps = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, c in rows]
    exp = _pack(
        tok, [render_prompt(p, tok) for p, _ in rows], comps, [p for p, _ in rows], torch.zeros(len(rows))
    )
    router.on_experience(None, mod, exp)
    worst = 0.0
    for i, (p, _) in enumerate(rows):
        want, _ = ref_logprobs(teacher, render_prompt(privileged_prompt(template, p), tok), comps[i])
        worst = max(worst, float((exp.teacher_logprobs[i, : len(comps[i])].double() - want).abs().max()))
    view = teacher_view(template, exp, tok)
    shown = tok.decode(view.input_ids[0][view.attention_mask[0].bool()])
    print(f"1. teacher sequence (prompt + the student's reply, as scored):\n{shown!r}")
    print(f"   router vs single-row forward, {len(rows)} rows: max |Δ log π_T| = {worst:.2e}")
    if worst > 1e-3:
        raise SystemExit(f"the router's teacher log-probs differ from a plain forward by {worst:.3g}")
    return {"teacher_sequence": shown, "max_abs_router_vs_reference": worst}


def sampled_signal(mod, router, prompts: list[Prompt], max_new_tokens: int) -> dict:
    """Section 2: the recipe's rows (4 samples per prompt at temperature 1), scored and advantaged as in training."""
    tok, score = mod.tokenizer, LastIntReward()
    eng = HFEngine()
    eng.bind(SimpleNamespace(model=mod.model, tokenizer=tok))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
    groups = eng.generate([render_prompt(p, tok) for p in prompts], 4, sampling)
    recs = [p for p, g in zip(prompts, groups) for _ in g]
    comps = [list(c.token_ids) for g in groups for c in g]
    texts = [tok.decode(c, skip_special_tokens=True) for c in comps]
    rewards = torch.tensor([score(p, t) for p, t in zip(recs, texts)])
    exp = _pack(tok, [render_prompt(p, tok) for p in recs], comps, recs, rewards)
    exp.group_ids = torch.arange(len(prompts)).repeat_interleave(4)
    with torch.no_grad():
        router.on_experience(None, mod, exp)
        exp.old_logprobs = mod.completion_logprobs(exp)
    mod.compute_advantages(exp)
    diff, adv = (exp.teacher_logprobs - exp.old_logprobs).double(), exp.extras["opd_advantages"].double()
    cells: dict[str, list[tuple[float, float]]] = {}
    for i, text in enumerate(texts):
        row = "right" if rewards[i] > 0 else "wrong"
        n = int(exp.loss_mask[i].sum())
        ids = exp.completion_ids[i, :n].tolist()
        last = list(
            re.finditer(r"\d+", text)
        )  # LastIntReward reads the last integer: its tokens are the answer
        span = (last[-1].start(), last[-1].end()) if last else (-1, -1)
        pos = 0
        for j, t in enumerate(ids):
            piece = "" if t == tok.eos_token_id else tok.decode([t])
            kind = (
                "eos"
                if t == tok.eos_token_id
                else "answer"
                if pos < span[1] and pos + len(piece) > span[0]
                else "other"
            )
            pos += len(piece)
            cells.setdefault(f"{row} {kind}", []).append((float(diff[i, j]), float(adv[i, j])))
        cells.setdefault(f"{row} row sum", []).append((float(diff[i, :n].sum()), float(adv[i, :n].sum())))
    print(f"2. the student's samples: {len(texts)} rows, {int(rewards.sum())} right")
    print(f"   {'cell':18} {'n':>5} {'mean lpT-lpS':>13} {'mean adv':>9} {'adv > 0':>8}")
    out = {"rows": len(texts), "right": int(rewards.sum()), "cells": {}}
    for k in sorted(cells):
        v = torch.tensor(cells[k], dtype=torch.float64)
        row = {"n": len(v), "log_ratio": float(v[:, 0].mean()), "adv": float(v[:, 1].mean())}
        row["adv_pos"] = float((v[:, 1] > 0).double().mean())
        out["cells"][k] = row
        print(f"   {k:18} {row['n']:5d} {row['log_ratio']:13.3f} {row['adv']:9.3f} {row['adv_pos']:8.2f}")
    return out


def formats(mod, teacher, prompts: list[Prompt], max_new_tokens: int, template: str) -> dict:
    """Section 3: the reply format the teacher rewards, and what each format is worth to the plain student."""
    tok, model, score = mod.tokenizer, mod.model, LastIntReward()
    first: dict[str, list[tuple[float, float]]] = {"The": [], "operand": [], "answer": []}
    signal: dict[str, dict[str, list[float]]] = {f: {"format": [], "answer": []} for f in FORMATS}
    the = tok("The", add_special_tokens=False)["input_ids"][0]
    for p in prompts:
        a, b = operands(p)
        plain, hinted = render_prompt(p, tok), render_prompt(privileged_prompt(template, p), tok)
        for name, fmt in FORMATS.items():
            pre = tok(fmt(a, b), add_special_tokens=False)["input_ids"]
            comp = tok(fmt(a, b) + p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            if comp[: len(pre)] != pre:
                raise SystemExit(f"{fmt(a, b)!r} + {p.answer!r} tokenises across the boundary")
            s, s0 = ref_logprobs(model, plain, comp)
            t, t0 = ref_logprobs(teacher, hinted, comp)
            signal[name]["format"].append(float((t - s)[: len(pre)].sum()))
            signal[name]["answer"].append(float((t - s)[len(pre) :].sum()))
        ids = {
            "The": the,
            "operand": tok(str(a), add_special_tokens=False)["input_ids"][0],
            "answer": tok(p.answer, add_special_tokens=False)["input_ids"][0],
        }
        for k, i in ids.items():
            first[k].append((float(s0[i].exp()), float(t0[i].exp())))
    out: dict = {"first_token": {}, "signal": {}, "forced_accuracy": {}, "plain_greedy_share": {}}
    print(f"3. reply formats, {len(prompts)} held-out prompts. First reply token, P_student -> P_teacher:")
    for k, v in first.items():
        m = torch.tensor(v, dtype=torch.float64).mean(0)
        out["first_token"][k] = {"student": float(m[0]), "teacher": float(m[1])}
        print(f"   {k:8} {m[0]:.3f} -> {m[1]:.3f}")
    print("   Σ (log π_T − log π_S) over a right reply's tokens, mean over prompts:")
    for name, d in signal.items():
        f, a = (float(torch.tensor(d[x], dtype=torch.float64).mean()) for x in ("format", "answer"))
        out["signal"][name] = {"format_tokens": f, "answer_and_eos": a}
        print(
            f"   {FORMATS[name](*operands(prompts[0]))!r:18} format tokens {f:+.3f}   answer + eos {a:+.3f}"
        )
    engines = {}  # plain prompt: the student; hinted: the teacher
    for hint, m in ((False, model), (True, teacher)):
        engines[hint] = HFEngine()
        engines[hint].bind(SimpleNamespace(model=m, tokenizer=tok))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    print("   greedy accuracy with the reply forced to start so (plain prompt / hinted prompt):")
    for name, fmt in {"free": lambda a, b: "", **FORMATS}.items():
        accs = []
        for hint in (False, True):
            pre = [fmt(*operands(p)) for p in prompts]
            ids = [
                render_prompt(privileged_prompt(template, p) if hint else p, tok)
                + (tok(x, add_special_tokens=False)["input_ids"] if x else [])
                for p, x in zip(prompts, pre)
            ]
            texts = [
                x + tok.decode(g[0].token_ids, skip_special_tokens=True)
                for x, g in zip(pre, engines[hint].generate(ids, 1, greedy))
            ]
            accs.append(sum(score(p, t) for p, t in zip(prompts, texts)) / len(prompts))
            if name == "free" and not hint:
                ops = [operands(p) for p in prompts]
                last = [re.findall(r"\d+", t)[-1:] for t in texts]  # the integer LastIntReward reads
                out["plain_greedy_share"] = {
                    "the": sum(t.startswith("The answer is") for t in texts) / len(texts),
                    "eq": sum(t.startswith(f"{a} + {b} =") for t, (a, b) in zip(texts, ops)) / len(texts),
                    # the reply's number is an operand: the plain prompt's numbers copied, as the teacher copies
                    # the number its hint holds
                    "operand": sum(bool(n) and int(n[0]) in ab for n, ab in zip(last, ops)) / len(texts),
                }
                out["plain_greedy_examples"] = texts[:4]
        out["forced_accuracy"][name] = {"plain": accs[0], "hinted": accs[1]}
        print(f"   {name:5} {accs[0]:.3f} / {accs[1]:.3f}")
    sh = out["plain_greedy_share"]
    print(
        f"   plain greedy replies: {sh['the']:.2f} start 'The answer is', {sh['eq']:.2f} start 'A + B =', "
        f"{sh['operand']:.2f} answer an operand; e.g."
    )
    for t in out["plain_greedy_examples"]:
        print(f"     {t!r}")
    return out


def main(argv=None) -> dict:
    a = _args(argv)
    torch.manual_seed(0)
    mod, router = load(a.model, a.ckpt, a.template, a.frozen)
    teacher = router.teachers["addition"].get(mod)[0].eval()
    train, held = get_task("chat_mixed", domains=["addition", "largest"], heldout=64)
    held_add = [p for p in held if p.domain == "addition"][: a.prompts]
    train_add = [p for p in train if p.domain == "addition"][: a.sampled]
    report = {"model": a.model, "ckpt": a.ckpt, "template": a.template, "frozen": a.frozen}
    report["alignment"] = alignment(mod, router, teacher, held_add, a.template)
    report["sampled"] = sampled_signal(mod, router, train_add, a.max_new_tokens)
    report["formats"] = formats(mod, teacher, held_add, a.max_new_tokens, a.template)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
