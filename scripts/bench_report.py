"""Size and load time of the `lit-rl inspect` report for quickstart-sized runs, measured in headless Chromium.

The rollout files are synthesised in the RolloutInspector format with the quickstart's shapes (three tally-mark
operands, one-token answers, groups of 16, 64 rows kept per step, a reward error in ~1 % of rows), not taken
from a real 800-step run. Load time = the page's own ``performance.now()`` after its first render (navigation
start -> HTML parsed, JSON parsed, first page of rows and the curves drawn), read back from the DOM; the
same number for an empty page is printed first, as the machine's baseline (it grows with CPU contention).

    python scripts/bench_report.py            # 200 and 800 steps x 64 rows
    python scripts/bench_report.py 50 200     # other step counts
"""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from lit_rl.report import write_report
from lit_rl.report.chromium import dump_dom


def synth_run(root: Path, steps: int, rows: int = 64, group: int = 16, seed: int = 0) -> Path:
    rng = random.Random(seed)
    triples = [(a, b, c) for a in range(10) for b in range(10) for c in range(10) if a + b + c <= 9]
    d = root / "rollouts"
    d.mkdir(parents=True)
    with open(d / "metrics.jsonl", "w") as m:
        for s in range(1, steps + 1):
            p_ok = min(0.95, 0.1 + s / steps)
            m.write(
                json.dumps(
                    {
                        "step": s,
                        "reward/mean": round(p_ok, 4),
                        "rollout/response_len_mean": 1.0,
                        "reward/invalid_frac": 0.01,
                    }
                )
                + "\n"
            )
            if s % 25 == 0:
                m.write(json.dumps({"step": s, "eval/accuracy": round(p_ok * 0.9, 4)}) + "\n")
            with open(d / f"step_{s:06d}.jsonl", "w") as f:
                for g in range(rows // group):
                    a, b, c = rng.choice(triples)
                    prompt = "|" * a + "+" + "|" * b + "+" + "|" * c + "="
                    rewards = [float(rng.random() < p_ok) for _ in range(group)]
                    mean = sum(rewards) / group
                    for k in range(group):
                        err = "exact: ValueError: synthetic failure" if rng.random() < 0.01 else None
                        out = str(a + b + c) if rewards[k] else str(rng.randrange(10))
                        f.write(
                            json.dumps(
                                {
                                    "step": s,
                                    "row": g * group + k,
                                    "group": s * 16 + g,
                                    "uid": f"{a}+{b}+{c}",
                                    "prompt": prompt,
                                    "answer": str(a + b + c),
                                    "completion": out,
                                    "reward": None if err else rewards[k],
                                    "components": {"exact": None if err else rewards[k]},
                                    "advantage": round(rewards[k] - mean, 4),
                                    "finish": "length",
                                    "length": 1,
                                    "policy_version": s - 1,
                                    "staleness": 0,
                                    "logprob": round(-rng.random() * 2, 4),
                                    "error": err,
                                    "pick": "random",
                                }
                            )
                            + "\n"
                        )
    return root


BASELINE = (
    "<!DOCTYPE html><html><body><script>document.body.dataset.loadMs = performance.now().toFixed(1);"
    "</script></body></html>"
)


def load_ms(url: str) -> float:
    return float(re.search(r'data-load-ms="([0-9.]+)"', dump_dom(url)).group(1))


def measure(steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = synth_run(Path(tmp) / f"run{steps}", steps)
        t0 = time.perf_counter()
        out = write_report(run)
        build_s = time.perf_counter() - t0
        loads = [load_ms(out.as_uri()) for _ in range(3)]
        return {
            "steps": steps,
            "rows": steps * 64,
            "size_mb": out.stat().st_size / 1e6,
            "build_s": build_s,
            "load_ms_median": sorted(loads)[1],
            "load_ms_all": loads,
        }


def main(argv: list[str]) -> None:
    counts = [int(a) for a in argv] or [200, 800]
    with tempfile.TemporaryDirectory() as tmp:  # an empty page: Chromium's own start-up on this machine, now
        empty = Path(tmp) / "empty.html"
        empty.write_text(BASELINE)
        base = sorted(load_ms(empty.as_uri()) for _ in range(3))
    print(f"empty page (machine baseline): median {base[1]:.0f} ms of {', '.join(f'{x:.0f}' for x in base)}")
    print(f"{'steps':>6} {'rows':>7} {'size MB':>8} {'build s':>8} {'load ms (median of 3)':>22}  all loads")
    for n in counts:
        r = measure(n)
        print(
            f"{r['steps']:>6} {r['rows']:>7} {r['size_mb']:>8.2f} {r['build_s']:>8.2f} {r['load_ms_median']:>22.0f}"
            f"  {', '.join(f'{x:.0f}' for x in r['load_ms_all'])}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
