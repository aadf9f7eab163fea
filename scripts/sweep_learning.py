r"""Run learning tests under several CPU kernel sets and seeds, and print what each run measured.

Each run is its own ``pytest`` subprocess with ``ATEN_CPU_CAPABILITY`` (which CPU kernels torch dispatches to:
``default``, ``avx2``, ``avx512``; each gives another floating-point trajectory) and ``LIT_RL_TEST_SEED`` (the
seed offset of tests/_learning.py) set; the tests append their measured numbers to ``LIT_RL_TEST_RECORD``
(a JSON-lines file), which this script reads back. One table row per (measurement, kernels, seed).

    python scripts/sweep_learning.py \
        tests/test_reward_model.py::test_bradley_terry_rm_reaches_90_percent_heldout_and_scores_as_a_reward
    python scripts/sweep_learning.py --design full --seeds 0 1 2 TEST...   # every kernel set x every seed
    python scripts/sweep_learning.py --design latin TEST...   # seed i with kernel set i (3 runs, not 9)
    python scripts/sweep_learning.py --json sweep.jsonl TEST...   # also keep the raw records

Exit code: 1 if any run failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPS = ["default", "avx2", "avx512"]


def plan(design: str, caps: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    if design == "full":
        return [(c, s) for s in seeds for c in caps]
    return [(caps[i % len(caps)], s) for i, s in enumerate(seeds)]  # latin: seed i <-> kernel set i


def run_one(
    tests: list[str], cap: str, seed: int, timeout: float, log_dir: str | None = None
) -> tuple[int, float, list[dict]]:
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        rec = f.name
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": cap,
        "LIT_RL_TEST_SEED": str(seed),
        "LIT_RL_TEST_RECORD": rec,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.monotonic()
    try:
        rc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
            cwd=ROOT,
            env=env,
            timeout=timeout,
            check=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        code, out = rc.returncode, rc.stdout
    except subprocess.TimeoutExpired:
        code, out = 124, "timed out"
    secs = time.monotonic() - t0
    if code != 0:
        tail = [ln for ln in out.splitlines() if ln.startswith(("E ", "FAILED", "ERROR"))][
            -15:
        ] or out.splitlines()[-15:]
        print(f"--- {' '.join(tests)} [{cap}, seed {seed}] exit {code}:\n" + "\n".join(tail), file=sys.stderr)
        if log_dir:  # the whole pytest output, for the cause (the tail above is often only warnings)
            name = tests[0].rsplit("::", 1)[-1].replace("/", "_")[:60]
            path = Path(log_dir) / f"{name}.{cap}.s{seed}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(out)
            print(f"    full output: {path}", file=sys.stderr)
    rows = [json.loads(line) for line in Path(rec).read_text().splitlines() if line.strip()]
    os.unlink(rec)
    return code, secs, rows


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + " ".join(fmt(x) for x in v) + "]"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="+", help="pytest node ids")
    ap.add_argument(
        "--each",
        action="store_true",
        help="one pytest process per test (default: all tests in one process per kernels x seed)",
    )
    ap.add_argument("--design", choices=["latin", "full"], default="latin")
    ap.add_argument("--caps", nargs="+", default=CAPS, choices=CAPS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("--log-dir", help="write the whole pytest output of every failed run into this folder")
    ap.add_argument("--json", help="append every record (with exit code and seconds) to this JSON-lines file")
    args = ap.parse_args(argv)
    failed = 0
    print(f"{'measurement':<44} {'kernels':<8} {'seed':>4} {'exit':>4} {'secs':>6}  values", flush=True)
    groups = [[t] for t in args.tests] if args.each else [args.tests]
    for tests in groups:
        for cap, seed in plan(args.design, args.caps, args.seeds):
            code, secs, rows = run_one(tests, cap, seed, args.timeout, args.log_dir)
            failed += code != 0
            for r in rows or [{"name": "(no record) " + tests[0].rsplit("::", 1)[-1], "cpu": "?"}]:
                if r["cpu"] not in ("?", cap.upper()):
                    print(f"warning: asked for {cap} kernels, torch used {r['cpu']}", file=sys.stderr)
                vals = {k: v for k, v in r.items() if k not in ("name", "seed", "cpu")}
                print(
                    f"{r['name'][:44]:<44} {cap:<8} {seed:>4} {code:>4} {secs:>6.0f}  "
                    + " ".join(f"{k}={fmt(v)}" for k, v in vals.items()),
                    flush=True,
                )
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(
                            json.dumps(
                                {**r, "kernels": cap, "tests": tests, "exit": code, "secs": round(secs, 1)}
                            )
                            + "\n"
                        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
