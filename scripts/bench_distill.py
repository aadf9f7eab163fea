"""On-policy distillation vs GRPO alone, from the same fresh student, on the quickstart task.

1. Teacher: the quickstart recipe (configs/quickstart.yaml: GRPO from scratch) trained through the ``lit-rl`` CLI
   until its held-out greedy accuracy is >= 90% (or ``--teacher PATH``).
2. Student: a fresh random tiny model (``--student-*`` sizes), the same initial weights for every run.
3. Runs, each for ``--steps`` RL iterations on the quickstart task, every one sampling 256 rows per step:
   GRPO alone at the quickstart's learning rate (1e-3; 3e-3 stalls at 0.32), with the quickstart's 16 prompts x 16
   samples and with 64 x 4; on-policy distillation from the teacher at lr 3e-3 (``reverse_kl_full``: exact
   reverse KL over the vocabulary, 16 x 16 and 64 x 4; ``reverse_kl_sampled``: the per-token reverse-KL
   advantage, without and with the leave-one-out baseline). The full-vocabulary loss needs no group, so
   more distinct prompts per step is its natural shape. ``--runs`` takes ``name[+baseline][@lr][:PxG]``.
   Held-out greedy accuracy every ``--eval-every`` steps.
4. Prints both curves side by side and the optimizer steps to reach 50% and 80% of the teacher's accuracy.

    python scripts/bench_distill.py                    # ~8 min on 2 quiet CPU cores (3 of them training the teacher)
    python scripts/bench_distill.py --teacher runs/quickstart/final_model
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.callbacks import HeldoutEval, RolloutCallback, TeacherRouter
from lit_rl.data.datamodule import PromptDataModule
from lit_rl.learners import DistillModule, PolicyModule
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.engine import SamplingConfig


def quickstart() -> dict:
    return yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())


def train_teacher(work: Path, steps: int, target: float, init: str | None = None) -> tuple[str, float]:
    """GRPO with the quickstart recipe through the CLI (from scratch, or continuing from ``init``)."""
    from lit_rl.cli import main

    out = work / "teacher"
    args = [
        "fit",
        "-c",
        str(ROOT / "configs/quickstart.yaml"),
        "--trainer.max_steps",
        str(steps),
        "--trainer.logger",
        "false",
        "--model.init_args.model",
        init or str(work / "teacher_init"),
    ]
    import os

    cwd = os.getcwd()
    os.chdir(work)  # the recipe's run directory (runs/quickstart) is relative to the working directory
    try:
        cli = main(args)
    finally:
        os.chdir(cwd)
    ev = next(cb for cb in cli.trainer.callbacks if isinstance(cb, HeldoutEval))
    acc = ev.history[-1]["eval/accuracy"]
    cli.model.model.save_pretrained(out, safe_serialization=True)
    cli.model.tokenizer.save_pretrained(out)
    print(f"teacher: {steps} GRPO steps, held-out accuracy {acc:.2f}", flush=True)
    if acc < target:
        print(f"WARNING: teacher accuracy {acc:.2f} < {target}; raise --teacher-steps", flush=True)
    return str(out), acc


def run(
    name: str,
    module,
    teacher: str | None,
    qs: dict,
    steps: int,
    eval_every: int,
    shape: tuple[int, int] | None = None,
) -> list[tuple[int, float]]:
    """``shape`` = (prompts per step, samples per prompt); None = the quickstart's."""
    d = qs["data"]["init_args"]
    rc = qs["rollout"]  # the RolloutCallback section of the recipe
    batch, group = shape or (d["batch_size"], rc["group_size"])
    ev = HeldoutEval(every_n_steps=eval_every)
    cbs = [
        RolloutCallback(
            rewards=[ExactAnswerReward()], group_size=group, sampling=SamplingConfig(**rc["sampling"])
        ),
        ev,
    ]
    if teacher is not None:
        cbs.insert(1, TeacherRouter({"addition": teacher}))
    dm = PromptDataModule(task=d["task"], task_args=d["task_args"], batch_size=batch)
    L.seed_everything(0, verbose=False)
    t0 = time.perf_counter()
    tr = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=cbs,
    )
    tr.fit(module, datamodule=dm)
    curve = [(int(h["step"]), h["eval/accuracy"]) for h in ev.history]
    print(
        f"{name}: {steps} steps in {time.perf_counter() - t0:.0f}s, final held-out {curve[-1][1]:.2f}",
        flush=True,
    )
    return curve


