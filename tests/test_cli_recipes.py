"""Every recipe runs through the `lit-rl` CLI, takes the rollout settings as flags, and re-runs from its own
`--print_config` output; callback fragments compose."""

import shutil
from pathlib import Path

import pytest
import yaml

from lit_rl.cli import main
from lit_rl.core.settings import flat_values
from lit_rl.runs import log_rows

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce", "async"]
# The agent recipes (configs/agent_*.yaml) roll out episodes without a reward pool: tests/agent/test_agent_recipes.py
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if not p.stem.startswith("agent_"))
# Recipes on the real checkpoint (lit_rl.models.smollm2) run only where it is built (marker real_ckpt).
REAL = {"smollm2_addition": "last_int"}
CONFIG_PARAMS = [
    pytest.param(c, marks=[pytest.mark.real_ckpt, pytest.mark.slow]) if c in REAL else c for c in CONFIGS
]
# Keep every run cheap: 1-2 iterations of 4 prompts x 2 samples, 1 new token.
SMALL = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--rollout.sampling.max_new_tokens",
    "1",
]


def _run(tmp_path, monkeypatch, model_dir, *configs, steps=2, extra=()):
    monkeypatch.chdir(tmp_path)
    args = ["fit"]
    for c in configs:
        args += ["-c", str(ROOT / c)]
    args += [
        "--trainer.max_steps",
        str(steps),
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
    ]
    if model_dir is not None:
        args += ["--model.init_args.model", str(model_dir)]
    return main([*args, *extra])


def _rollout(cli):
    from lit_rl.callbacks import RolloutCallback

    (rc,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, RolloutCallback)]
    return rc


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_through_cli_with_rollout_flags(recipe, tmp_path, monkeypatch, tiny_model_dir):
    """`--rollout.group_size` / `--rollout.sampling.max_new_tokens` reach the RolloutCallback of every recipe."""
    # dapo's dynamic sampling refills groups without reward variance: its preset group of 8 and 64 tries
    group = "8" if recipe == "dapo" else "3"
    more = []
    cli = _run(
        tmp_path,
        monkeypatch,
        tiny_model_dir,
        f"configs/{recipe}.yaml",
        extra=["--rollout.group_size", group, "--rollout.sampling.max_new_tokens", "2", *more],
    )
    m = cli.trainer.callback_metrics
    assert cli.model.iteration >= 1
    assert "reward/mean" in m and "actor/grad_norm" in m
    rc = _rollout(cli)
    assert rc.settings.group_size == int(group) and rc.settings.sampling.max_new_tokens == 2
    assert cli.trainer.callbacks.index(rc) == 0  # generates before the other callbacks see the batch
    preset = yaml.safe_load((ROOT / f"configs/{recipe}.yaml").read_text())
    for field in ("advantage", "policy_loss", "loss_agg"):  # the preset's independent fields arrive as set
        assert cli.model.hparams[field] == preset["model"]["init_args"][field]
    given = flat_values(rc.settings, rc.filters, rc.sync)
    for k, v in preset["rollout"].items():  # and the recipe's other rollout settings are kept
        if k not in ("group_size", "sampling", "rewards", "engine"):
            assert given[k] == v, k


def test_callback_fragment_composes_with_recipe(tmp_path, monkeypatch, tiny_model_dir):
    from lit_rl.callbacks import HeldoutEval, RolloutCallback

    cli = _run(
        tmp_path,
        monkeypatch,
        tiny_model_dir,
        "configs/grpo.yaml",
        "callbacks/eval.yaml",
        "callbacks/save_hf.yaml",
        extra=["--rollout.group_size", "5", "--trainer.val_check_interval", "1"],
    )
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert RolloutCallback in kinds and HeldoutEval in kinds  # appended, not replaced
    assert _rollout(cli).settings.group_size == 5
    assert "eval/accuracy" in cli.trainer.callback_metrics
    assert (tmp_path / "run" / "final_model" / "config.json").exists()  # under the run directory
    assert not (tmp_path / "final_model").exists()


