"""``scripts/bench_optimizer.py`` on the tiny model: its table has the three AdamW variants, the loop is its
own reference, and the fused step computes the loop's update (float32 rounding apart)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_optimizer", ROOT / "scripts/bench_optimizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_three_variants_compute_one_update(tiny_model_dir, capsys):
    import torch

    threads = str(torch.get_num_threads())  # the bench sets torch's thread count: leave it as it was
    _bench().main(["--model", str(tiny_model_dir), "--threads", threads, "--repeats", "2"])
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("loop", "foreach", "fused"):
            rows[cells[0]] = cells
    assert list(rows) == ["loop", "foreach", "fused"]
    assert rows["loop"][2] == "1.00" and float(rows["loop"][4]) == 0.0
    assert float(rows["foreach"][4]) == 0.0  # the same elementwise ops in the same order
    # 3 steps at lr 2e-5 move a weight by ~6e-5; the fused kernel's rounding is ~1e-7 of that
    assert 0.0 <= float(rows["fused"][4]) < 1e-6
