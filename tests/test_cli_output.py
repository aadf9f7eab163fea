"""What a short quickstart prints, fresh and resumed: the progress bar, the lines lit_rl (and Lightning's
trainer setup) mean to print, and nothing else. An allow-list, not a deny-list: any new warning of a
dependency (transformers' per-call generation notices, DeepSpeed's accelerator notice, Lightning's tips and
its "dataloader is not resumable" on a resume lit_rl makes exact) fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = [
    r"Seed set to \d+",  # seed_everything: the config's seed, worth seeing
    r"GPU available: .*",  # Lightning's device summary
    r"TPU available: .*",
    r"HPU available: .*",
    r"[┏┃┡│└].*",  # the model summary table (rich)
    r"(Trainable|Non-trainable|Total) params: .*",
    r"Total estimated model params size \(MB\): .*",
    r"Modules in (train|eval) mode: \d+",
    r"Total FLOPs: .*",
    r"Restoring states from the checkpoint path at .*last\.ckpt",
    r"Restored all states from the checkpoint at .*last\.ckpt",
    r"`Trainer\.fit` stopped: `max_steps=\d+` reached\.",
    r"RolloutInspector: report written to .*report\.html \(rebuild with `lit-rl inspect .*`\)",
    r"Iteration .*",  # the progress bar (RichIterationProgressBar) and its metrics, wrapped onto more lines
    r"([\w/]+: [-+\d.e]+\s*)+",
    r"[\w/]+:|[-+\d.e]+",  # a bar metric wrapped between its name and its value (the width depends on the it/s)
    r"Validation .*",
    r"Evaluation at iteration \d+: .*",  # ProgressLog (stdout is no terminal here), as its "Iteration k/N"
    r"Sanity Checking.*",
]


def _run(root: Path, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONWARNINGS", None)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lit_rl.cli",
            "fit",
            "-c",
            "configs/quickstart.yaml",
            "--trainer.default_root_dir",
            str(root),
            "--checkpoint.every_n_iterations",
            "1",
            "--trainer.val_check_interval",
            "2",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout + p.stderr


def _foreign(out: str) -> list[str]:
    lines = [ln.strip() for ln in re.split(r"[\r\n]", out)]
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ln).strip() for ln in lines]  # terminal control codes
    return [ln for ln in lines if ln and not any(re.fullmatch(p, ln) for p in ALLOWED)]


def test_quickstart_output_has_no_foreign_lines(tmp_path):
    out = _run(tmp_path, "--trainer.max_steps", "2")
    assert "Iteration" in out and "report written" in out  # the allow-list is exercised, not vacuous
    assert _foreign(out) == [], "\n" + out[-4000:]
    resumed = _run(tmp_path, "--trainer.max_steps", "3", "--ckpt_path", "last")
    assert "Restored all states" in resumed
    assert _foreign(resumed) == [], "\n" + resumed[-4000:]  # "dataloader is not resumable" would be one


def test_allow_list_catches_a_foreign_line():
    noisy = "Iteration 1/2\n[transformers] Both `min_new_tokens` (=0) and `min_length`(=0) seem to have been set.\n"
    assert _foreign(noisy) == [
        "[transformers] Both `min_new_tokens` (=0) and `min_length`(=0) seem to have been set."
    ]