def test_unknown_name_in_recipe_fails_at_construction(tmp_path, monkeypatch, tiny_model_dir):
    with pytest.raises((ValueError, SystemExit)):
        _run(
            tmp_path,
            monkeypatch,
            tiny_model_dir,
            "configs/grpo.yaml",
            extra=["--model.init_args.advantage", "ppo"],
        )


def test_rollout_callback_in_callbacks_list_becomes_the_rollout_section(
    tmp_path, monkeypatch, tiny_model_dir
):
    """Configs written before the `rollout` section (RolloutCallback under trainer.callbacks) still run: the
    entry moves into the section at its position, and a flag still wins over the entry's value."""
    cfg = tmp_path / "old.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "callbacks": [
                        {"class_path": "lit_rl.callbacks.Curriculum", "init_args": {"min_visits": 1}},
                        {
                            "class_path": "lit_rl.callbacks.RolloutCallback",
                            "init_args": {
                                "group_size": 4,
                                "max_prompt_len": 77,
                                "sampling": {"max_new_tokens": 1},
                                "rewards": {"class_path": "lit_rl.rewards.ExactAnswerReward"},
                            },
                        },
                    ]
                }
            }
        )
    )
    cli = _run(
        tmp_path,
        monkeypatch,
        tiny_model_dir,
        "configs/grpo.yaml",
        str(cfg),
        steps=1,
        extra=["--rollout.group_size", "2", "--data.init_args.batch_size", "4"],
    )
    rc = _rollout(cli)
    assert (rc.settings.group_size, rc.settings.max_prompt_len) == (2, 77)
    assert [type(c).__name__ for c in cli.trainer.callbacks[:2]] == ["Curriculum", "RolloutCallback"]


def test_distill_recipe_runs_through_cli(tmp_path, monkeypatch, tiny_model_dir):
    """configs/distill.yaml: DistillModule + TeacherRouter; its teacher path is the quickstart's output, which
    the test fakes with a tiny model (the student is another copy, so the KL starts at 0 — plumbing only)."""
    from lit_rl.callbacks import TeacherRouter
    from lit_rl.learners import DistillModule

    shutil.copytree(tiny_model_dir, tmp_path / "runs/quickstart/final_model")
    cli = _run(tmp_path, monkeypatch, tiny_model_dir, "configs/distill.yaml", extra=SMALL)
    assert isinstance(cli.model, DistillModule) and cli.model.iteration >= 1
    assert cli.model.losses == {"reverse_kl_full": 1.0}
    assert any(isinstance(cb, TeacherRouter) for cb in cli.trainer.callbacks)
    m = cli.trainer.callback_metrics
    assert "loss/reverse_kl_full" in m and "distill/addition/reverse_kl" in m and "distill/addition/rows" in m
    assert float(m["perf/teacher_s"]) > 0  # the iteration's time scoring rows with teachers


# ---------------------------------------------------------------------------------------- print_config
def _print_config(capsys, args) -> str:
    with pytest.raises(SystemExit) as e:
        main([*args, "--print_config"])
    assert e.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("recipe", CONFIG_PARAMS)
