"""A `lit-rl fit` piped to a file (not a terminal) prints progress lines and none of the known noise of the
libraries underneath (``lit_rl/cli/quiet.py``); ``--verbose`` brings that noise back. A deny-list of the lines
seen before issue 40 (``tests/test_cli_output.py`` is the allow-list of the quickstart's whole output)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NOISE = [
    r"\(\w+ pid=\d+\) (INFO|WARNING|DEBUG) ",  # any vLLM log line (its format)
    r"Failed to load weights",
    r"Reloading (weights inplace|and processing weights)",
    r"reset prefix cache",
    r"Triton is (installed|not installed)",
    r"torch\.distributed\.reduce_op",
    r"sync_dist=True",
    r"Total length of `\w+` across ranks is zero",
    r"Generating \w+ split",
    r"Setting accelerator to CPU",
    r"💡 Tip",
    r"LeafSpec",
    r"Invalid process group",
    r"\[rank\d+\]: Traceback",
    r"Traceback \(most recent call last\)",
    r"NUMA binding",  # vLLM's CPU worker, through c10's log (TORCH_CPP_LOG_LEVEL)
]


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    for k in (
        "PYTHONWARNINGS",
        "LIT_RL_VERBOSE",
        "VLLM_LOGGING_LEVEL",
        "HF_DATASETS_DISABLE_PROGRESS_BARS",
        "TORCH_CPP_LOG_LEVEL",
    ):
        env.pop(k, None)
    # a fresh shell's environment: an in-process vLLM engine of an earlier test in this pytest process exports
    # VLLM_DIST_IDENT, which a new vLLM process then warns about as unknown (seen in the slow suite's order)
    env.pop("VLLM_DIST_IDENT", None)
    return env


def _fit(root: Path, config: str, *extra: str, timeout: int = 300) -> str:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lit_rl.cli",
            "fit",
            "-c",
            config,
            "--trainer.default_root_dir",
            str(root),
            *extra,
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return out


def noise(out: str) -> list[str]:
    lines = [ln.strip() for ln in re.split(r"[\r\n]", out)]
    return [ln for ln in lines if any(re.search(p, ln) for p in NOISE)]


def progress(out: str) -> list[str]:
    return re.findall(r"^Iteration \d+/\d+: reward/mean [-\d.e]+, [\d.]+ s/it$", out, flags=re.MULTILINE)


def test_quickstart_piped_prints_progress_and_no_noise(tmp_path):
    """The quickstart, evaluating at iteration 2, piped: progress lines at iterations 1 and 3 (the last), the
    evaluation's line, no noise. configs/grpo.yaml (no HeldoutEval: the deliberately empty validation loader
    Lightning warned about) on the same model: no noise either; with --verbose that notice and Lightning's
    litlogger tip are back (what is dropped is only hidden)."""
    out = _fit(
        tmp_path / "qs",
        "configs/quickstart.yaml",
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "2",
        "--checkpoint.every_n_iterations",
        "3",
    )
    assert noise(out) == [], "\n" + out[-4000:]
    assert [ln.split(":")[0] for ln in progress(out)] == ["Iteration 1/3", "Iteration 3/3"], out[-4000:]
    assert re.search(r"^Evaluation at iteration 2: eval/accuracy [\d.e-]+", out, flags=re.MULTILINE), out[
        -4000:
    ]

    grpo = [
        "configs/grpo.yaml",
        "--trainer.max_steps",
        "1",
        "--model.init_args.model",
        str(tmp_path / "qs" / "model"),
    ]
    out = _fit(tmp_path / "grpo", *grpo)
    assert noise(out) == [] and len(progress(out)) == 1, "\n" + out[-4000:]
    loud = _fit(tmp_path / "grpo_verbose", *grpo, "--verbose")
    assert any("Total length of `NoEvaluation` across ranks is zero" in ln for ln in noise(loud)), loud[
        -4000:
    ]
    assert any("💡 Tip" in ln for ln in noise(loud)), loud[-4000:]
    assert len(progress(loud)) == 1


def test_noise_patterns_catch_the_lines_seen_before():
    seen = """(MainProcess pid=8465) WARNING 12-05 05:11:24 [layerwise.py:266] RotaryEmbedding: Failed to load weights
(MainProcess pid=8465) INFO 12-05 05:11:24 [block_pool.py:861] Successfully reset prefix cache
/x/result.py:433: It is recommended to use `self.log('step', ..., sync_dist=True)` when logging on epoch level
[rank0]: ValueError: Invalid process group specified
Iteration 1/3: reward/mean 0.0078, 0.41 s/it"""
    assert len(noise(seen)) == 4 and progress(seen) == ["Iteration 1/3: reward/mean 0.0078, 0.41 s/it"]


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_run_is_quiet_and_exits_cleanly(tmp_path):
    """configs/grpo_vllm.yaml, 2 iterations: no vLLM INFO / WARNING line (3 per weight sync before), no sync_dist
    advice (vLLM's in-process process group made Lightning think it was distributed), and no
    "[rank0]: ... Invalid process group specified" at exit (the engine is closed before the process group)."""
    pytest.importorskip("vllm")
    out = _fit(
        tmp_path,
        "configs/grpo_vllm.yaml",
        "--trainer.max_steps",
        "2",
        "--trainer.val_check_interval",
        "2",
        "--rollout.group_size",
        "2",
        "--data.init_args.batch_size",
        "4",
        timeout=600,
    )
    assert noise(out) == [], "\n" + out[-4000:]
    assert len(progress(out)) == 2 and "Evaluation at iteration 2:" in out, out[-4000:]


API = """\
import lightning as L
from lit_rl.learners import PolicyModule
from lit_rl.callbacks import RolloutCallback
from lit_rl.data import PromptDataModule
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.engine import SamplingConfig

tiny = {"layers": 1, "hidden": 32, "heads": 2, "tokenizer": "char"}
policy = PolicyModule(model="model", tiny_if_missing=tiny, advantage="grpo", loss_agg="token_mean")
rollout = RolloutCallback(rewards=ExactAnswerReward(), group_size=2, sampling=SamplingConfig(max_new_tokens=1))
trainer = L.Trainer(max_steps=1, log_every_n_steps=1, enable_progress_bar=False, callbacks=[rollout])
trainer.fit(policy, datamodule=PromptDataModule(task="addition", batch_size=1))
"""


@pytest.mark.slow  # a fresh interpreter (the filters are installed on import): ~30 s on 2 shared cores
def test_the_python_api_is_as_quiet_as_the_cli(tmp_path):
    """README's "As a library" (PolicyModule + RolloutCallback in a plain Lightning Trainer), one iteration:
    none of the lines the CLI drops (Lightning's two litlogger/litmodels tips, its LeafSpec and NoEvaluation
    warnings, DeepSpeed's accelerator notice when the tiny model is saved) -- importing lit_rl drops them too."""
    (tmp_path / "api.py").write_text(API)
    p = subprocess.run(
        [sys.executable, "api.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=1` reached." in out
    assert noise(out) == [], "\n" + out[-4000:]
