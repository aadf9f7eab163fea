"""configs/agent_openai_calculator.yaml (docs/guides/agents.md "Any agent program") through `lit-rl fit`: its
printed config trains two iterations of the openai-client calculator agent (examples/openai_calculator_agent.py)
on the tiny model, the endpoint serving HFEngine, and evaluates held-out episodes through the same program."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from lit_rl.cli import main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs/agent_openai_calculator.yaml"


def _printed() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["fit", "-c", str(RECIPE), "--print_config"])
    return yaml.safe_load(out.getvalue())


def _shrunk(tmp_path: Path, model: str, steps: int, real: bool) -> Path:
    cfg = _printed()
    (roll,) = [
        c["init_args"]
        for c in cfg["trainer"]["callbacks"]
        if c["class_path"].endswith(".AgentProgramRolloutCallback")
    ]
    loop = roll["agent"]["init_args"]
    assert loop["program"] == "examples/openai_calculator_agent.py:calculator_agent"
    loop["program"] = str(ROOT / loop["program"])  # a file path from the repository root
    if not real:  # the tiny model: no demonstration, HFEngine, groups of 2, 4 new tokens
        loop.update(program_args={"demonstrations": 0}, engine=None)
        roll["group_size"] = 2
        roll["sampling"]["max_new_tokens"] = 4
    cfg["model"]["init_args"]["model"] = model
    cfg["trainer"].update(
        max_steps=steps,
        val_check_interval=1,
        default_root_dir=str(tmp_path / "run"),
        enable_progress_bar=False,
    )
    (ev,) = [c["init_args"] for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith(".AgentEval")]
    ev.update(max_prompts=2, baseline=False)
    cfg["data"]["init_args"]["batch_size"] = 2
    (insp,) = [
        c["init_args"] for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith(".RolloutInspector")
    ]
    insp["every_n_steps"] = 1
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow  # ~20 s: two iterations and two evaluations of 4 agent-program episodes
def test_openai_agent_recipe_trains_on_the_tiny_model(tmp_path, monkeypatch, tiny_model_dir):
    path = _shrunk(tmp_path, str(tiny_model_dir), 2, real=False)
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "-c", str(path)])
    assert cli.model.iteration == 2
    rows = [r for r in log_rows(tmp_path / "run" / "logs" / "metrics.csv") if "agent/calls_per_episode" in r]
    # 4 new tokens hold no tool call: every episode is one call, its reply scored; nothing failed or broke
    assert [float(r["agent/calls_per_episode"]) for r in rows] == [1.0, 1.0]
    for key in ("agent/prefix_breaks", "agent/program_errors", "agent/episodes_timed_out", "agent/no_calls"):
        assert [float(r[key]) for r in rows] == [0.0, 0.0], key
    logged = set().union(*log_rows(tmp_path / "run" / "logs" / "metrics.csv"))
    assert {"eval/accuracy", "rollout/tokens_per_episode", "tools/calls_per_episode", "reward/mean"} <= logged
    assert list((tmp_path / "run" / "rollouts").glob("step_*.jsonl"))


@pytest.mark.real_ckpt
@pytest.mark.slow
def test_openai_agent_recipe_on_smollm2(tmp_path, monkeypatch, smollm2_dir):
    """One iteration of the recipe as written (vLLM in the process, one demonstration) on SmolLM2."""
    pytest.importorskip("vllm")
    path = _shrunk(tmp_path, smollm2_dir, 1, real=True)
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "-c", str(path)])
    assert cli.model.iteration == 1
    (row,) = [
        r for r in log_rows(tmp_path / "run" / "logs" / "metrics.csv") if "agent/calls_per_episode" in r
    ]
    assert float(row["agent/calls_per_episode"]) >= 1.0 and float(row["agent/program_errors"]) == 0.0
    logged = set().union(*log_rows(tmp_path / "run" / "logs" / "metrics.csv"))
    assert {"eval/accuracy", "tools/valid_call_rate", "rollout/success_frac"} <= logged
