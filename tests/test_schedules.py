"""``CosineDecay`` (lit_rl/learners/schedules.py): the closed form per branch, its input errors, and a resumed run
with a larger ``trainer.max_steps`` spreading the rest of the decay over the new length (torch's
``CosineAnnealingLR`` keeps the old ``T_max`` in its state and climbs back up past it)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lit_rl.learners import CosineDecay

ROOT = Path(__file__).resolve().parents[1]


def _lrs(sched_factory, steps: int, base: float = 2e-3) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=base)
    sched = sched_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_to_zero_then_flat():
    # T = 4: factors (1 + cos(pi t / 4)) / 2 = 1, (2 + sqrt 2) / 4, 1/2, (2 - sqrt 2) / 4, 0, then 0 (flat past T)
    want = [1.0, (2 + math.sqrt(2)) / 4, 0.5, (2 - math.sqrt(2)) / 4, 0.0, 0.0]
    got = _lrs(lambda o: CosineDecay(o, total_steps=4), 6)
    assert got == pytest.approx([2e-3 * w for w in want], abs=1e-18)


def test_min_ratio_floors_the_decay():
    # m = 0.1: factor = 0.1 + 0.9 * (1 + cos(pi t / 2)) / 2 = 1, 0.55, 0.1, 0.1
    got = _lrs(lambda o: CosineDecay(o, total_steps=2, min_ratio=0.1), 4, base=1.0)
    assert got == pytest.approx([1.0, 0.55, 0.1, 0.1], abs=1e-15)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"total_steps": 0}, "total_steps"),
        ({"total_steps": -1}, "total_steps"),
        ({"total_steps": 2.5}, "total_steps"),
        ({"total_steps": 4, "min_ratio": 1.5}, "min_ratio"),
        ({"total_steps": 4, "min_ratio": float("nan")}, "min_ratio"),
    ],
)
def test_bad_settings_name_the_field(kw, field):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=f"CosineDecay {field}="):
        CosineDecay(opt, **kw)


def test_state_restores_the_step_and_takes_total_steps_from_the_loading_run():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    first = CosineDecay(opt, total_steps=4)
    for _ in range(4):
        opt.step()
        first.step()
    assert opt.param_groups[0]["lr"] == 0.0 and "total_steps" not in first.state_dict()
    opt2 = torch.optim.SGD([p], lr=1.0)
    opt2.load_state_dict(opt.state_dict())  # the restored lr is the old run's 0.0
    longer = CosineDecay(opt2, total_steps=8)
    longer.load_state_dict(first.state_dict())
    assert longer.last_epoch == 4
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5, abs=1e-15)  # (1 + cos(pi 4/8)) / 2, not 0.0


def test_resumed_quickstart_with_more_steps_decays_over_the_new_length(tmp_path, monkeypatch):
    """The README's "resume (here: and extend)": 4 iterations, then --ckpt_path last --trainer.max_steps 8. The
    extension's lr at iterations 4..7 is 2e-3 · (1 + cos(π t / 8)) / 2 (with CosineAnnealingLR: 0 at t = 4 and
    rising back towards 2e-3)."""
    from lit_rl.cli import main
    from lit_rl.runs import log_rows

    monkeypatch.chdir(tmp_path)
    small = [
        "--data.init_args.batch_size",
        "4",
        "--rollout.group_size",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--checkpoint.every_n_iterations",
        "4",
    ]
    cfg = str(ROOT / "configs/quickstart.yaml")
    main(["fit", "-c", cfg, *small, "--trainer.max_steps", "4"])
    main(["fit", "-c", cfg, *small, "--trainer.max_steps", "8", "--ckpt_path", "last"])
    rows = [r for r in log_rows(tmp_path / "run/logs/metrics.csv") if "lr-AdamW" in r]
    got = {int(r["step"]): r["lr-AdamW"] for r in rows}
    want_first = {t + 1: 2e-3 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(4)}
    want_ext = {t + 1: 2e-3 * (1 + math.cos(math.pi * t / 8)) / 2 for t in range(4, 8)}
    assert got == pytest.approx({**want_first, **want_ext}, abs=1e-12), got