def test_print_config_output_re_runs(recipe, tmp_path, monkeypatch, capsys, tiny_model_dir, request):
    """`--print_config` → a file → `lit-rl fit -c that file` trains one iteration, for every recipe (the reward
    pools are dicts: their specs must survive the dump, not turn into 'Unable to serialize instance')."""
    if recipe in ("grpo_vllm", "grpo_server", "async_server", *REAL):  # vLLM in-process or in a server
        pytest.importorskip("vllm")
    monkeypatch.chdir(tmp_path)
    if recipe in REAL:  # the recipe's model: `lit-rl models smollm2 runs/smollm2` (here: a link to the cache)
        (tmp_path / "runs").mkdir()
        (tmp_path / "runs/smollm2").symlink_to(request.getfixturevalue("smollm2_dir"))
    shutil.copytree(tiny_model_dir, tmp_path / "runs/quickstart/model")  # the recipes' default model
    shutil.copytree(tiny_model_dir, tmp_path / "runs/quickstart/final_model")  # distill's teacher
    shutil.copytree(tiny_model_dir, tmp_path / "runs/distill/student")  # distill's student
    # dapo: dynamic sampling needs its own 16 prompts x 8 samples (and its preset's refill tries)
    small = SMALL if recipe != "dapo" else []
    # one iteration; max_steps counts optimizer steps: ppo_epochs 2 (gspo, cispo, ppo's one minibatch of 8) take 2
    # (the SmolLM2 recipe's two minibatches: 4 rows each of SMALL's 8)
    steps = "2" if recipe in ("gspo", "cispo", "ppo", *REAL) else "1"
    printed = _print_config(
        capsys,
        [
            "fit",
            "-c",
            str(ROOT / f"configs/{recipe}.yaml"),
            "--trainer.max_steps",
            steps,
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            *small,
            *(["--model.init_args.minibatch_size", "8"] if recipe == "ppo" else []),
            *(
                ["--model.init_args.minibatch_size", "4", "--model.init_args.micro_batch_size", "4"]
                if recipe in REAL
                else []
            ),
        ],
    )
    assert "Unable to serialize" not in printed
    cfg = yaml.safe_load(printed)
    reward = REAL.get(recipe, "exact")
    cls = {"exact": "ExactAnswerReward", "last_int": "LastIntReward"}[reward]
    assert cfg["rollout"]["rewards"]["init_args"]["rewards"][reward]["class_path"] == f"lit_rl.rewards.{cls}"
    if recipe in REAL:  # a baseline evaluation of 4 held-out prompts, not the recipe's 100
        for cb in cfg["trainer"]["callbacks"]:
            if cb["class_path"].endswith("HeldoutEval"):
                cb["init_args"]["max_prompts"] = 4
        printed = yaml.safe_dump(cfg)
    (tmp_path / "printed.yaml").write_text(printed)
    cli = main(["fit", "-c", str(tmp_path / "printed.yaml"), "--trainer.enable_progress_bar", "false"])
    assert cli.model.iteration == 1
    assert (tmp_path / "run" / "config.yaml").exists()
    # every recipe writes the trained model (issue 26: seven of them left only last.ckpt)
    assert (tmp_path / "run" / "final_model" / "model.safetensors").exists()
    # ... and logs its learning rate and the tokens it trained on (issue 26: TRL logs both)
    logged = set().union(*log_rows(tmp_path / "run" / "logs" / "metrics.csv"))
    assert {"lr-AdamW", "tokens_seen", "rollout/response_len_min"} <= logged, sorted(logged)
    if recipe != "quickstart":
        return
    # ... and the config the run saved re-runs as well (as a new run: another run directory)
    cli = main(
        [
            "fit",
            "-c",
            str(tmp_path / "run" / "config.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run2"),
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    assert cli.model.iteration == 1


def test_reward_list_and_callable_round_trip(tmp_path, monkeypatch, capsys, tiny_model_dir):
    """A list of reward specs (a class and a plain function) also survives print_config."""
    monkeypatch.chdir(tmp_path)
    rewards = '[{"class_path": "lit_rl.rewards.ExactAnswerReward"}, {"class_path": "lit_rl.rewards.PrefixMatchReward"}]'
    args = [
        "fit",
        "-c",
        str(ROOT / "configs/grpo.yaml"),
        "--model.init_args.model",
        str(tiny_model_dir),
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        *SMALL,
        "--rollout.rewards",
        "lit_rl.rewards.RewardPool",
        "--rollout.rewards.rewards",
        rewards,
    ]
    printed = _print_config(capsys, args)
    got = yaml.safe_load(printed)["rollout"]["rewards"]["init_args"]["rewards"]
    assert [r["class_path"] for r in got] == [
        "lit_rl.rewards.ExactAnswerReward",
        "lit_rl.rewards.PrefixMatchReward",
    ]
    (tmp_path / "p.yaml").write_text(printed)
    cli = main(["fit", "-c", str(tmp_path / "p.yaml"), "--trainer.enable_progress_bar", "false"])
    assert sorted(_rollout(cli).rewards.rewards) == ["exact", "prefix"]
