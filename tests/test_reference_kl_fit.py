"""Issue 53's measurement through ``lit-rl fit`` (``scripts/reference_kl_truncated.py``, a real subprocess): the
quickstart's tiny model as the policy, a perturbed copy as ``ReferenceKL.path``, one iteration of one-token rows
sampled with top_k 2. The default ``kind`` (auto → exact) logs the full-vocabulary KL(π‖π_ref) at the rollout's
positions, which the script's probe recomputes independently in float64 from materialised logits; the sampled k1
misses it by many standard errors.

Measured with 2,048 rows (``python scripts/reference_kl_truncated.py``): exact KL 1.3818 at the
positions; top_k 2: k1 0.7896, k3 0.9894, auto 1.3818; top_p 0.4: k1 1.2419, k3 1.3933, auto 1.3818; plain
sampling: k1 1.3915, k3 (= auto) 1.3937 (standard error of a sampled estimate 0.034-0.038).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fit_logs_the_exact_kl_under_top_k(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "scripts/reference_kl_truncated.py"), "--out", str(out)]
    cmd += ["--rows", "512", "--kinds", "k1", "auto", "--samplers", "top_k 2", "--noise", "0.2"]
    subprocess.run(cmd, check=True, cwd=tmp_path, timeout=1800)
    got = {r["kind"]: r for r in json.loads((out / "results.json").read_text())}
    exact = got["auto"]["exact_kl"]
    assert got["k1"]["exact_kl"] == exact  # the same prompts, the same positions
    assert got["auto"]["kl/mean"] == pytest.approx(exact, rel=1e-5)  # float32 chunked against float64
    assert exact - got["k1"]["kl/mean"] > 5 * got["k1"]["se_sampled"]  # the sampled estimator: biased low
