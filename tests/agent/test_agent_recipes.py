"""The agent recipes (configs/agent_*.yaml) run through `lit-rl fit`: `--print_config` to a file, then that file
trains two iterations on the tiny model (small batches, short episodes), evaluates held-out episodes and logs
the episode metrics; on SmolLM2 (marker real_ckpt) one iteration of the recipe as written."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from lit_rl.cli import main
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[2]
# the environment recipes (AgentRolloutCallback); agent_openai_calculator (an agent program through the OpenAI
# endpoint, AgentProgramRolloutCallback) runs in tests/agent/test_openai_agent_recipe.py
AGENT_RECIPES = sorted(
    p.stem
    for p in (ROOT / "configs").glob("agent_*.yaml")
    if "AgentProgramRolloutCallback" not in p.read_text()
)


def _callback(cfg: dict, name: str) -> dict:
    (cb,) = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("." + name)]
    return cb["init_args"]


def _printed(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*args, "--print_config"])
    return yaml.safe_load(out.getvalue())


def _shrunk(recipe: str, model: str, tmp_path: Path, steps: int, real: bool) -> Path:
    cfg = _printed(["fit", "-c", str(ROOT / f"configs/{recipe}.yaml")])
    cfg["model"]["init_args"]["model"] = model
    cfg["trainer"].update(
        max_steps=steps,
        val_check_interval=1,
        default_root_dir=str(tmp_path / "run"),
        enable_progress_bar=False,
    )
    roll = _callback(cfg, "AgentRolloutCallback")
    ev = _callback(cfg, "AgentEval")
    ev["max_prompts"] = 2
    _callback(cfg, "RolloutInspector")["every_n_steps"] = 1
    cfg["data"]["init_args"]["batch_size"] = 2
    if not real:  # the tiny model: groups of 2, two turns of 4 tokens, no demonstration (a char per token)
        roll["group_size"] = 2
        roll["sampling"]["max_new_tokens"] = 4
        roll["agent"]["init_args"]["max_turns"] = 2
        roll["agent"]["init_args"]["engine"] = None  # HFEngine: no vLLM start for two tiny iterations
        roll["agent"]["init_args"]["env_factory"]["init_args"]["demonstrations"] = 0
        ev["baseline"] = False
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("recipe", AGENT_RECIPES)
def test_agent_recipe_trains_from_its_printed_config(recipe, tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "-c", str(_shrunk(recipe, str(tiny_model_dir), tmp_path, 2, real=False))])
    assert cli.model.iteration == 2
    assert (tmp_path / "run" / "final_model" / "model.safetensors").exists()
    logged = set().union(*log_rows(tmp_path / "run" / "logs" / "metrics.csv"))
    want = {
        "reward/mean",
        "rollout/turns_mean",
        "rollout/tokens_per_episode",
        "tools/calls_per_episode",
        "tools/valid_call_rate",
        "rollout/success_frac",
        "eval/accuracy",
        "eval/turns_mean",
        "eval/tokens_per_episode",
        "lr-AdamW",
        "tokens_seen",
    }
    assert want <= logged, sorted(want - logged)
    assert list((tmp_path / "run" / "rollouts").glob("step_*.jsonl"))  # the inspector's per-turn records
    # held-out episodes of the untrained tiny model: 4 new tokens cannot hold a call, so a calculator episode
    # ends on its first reply (1 turn); the guessing game answers it with the reminder until max_turns (2); the
    # look-up's prompt (two tool schemas, a character per token: 958 tokens) and its first turn with the reminder
    # fill max_context_tokens (1024), which ends the episode after one turn
    turns = {
        r["eval/turns_mean"]
        for r in log_rows(tmp_path / "run" / "logs" / "metrics.csv")
        if "eval/turns_mean" in r
    }
    assert turns == {{"agent_calculator": 1.0, "agent_guess": 2.0, "agent_lookup": 1.0}[recipe]}
    # the curves: the plotted training points are the logged values, and the PNG is written
    (plot,) = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "AgentCurvePlot"]
    rows = [r for r in log_rows(tmp_path / "run" / "logs" / "metrics.csv") if r.get("rollout/turns_mean")]
    assert [v for _, v in plot.series["rollout/turns_mean"]] == [float(r["rollout/turns_mean"]) for r in rows]
    assert [s for s, _ in plot.series["rollout/turns_mean"]] == [1, 2]
    assert (tmp_path / "run" / "agent_curves.png").stat().st_size > 10_000
    assert [h["step"] for h in json.loads((tmp_path / "run" / "eval_history.json").read_text())] == [1.0, 2.0]


@pytest.mark.real_ckpt
@pytest.mark.slow
@pytest.mark.parametrize("recipe", AGENT_RECIPES)
def test_agent_recipe_on_smollm2(recipe, tmp_path, monkeypatch, smollm2_dir):
    pytest.importorskip("vllm")
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "-c", str(_shrunk(recipe, smollm2_dir, tmp_path, 1, real=True))])
    assert cli.model.iteration == 1
    logged = set().union(*log_rows(tmp_path / "run" / "logs" / "metrics.csv"))
    assert {"tools/valid_call_rate", "eval/accuracy", "rollout/success_frac"} <= logged
