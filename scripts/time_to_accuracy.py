r"""Wall time to held-out accuracy of a recipe, over seeds: the curve a user sees, launch to exit.

Runs ``lit-rl fit -c RECIPE`` once per seed, one after the other (each alone on the machine), with
``--seed_everything SEED`` and its own run directory, and timestamps every ``Evaluation at iteration k:
eval/accuracy x`` line the run prints (``ProgressLog``; piped output) against the moment the process was
launched: start-up, rollouts, updates and the evaluations themselves all count, as they do for a user. It
prints one table row per evaluation and seed, then per seed the first wall time at which held-out accuracy
reached ``--target`` (and whether every later evaluation stayed there), the run's total wall time and its
maximum resident set (``wait4``'s ``ru_maxrss`` of that child), and writes the curves to ``--plot``.

    python scripts/time_to_accuracy.py --seeds 0 1 2 --out runs/tta --plot docs/img/smollm2_tta.png
    python scripts/time_to_accuracy.py --seeds 0 -- --trainer.max_steps 8   # a short check

Arguments after ``--`` go to every ``lit-rl fit`` unchanged. The environment is passed through: what a user's
shell sets (``OMP_NUM_THREADS`` ...) applies, nothing is added.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

EVAL_LINE = re.compile(r"Evaluation at iteration (\d+): .*?eval/accuracy ([0-9.]+)")


def run_seed(recipe: str, seed: int, out: Path, extra: list[str]) -> dict:
    """One fit: ``{"seed", "evals": [(wall_s, iteration, accuracy)], "wall_s", "max_rss_mib", "rc"}``."""
    cmd = ["lit-rl", "fit", "-c", recipe, "--seed_everything", str(seed)]
    cmd += ["--trainer.default_root_dir", str(out / f"seed{seed}"), *extra]
    log = (out / f"seed{seed}.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    evals = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        m = EVAL_LINE.search(line)
        if m:
            evals.append((round(time.monotonic() - t0, 1), int(m.group(1)), float(m.group(2))))
            print(
                f"  seed {seed}: {evals[-1][0]:7.1f} s  iteration {m.group(1):>3}  accuracy {m.group(2)}",
                flush=True,
            )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    return {
        "seed": seed,
        "evals": evals,
        "wall_s": round(time.monotonic() - t0, 1),
        "max_rss_mib": usage.ru_maxrss // 1024,  # Linux: KiB
        "rc": proc.returncode,
    }


def reached(evals: list[tuple[float, int, float]], target: float) -> tuple[float | None, bool]:
    """(first wall time at accuracy >= target, whether every later evaluation stayed >= target)."""
    for i, (wall, _, acc) in enumerate(evals):
        if acc >= target:
            return wall, all(a >= target for _, _, a in evals[i:])
    return None, False


def plot(results: list[dict], target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in results:
        xs = [w / 60 for w, _, _ in r["evals"]]
        ax.plot(xs, [a for _, _, a in r["evals"]], marker="o", label=f"seed {r['seed']}")
    ax.axhline(target, color="gray", ls="--", lw=1)
    ax.axvline(15, color="gray", ls=":", lw=1)
    ax.set_xlabel("wall time since launch (min)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="configs/smollm2_addition.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/tta")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--plot", default=None, help="PNG of accuracy against wall time, one curve per seed")
    a = p.parse_args(argv)
    if not 0 < a.target <= 1:
        p.error(f"--target must be in (0, 1], got {a.target}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in a.seeds:
        print(f"seed {seed}: lit-rl fit -c {a.recipe} {' '.join(extra)}", flush=True)
        results.append(run_seed(a.recipe, seed, out, extra))
    (out / "time_to_accuracy.json").write_text(json.dumps(results, indent=1))
    print(
        f"\n| seed | exit | first >= {a.target} (s) | held after | last accuracy | run wall (s) "
        "| max RSS (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        first, held = reached(r["evals"], a.target)
        last = r["evals"][-1][2] if r["evals"] else float("nan")
        first_s = "not reached" if first is None else f"{first:.0f}"
        held_s = "yes" if held else "no"
        cells = [r["seed"], r["rc"], first_s, held_s, f"{last:.3f}", f"{r['wall_s']:.0f}", r["max_rss_mib"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if a.plot:
        plot(results, a.target, a.plot)
        print(f"plot: {a.plot}")
    return 1 if any(r["rc"] != 0 for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
