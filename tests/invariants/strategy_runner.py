"""One rank of the multi-process invariants: ``python strategy_runner.py STRATEGY MODEL_DIR OUT_DIR ID...``.

Runs the EXACT-array rows with the given ids (``_grid.Combo.id``) one after another under a 2-process strategy
(ddp | fsdp | deepspeed_zero2 | deepspeed_zero3; CPU, gloo, float32) and writes each rank's violations as
``OUT_DIR/rank<r>.json`` ({id: [violation, ...]}). Lightning's launcher re-executes this script for rank 1.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the invariants package, _conformance

import torch

from invariants import _checks, _grid, _harness


def make_strategy(name: str):
    from lightning.pytorch.strategies import DDPStrategy

    from lit_rl.strategies import DeepSpeedZeROStrategy, FSDP2Strategy

    if name == "ddp":
        return DDPStrategy(find_unused_parameters=False)
    if name == "fsdp":
        return FSDP2Strategy()
    return DeepSpeedZeROStrategy(stage=int(name[-1]))


def main(name: str, model_dir: str, out_dir: str, ids: list[str]) -> None:
    rows = {c.id: c for c in _grid.covering_array(exact=True, start=len(_grid.covering_array()))}
    # DeepSpeed owns the optimizer step (NoStep's records would not be the reduced gradients): SGD with lr 0
    # keeps the weights where they are just the same.
    opt = functools.partial(torch.optim.SGD, lr=0.0) if name.startswith("deepspeed") else None
    results = {}
    for i in ids:
        run = _harness.run(
            rows[i].settings,
            model_dir,
            precision="32-true",
            optimizer=opt,
            trainer_kw={"strategy": make_strategy(name), "devices": 2},
        )
        results[i] = _checks.structure(run, _checks.FLOAT32) + _checks.distribution(run, _checks.FLOAT32)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