def steps_to(curve, level: float) -> str:
    return next((str(s) for s, a in curve if a >= level), f">{curve[-1][0]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", help="a trained teacher directory (skips teacher training)")
    ap.add_argument("--teacher-steps", type=int, default=None, help="default: the quickstart's max_steps")
    ap.add_argument("--teacher-init", help="continue the teacher's GRPO training from this model directory")
    ap.add_argument("--steps", type=int, default=150, help="RL iterations per student run")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--student-layers", type=int, default=2)
    ap.add_argument("--student-hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3, help="default lr of every run without its own @lr")
    ap.add_argument(
        "--runs",
        default="grpo@recipe,grpo@recipe:64x4,reverse_kl_full,reverse_kl_full:64x4,"
        "reverse_kl_sampled:64x4,reverse_kl_sampled+baseline:64x4",
        help="comma list of grpo | <distill loss>[+baseline], each optionally @<lr> (@recipe = the "
        "quickstart's lr) and :<prompts>x<samples> per step (default: the quickstart's 16x16); "
        "+baseline = opd_baseline (leave-one-out) for reverse_kl_sampled",
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    qs = quickstart()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t_steps = a.teacher_steps or qs["trainer"]["max_steps"]
        teacher, t_acc = (a.teacher, None) if a.teacher else train_teacher(work, t_steps, 0.9, a.teacher_init)
        student = build_tiny_model(
            work / "student",
            layers=a.student_layers,
            hidden=a.student_hidden,
            heads=2,
            tokenizer="char",
            seed=123,
        )
        mi = qs["model"]["init_args"]
        recipe_lr = mi["optimizer"]["init_args"]["lr"]
        curves = {}
        for spec in a.runs.split(","):
            spec, _, shape_s = spec.partition(":")
            name, _, lr_s = spec.partition("@")
            lr = recipe_lr if lr_s == "recipe" else float(lr_s) if lr_s else a.lr
            shape = tuple(int(x) for x in shape_s.split("x")) if shape_s else None
            common = {
                "model": str(student),
                "advantage": mi["advantage"],
                "policy_loss": mi["policy_loss"],
                "loss_agg": mi["loss_agg"],
                "seed": 0,
                "optimizer": lambda p, lr=lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0),
            }
            label = f"{name} lr={lr:g}" + (f" {shape_s}" if shape_s else "")
            if name == "grpo":
                curves[label] = run(
                    f"GRPO alone, {label}", PolicyModule(**common), None, qs, a.steps, a.eval_every, shape
                )
            else:
                loss, _, extra = name.partition("+")
                mod = DistillModule(**common, losses={loss: 1.0}, opd_baseline=extra == "baseline")
                curves[label] = run(f"OPD {label}", mod, teacher, qs, a.steps, a.eval_every, shape)
            if t_acc is None:  # teacher given: measure it with the same evaluation (greedy, held-out)
                t_acc = _teacher_acc(teacher, qs)
        names = list(curves)
        print(
            f"\nteacher held-out accuracy: {t_acc:.2f}   (50% = {0.5 * t_acc:.2f}, 80% = {0.8 * t_acc:.2f})"
        )
        print(f"student: {a.student_layers} layers, hidden {a.student_hidden}, same init for every run")
        print("\nheld-out greedy accuracy by optimizer step")
        print(f"{'step':>6} " + " ".join(f"{n:>24}" for n in names))
        for i, (s, _) in enumerate(curves[names[0]]):
            print(
                f"{s:>6} "
                + " ".join(f"{curves[n][i][1]:>24.2f}" if i < len(curves[n]) else " " * 24 for n in names)
            )
        print(f"\n{'steps to':>12} " + " ".join(f"{n:>24}" for n in names))
        for frac in (0.5, 0.8):
            print(
                f"{f'{int(frac * 100)}% teacher':>12} "
                + " ".join(f"{steps_to(curves[n], frac * t_acc):>24}" for n in names)
            )
        print(f"\ntotal {time.perf_counter() - t0:.0f}s")


def _teacher_acc(path: str, qs: dict) -> float:
    from lit_rl.data.prompts import render_prompt
    from lit_rl.data.tasks import get_task
    from lit_rl.models.loading import load_causal_lm, load_tokenizer

    d = qs["data"]["init_args"]
    _, held = get_task(d["task"], **d["task_args"])
    model, tok = load_causal_lm(path).eval(), load_tokenizer(path)
    hits = 0
    with torch.no_grad():
        for p in held:
            ids = torch.tensor([render_prompt(p, tok)])
            out = model.generate(
                input_ids=ids,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                max_new_tokens=qs["trainer"]["callbacks"][0]["init_args"]["sampling"]["max_new_tokens"],
            )
            hits += tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip() == p.answer
    return hits / len(held)


if __name__ == "__main__":
    main()
