"""How long ``lit-rl`` takes to answer what needs no model: ``--help`` and configuration errors.

Each case runs as a fresh ``python -m lit_rl.cli`` process (what a user waits for), ``--repeats`` times; the
table prints the median wall time and the median CPU time (user + system) of the child, with the early check
(``lit_rl/cli/precheck.py``) and without it (``LIT_RL_PRECHECK=0``: the full LightningCLI parser finds the same
error after importing torch and Lightning), side by side in one process. CPU time is the steadier number on a
shared machine; wall time is what a user waits on a quiet one.

    python scripts/bench_cli_startup.py [--repeats 3] [--no-full]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QS = str(ROOT / "configs/quickstart.yaml")


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
    typo = tmp / "typo.yaml"
    typo.write_text(Path(QS).read_text().replace("  group_size: 16", "  group_sise: 16"))
    return [
        ("--help", ["--help"]),
        ("unknown command (fitt)", ["fitt"]),
        ("config-file typo (group_sise:)", ["fit", "-c", str(typo)]),
        ("bad value (loss_agg token_meen)", ["fit", "-c", QS, "--model.init_args.loss_agg", "token_meen"]),
        ("flag typo (--trainer.max_stepz)", ["fit", "-c", QS, "--trainer.max_stepz", "3"]),
        ("group_size 0", ["fit", "-c", QS, "--rollout.group_size", "0"]),
        ("group_size 1 with grpo", ["fit", "-c", QS, "--rollout.group_size", "1"]),
    ]


def run(args: list[str], env: dict, cwd: Path) -> tuple[float, float, int, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "lit_rl.cli", *args, "--trainer.default_root_dir", str(cwd / "run")]
        if args[0] not in ("--help", "fitt")
        else [sys.executable, "-m", "lit_rl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = next((ln for ln in p.stderr.splitlines() if ln.startswith("lit-rl: error:")), "")
    return wall, cpu, p.returncode, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-full", action="store_true", help="skip the runs without the early check (slow)")
    args = ap.parse_args()
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; median of {args.repeats} runs; seconds")
    print(
        f"{'case':<34} {'exit':>4} {'wall':>7} {'cpu':>6} | {'full wall':>9} {'full cpu':>8} {'cpu ratio':>9}"
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, argv in cases(tmp):
            fast = [run(argv, base, tmp) for _ in range(args.repeats)]
            w, c = statistics.median(r[0] for r in fast), statistics.median(r[1] for r in fast)
            row = f"{name:<34} {fast[0][2]:>4} {w:>7.2f} {c:>6.2f} |"
            if args.no_full or argv[0] in ("--help", "fitt"):
                row += f" {'-':>9} {'-':>8} {'-':>9}"
            else:
                full = [run(argv, {**base, "LIT_RL_PRECHECK": "0"}, tmp) for _ in range(args.repeats)]
                fw, fc = statistics.median(r[0] for r in full), statistics.median(r[1] for r in full)
                row += f" {fw:>9.2f} {fc:>8.2f} {fc / max(c, 1e-9):>8.0f}x"
                if full[0][2] != fast[0][2]:
                    row += f"  (exit codes differ: {full[0][3]!r})"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
