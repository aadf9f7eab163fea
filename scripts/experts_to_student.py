"""From experts to a student: the lecture's pipeline in one resumable command
(docs/experiments/experts-to-student.md "From experts to a student").

1. **Experts**: one per domain, by GRPO from ``--model`` on that domain's chat prompts
   (``configs/e2s/expert.yaml``, task ``chat_mixed`` with ``train_domains: [<domain>]``), measured on every
   domain's held-out prompts; then **forgetting**: GRPO on the second domain starting from the first domain's
   expert (what RL on one domain does to another).
2. **Students**: a fresh ``--model`` on all domains at once (``configs/e2s/student.yaml``), the same iterations,
   prompts and seeds for every variant but ``grpo_x2``: ``opd_multi`` on-policy distillation from every expert
   (TeacherRouter by domain); ``grpo`` GRPO alone; ``opd_single`` the first domain's expert for every domain (the
   coverage gap); ``opsd`` self-distillation, the student's own weights with the answer in the teacher's prompt
   (no external teacher); ``opsd_frozen`` the same with the student's starting weights as the teacher;
   ``opd_lora_r<R>`` / ``grpo_lora_r<R>`` a LoRA student at each ``--lora-ranks`` rank under OPD and under GRPO;
   ``grpo_x2`` GRPO alone for twice the iterations (an OPD iteration costs more: this is GRPO at about OPD's wall
   time). ``--variants`` picks some; stage 1 runs only when one of them reads an expert.
3. **Report**: ``<out>/report.md`` (per-domain held-out accuracy at the end, at the smallest final wall
   time of all students and at ``opd_multi``'s, wall time, student tokens, peak memory; forgetting) and
   ``<out>/e2s.png`` (accuracy against wall time and against student tokens, one panel per domain).

Every run is ``lit-rl fit -c <run dir>/recipe.yaml --ckpt_path last_or_new`` in its own process (the recipe is
the stage's template with the run's model, domains, budget and seed filled in). A finished run writes
``DONE.json`` (its held-out history, elapsed time, peak resident memory) and is skipped when the command runs
again; an interrupted one resumes from its last checkpoint. The report is rebuilt from the ``DONE.json``
files.

    lit-rl models smollm2 runs/smollm2
    python scripts/experts_to_student.py --model runs/smollm2 --out runs/e2s --seeds 0,1 \
        --iterations 16 --expert-iterations 32 --eval-every 4 --jobs 2   # its table: ~2.7 h on 2 cores
    python scripts/experts_to_student.py --tiny --out /tmp/e2s_tiny      # smoke run on a tiny model, ~2-3 min
    python scripts/experts_to_student.py --model runs/smollm2 --out runs/opsd --variants opsd,opsd_frozen \
        --iterations 4 --eval-every 2        # self-distillation alone: no expert stage
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRIVILEGED = "{prompt} (The correct answer is {answer}.)"  # the OPSD teacher's prompt: the student's + answer
DONE = "DONE.json"


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/smollm2", help="the starting checkpoint of experts and students")
    ap.add_argument("--out", default="runs/e2s", help="where every run, the table and the plot go")
    ap.add_argument("--iterations", type=int, default=40, help="RL iterations of every student run")
    ap.add_argument("--expert-iterations", type=int, default=None, help="default: --iterations")
    ap.add_argument("--seeds", default="0", help="comma list; every student variant runs once per seed")
    ap.add_argument("--domains", default="addition,largest", help="comma list of chat_mixed domains")
    ap.add_argument("--heldout", type=int, default=64, help="held-out prompts per domain")
    ap.add_argument("--eval-every", type=int, default=8, help="iterations between held-out evaluations")
    ap.add_argument("--lora-ranks", default="8,64", help="comma list: a small and a large LoRA rank")
    ap.add_argument("--lora-lr", type=float, default=2e-4, help="learning rate of the LoRA students")
    ap.add_argument("--variants", default=None, help="comma list of student variants (default: all)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (each with OMP_NUM_THREADS = cores // jobs unless set): on 2 cores, 2 jobs finish "
        "the pipeline sooner; wall times then compare only within one --jobs setting",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="smoke mode: a tiny random model, 2 iterations, HFEngine"
    )
    a = ap.parse_args(argv)
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.domains = a.domains.split(",")
    a.lora_ranks = [int(r) for r in a.lora_ranks.split(",")]
    if a.tiny:
        a.iterations, a.heldout, a.eval_every, a.lora_ranks = 2, 4, 2, [2, 8]
    if a.jobs < 1:
        ap.error(f"--jobs={a.jobs} must be >= 1")
    a.expert_iterations = a.expert_iterations or a.iterations
    a.out = Path(a.out).resolve()
    return a


# ------------------------------------------------------------------------------------------------ recipes
def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs/e2s" / name).read_text())


def _recipe(cfg: dict, a, run_dir: Path, model: str, steps: int, seed: int, task_args: dict) -> dict:
    """The stage template with one run's model, budget, seed, prompts and run directory filled in."""
    cfg["seed_everything"] = seed
    if a.tiny:  # seconds per run: a few rows, a few tokens, generation in the trainer's process
        cfg["rollout"].update(engine={"class_path": "lit_rl.rollout.HFEngine"}, group_size=2)
        cfg["rollout"]["sampling"]["max_new_tokens"] = 4
        cfg["data"]["init_args"]["batch_size"] = 2
        cfg["model"]["init_args"].update(micro_batch_size=None, minibatch_size=None)
    t = cfg["trainer"]
    # `steps` counts RL iterations; the trainer counts optimizer steps (one per minibatch of an iteration's rows)
    rows = cfg["data"]["init_args"]["batch_size"] * cfg["rollout"]["group_size"]
    per_iteration = -(-rows // (cfg["model"]["init_args"].get("minibatch_size") or rows))
    t.update(
        default_root_dir=str(run_dir),
        max_steps=steps * per_iteration,
        val_check_interval=min(a.eval_every, steps),
    )
    cfg["checkpoint"]["every_n_iterations"] = min(a.eval_every, steps)
    cfg["model"]["init_args"]["model"] = model
    cfg["data"]["init_args"]["task_args"] = {"domains": a.domains, "heldout": a.heldout, **task_args}
    return cfg


def _as_grpo(cfg: dict) -> dict:
    """A student recipe turned into GRPO alone: PolicyModule, no teachers."""
    init = cfg["model"]["init_args"]
    for k in ("losses", "opd_baseline", "rl_coef"):
        init.pop(k)
    cfg["model"]["class_path"] = "lit_rl.learners.PolicyModule"
    cfg["trainer"]["callbacks"] = [
        c for c in cfg["trainer"]["callbacks"] if not c["class_path"].endswith("Router")
    ]
    return cfg


def _self_teacher(source: str = "self") -> dict:
    """OPSD: the student's own weights (``self``: current; ``self_frozen``: as at the start), reading its prompt
    with the answer appended."""
    return {"class_path": "lit_rl.callbacks.Teacher", "init_args": {"source": source, "template": PRIVILEGED}}


def _router(cfg: dict) -> dict:
    return next(c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("TeacherRouter"))[
        "init_args"
    ]


def student_variants(a, experts: dict[str, str]) -> dict[str, Callable[[dict], dict]]:
    """name -> function(recipe) -> recipe: each variant's change to configs/e2s/student.yaml."""
    first = a.domains[0]

    def teachers(spec: dict, fallback=None):
        def change(cfg):
            _router(cfg).update(teachers=spec, fallback=fallback)
            return cfg

        return change

    def lora(r: int, base):
        def change(cfg):
            cfg = base(cfg)
            cfg["model"]["init_args"]["lora"] = {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}
            cfg["model"]["init_args"]["optimizer"]["init_args"]["lr"] = a.lora_lr
            return cfg

        return change

    out = {
        "opd_multi": teachers(dict(experts)),
        "grpo": _as_grpo,
        "opd_single": teachers({first: experts[first]}, fallback=first),
        "opsd": teachers({d: _self_teacher() for d in a.domains}),
        # one frozen copy serves every domain (the fallback): a copy per domain would hold the same weights twice
        "opsd_frozen": teachers({first: _self_teacher("self_frozen")}, fallback=first),
    }
    for r in a.lora_ranks:
        out[f"opd_lora_r{r}"] = lora(r, out["opd_multi"])
        out[f"grpo_lora_r{r}"] = lora(r, _as_grpo)

    # An OPD iteration costs ~1.5-2x GRPO's (the teachers' forwards; every row is trained, where GRPO skips
    # groups without signal), so equal iterations are not equal wall time: GRPO alone for twice as long too.
    def grpo_x2(cfg):
        cfg = _as_grpo(cfg)
        cfg["trainer"]["max_steps"] *= 2
        return cfg

    out["grpo_x2"] = grpo_x2
    if a.variants:
        unknown = set(a.variants.split(",")) - set(out)
        if unknown:
            raise SystemExit(f"--variants: unknown {sorted(unknown)}; valid: {', '.join(out)}")
        out = {k: v for k, v in out.items() if k in a.variants.split(",")}
    return out


# ------------------------------------------------------------------------------------------------ running
def _say(line: str) -> None:
    # one write per line: with --jobs N, N threads report at once and print()'s separate newline interleaves
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(name: str, run_dir: Path, cfg: dict, threads: int | None = None) -> dict:
    """One ``lit-rl fit`` in its own process, skipped when its DONE.json exists (resumed when interrupted).
    ``threads`` sets the run's OMP_NUM_THREADS where the user has not (several runs side by side)."""
    done = run_dir / DONE
    if done.exists():
        _say(f"[skip] {name}: done ({done})")
        return json.loads(done.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    # One run at a time (--jobs 1): torch's own thread count (all cores) is the fastest on an idle machine; a
    # user who shares the cores sets OMP_NUM_THREADS, which the runs inherit (and which --jobs never overrides).
    cmd = [
        sys.executable,
        "-m",
        "lit_rl.cli",
        "fit",
        "-c",
        str(run_dir / "recipe.yaml"),
        "--ckpt_path",
        "last_or_new",
    ]
    _say(f"[run ] {name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    with (run_dir / "log.txt").open("a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak resident memory (KiB on Linux)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"{name} failed (exit {proc.returncode}); see {run_dir / 'log.txt'}. "
            "Run the command again to resume it."
        )
    summary = {
        "name": name,
        "elapsed_s": time.perf_counter() - t0,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "history": json.loads((run_dir / "heldout_history.json").read_text()),
    }
    done.write_text(json.dumps(summary, indent=1) + "\n")
    _say(f"[done] {name}: {summary['elapsed_s']:.0f}s, final {_fmt(summary['history'][-1])}")
    return summary


def _fmt(h: dict) -> str:
    return " ".join(f"{k.split('/')[-1]}={v:.2f}" for k, v in h.items() if k.startswith("eval/accuracy/"))


def pipeline(a) -> tuple[dict, dict]:
    """Stages 1 and 2; returns (expert-stage summaries, student summaries: variant -> one per seed).

    With ``--jobs N`` up to N runs go at once: the experts together, then the forgetting run and every
    student (they need the experts' final models). The first failure cancels the runs not yet started. When no
    student reads an expert (``--variants`` of GRPO / self-distillation runs only) the expert stage and the
    forgetting run are skipped."""
    model = a.model
    if a.tiny:
        from lit_rl.models.tiny import ensure_tiny_model

        model = str(ensure_tiny_model(a.out / "tiny_model", hidden=64, heads=2))
    threads = max(1, (os.cpu_count() or 1) // a.jobs) if a.jobs > 1 else None
    with ThreadPoolExecutor(a.jobs) as pool:

        def start(name: str, run_dir: Path, cfg: dict):
            return pool.submit(run, name, run_dir, cfg, threads)

        try:
            experts = {d: str(a.out / "experts" / d / "final_model") for d in a.domains}
            plans = [  # (variant, seed, recipe): built first, to see whether any reads an expert
                (name, seed, change(_student_recipe(a, model, name, seed)))
                for seed in a.seeds
                for name, change in student_variants(a, experts).items()
            ]
            # the expert stage only when a student reads an expert (e.g. --variants opsd,grpo reads none)
            needed = any(str(a.out / "experts") in yaml.safe_dump(cfg) for _, _, cfg in plans)
            pending = {}
            for d in a.domains if needed else []:
                cfg = _recipe(
                    _load("expert.yaml"), a, a.out / "experts" / d, model, a.expert_iterations, 0, {}
                )
                cfg["data"]["init_args"]["task_args"]["train_domains"] = [d]
                pending[f"expert_{d}"] = start(f"expert {d}", a.out / "experts" / d, cfg)
            expert_runs = {k: f.result() for k, f in pending.items()}
            pending = {}
            # forgetting: the first domain's expert trained on the second domain
            if needed and len(a.domains) > 1:
                first, second = a.domains[:2]
                run_dir = a.out / "experts" / f"{first}_then_{second}"
                cfg = _recipe(_load("expert.yaml"), a, run_dir, experts[first], a.expert_iterations, 0, {})
                cfg["data"]["init_args"]["task_args"]["train_domains"] = [second]
                pending[f"{first}_then_{second}"] = start(
                    f"expert {first}, then GRPO on {second}", run_dir, cfg
                )
            later = [
                (name, start(f"student {name} seed {seed}", _student_dir(a, name, seed), cfg))
                for name, seed, cfg in plans
            ]
            expert_runs.update({k: f.result() for k, f in pending.items()})
            students: dict[str, list[dict]] = {}
            for name, f in later:
                students.setdefault(name, []).append(f.result())
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return expert_runs, students


def _student_dir(a, name: str, seed: int) -> Path:
    return a.out / "students" / name / f"seed{seed}"


def _student_recipe(a, model: str, name: str, seed: int) -> dict:
    """configs/e2s/student.yaml filled in for one student run (before its variant's change)."""
    return _recipe(_load("student.yaml"), a, _student_dir(a, name, seed), model, a.iterations, seed, {})


# ------------------------------------------------------------------------------------------------ report
def _acc(h: dict, d: str) -> float:
    return h.get(f"eval/accuracy/{d}", float("nan"))


def _at_wall(history: list[dict], wall: float) -> dict:
    """The last evaluation made with at most ``wall`` seconds spent (the baseline when none: the step-0
    evaluation's own ``wall_s`` is the set-up before it, which in a tiny run can exceed a whole short run's)."""
    within = [h for h in history if h.get("wall_s", 0.0) <= wall + 1e-6]
    return within[-1] if within else history[0]


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def _cell(xs: list[float]) -> str:
    """Mean over seeds, with the range when there are several."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{_mean(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def report(a, expert_runs: dict, students: dict) -> str:
    ds = a.domains
    wall = min(s["history"][-1]["wall_s"] for runs in students.values() for s in runs)
    # and at the multi-teacher student's own end: the budget OPD used (grpo_x2 is GRPO given that much time)
    walls = [wall]
    if "opd_multi" in students:
        walls.append(min(r["history"][-1]["wall_s"] for r in students["opd_multi"]))
    head = [
        "run",
        *ds,
        "mean",
        *(f"mean @ {w:.0f} s" for w in walls),
        "wall s",
        "student tokens",
        "peak RSS GiB",
    ]
    blank = " |" * len(walls)
    lines = [
        f"Held-out greedy accuracy per domain ({a.heldout} prompts each), mean over seeds {a.seeds} (range);",
        f"students: {a.iterations} iterations each"
        + (f" (grpo_x2: {2 * a.iterations})" if "grpo_x2" in students else "")
        + "; `mean @ <s>`: the last evaluation",
        "within the smallest final wall time of all students, and within opd_multi's (evaluation time excluded).",
        *(
            [
                f"Runs went {a.jobs} at a time (`--jobs {a.jobs}`), so wall times compare within this table only."
            ]
            if a.jobs > 1
            else []
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    start = next(iter(students.values()))[0]["history"][0]
    lines.append(
        "| start (step 0) | "
        + " | ".join(f"{_acc(start, d):.2f}" for d in ds)
        + " | "
        + f"{_mean(_acc(start, d) for d in ds):.2f} |{blank} 0 | 0 | |"
    )
    for name, s in expert_runs.items():
        h = s["history"][-1]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{_acc(h, d):.2f}" for d in ds)
            + f" | {_mean(_acc(h, d) for d in ds):.2f} |{blank} {h['wall_s']:.0f} | "
            f"{h['student_tokens']:.0f} | {s['peak_rss_mb'] / 1024:.2f} |"
        )
    for name, runs in students.items():
        finals = [r["history"][-1] for r in runs]
        cells = [_cell([_acc(h, d) for h in finals]) for d in ds]
        mean = _cell([_mean(_acc(h, d) for d in ds) for h in finals])
        eq = " | ".join(
            _cell([_mean(_acc(_at_wall(r["history"], w), d) for d in ds) for r in runs]) for w in walls
        )
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {mean} | {eq} | "
            f"{_mean(h['wall_s'] for h in finals):.0f} | {_mean(h['student_tokens'] for h in finals):.0f} | "
            f"{max(r['peak_rss_mb'] for r in runs) / 1024:.2f} |"
        )
    first = ds[0]
    if not expert_runs:  # --variants that read no expert: no expert stage ran
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"Forgetting: {first} accuracy while another domain is trained (GRPO).",
        "",
        f"| run | trained on | {first} at start | lowest | at end |",
        "|---|---|---|---|---|",
    ]
    for name, s in expert_runs.items():
        trained = name.split("_then_")[-1] if "_then_" in name else name.removeprefix("expert_")
        if trained == first:
            continue
        accs = [_acc(h, first) for h in s["history"]]
        lines.append(f"| {name} | {trained} | {accs[0]:.2f} | {min(accs):.2f} | {accs[-1]:.2f} |")
    return "\n".join(lines) + "\n"


def plot(a, students: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = a.domains
    fig, axes = plt.subplots(2, len(ds), figsize=(5 * len(ds), 7), squeeze=False)
    for name, runs in students.items():
        n = min(len(r["history"]) for r in runs)  # seeds share the evaluation steps; mean over them
        for col, d in enumerate(ds):
            y = [_mean(_acc(r["history"][i], d) for r in runs) for i in range(n)]
            for row, key in enumerate(("wall_s", "student_tokens")):
                x = [_mean(r["history"][i].get(key, 0.0) for r in runs) for i in range(n)]
                axes[row][col].plot(x, y, "o-" if name.startswith("opd") else "s--", label=name, markersize=3)
    for col, d in enumerate(ds):
        axes[0][col].set_title(f"{d}: held-out greedy accuracy")
        axes[0][col].set_xlabel("wall seconds (evaluation excluded)")
        axes[1][col].set_xlabel("completion tokens sampled by the student")
        for row in (0, 1):
            axes[row][col].set_ylim(-0.02, 1.02)
            axes[row][col].grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    a = _args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    expert_runs, students = pipeline(a)
    (a.out / "report.md").write_text(report(a, expert_runs, students))
    plot(a, students, a.out / "e2s.png")
    print((a.out / "report.md").read_text())
    print(f"report: {a.out / 'report.md'}, plot: {a.out / 'e2s.png'} ({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
