"""Every command in README.md and in the pages under docs/ is run here (shortened: a few iterations of small
batches), in reading order (``tests/_docs.py``: README, then the guides), in one working directory, as a new
user would type them; the few that need other machines say where they are covered. A documented command
missing from this table fails the first test."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from _docs import DOCS, bash_commands, doc_commands, markdown_files, text

from lit_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = text("README.md")
SHORT = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
]

# README command -> extra flags appended when the test runs it (each README example is independent, so examples
# that are not about one run directory get their own with --trainer.default_root_dir).
RUN = {
    "lit-rl fit --config configs/quickstart.yaml": ["--trainer.max_steps", "2"],
    "lit-rl fit -c configs/quickstart.yaml --ckpt_path last --trainer.max_steps 1000": [
        "--trainer.max_steps",
        "4",
    ],
    "lit-rl fit -c configs/quickstart.yaml --ckpt_path last_or_new": ["--trainer.max_steps", "5"],
    "lit-rl validate -c configs/quickstart.yaml --ckpt_path last": [],
    "lit-rl fit -c configs/grpo.yaml --print_config > my_run.yaml && lit-rl fit -c my_run.yaml": [
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        "runs/printed",
    ],
    "lit-rl fit --config configs/grpo.yaml": ["--trainer.max_steps", "1"],
    "lit-rl fit -c configs/quickstart.yaml -c callbacks/eval.yaml": [
        "--trainer.max_steps",
        "2",
        "--trainer.val_check_interval",
        "1",
        "--trainer.default_root_dir",
        "runs/qs_eval",
    ],
    "lit-rl fit -c configs/grpo.yaml --rollout.group_size 4 --rollout.sampling.max_new_tokens 2": [
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        "runs/flags",
        "--rollout.group_size",
        "4",
    ],
    "lit-rl fit --config configs/grpo.yaml --model.init_args.model runs/quickstart/final_model": [
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        "runs/own_model",
    ],
    "lit-rl fit --model.help lit_rl.learners.PolicyModule": [],
    (
        "lit-rl fit -c configs/grpo.yaml -c callbacks/eval.yaml --trainer.default_root_dir runs/mine "
        "--data.init_args.train_files '[train.jsonl]' --data.init_args.heldout_files '[heldout.jsonl]' "
        "--rollout.rewards.rewards '{mine: my_reward.ends_with_answer}'"
    ): ["--trainer.max_steps", "2"],
    "lit-rl fit --config configs/quickstart.yaml --ckpt_path last_or_new": ["--trainer.max_steps", "5"],
    "python -m lit_rl.models.tiny runs/distill/student --hidden 64 --heads 2 --seed 1": [],
    "lit-rl fit --config configs/distill.yaml": ["--trainer.max_steps", "1"],
    "lit-rl inspect runs/quickstart": [],
    "lit-rl inspect runs/quickstart -o report.html": [],
    "lit-rl fit -c configs/quickstart.yaml -c callbacks/trl_defaults.yaml": [
        "--trainer.max_steps",
        "2",
        "--rollout.sampling.max_new_tokens",
        "1",
        "--trainer.default_root_dir",
        "runs/trl_defaults",
    ],
    "lit-rl explain-trl -c configs/quickstart.yaml": [],
    "lit-rl explain-trl -c configs/agent_calculator.yaml": [],
}
# Commands this machine cannot run (several processes or GPUs, package installs), and where they are covered.
ELSEWHERE = {
    "make install": "scripts/install.sh, run by the environment setup",
    "lit-rl fit -c my_config.yaml -c callbacks/inspect.yaml": (
        "tests/callbacks/test_inspector.py (a config of your own)"
    ),
    "make test": "the test suite itself",
    "make docs": "tests/test_docs_site.py (the same Makefile target: the strict build of the docs site)",
    "python scripts/bench_distill.py": "a benchmark script (minutes); its pieces: tests/test_distill_*.py",
    "pip install torch": "GPU install (network)",
    'pip install -e ".[gpu,dev]"': "GPU install (network)",
    "lit-rl fit -c configs/grpo.yaml -c configs/strategies/ddp.yaml --trainer.devices 2": "tests/test_distributed.py",
    "lit-rl fit -c configs/grpo.yaml -c configs/strategies/fsdp.yaml --trainer.devices 2": "tests/test_distributed.py",
    (
        "lit-rl fit -c configs/grpo.yaml -c configs/strategies/deepspeed_zero2.yaml --trainer.devices 2"
    ): "tests/test_distributed.py",
    (
        "lit-rl fit -c configs/grpo.yaml -c configs/strategies/deepspeed_zero3.yaml --trainer.devices 2"
    ): "tests/test_distributed.py",
    "torchrun --nnodes 2 --node-rank $NODE --nproc-per-node 4 --master-addr $HEAD --master-port 29500 $(which lit-rl) "
    "fit -c configs/grpo.yaml -c configs/strategies/ddp.yaml --trainer.devices 4 --trainer.num_nodes 2": "two nodes",
    "lit-rl fit --config configs/grpo_server.yaml": "tests/test_server_setup.py::test_readme_server_commands",
    (
        "VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model runs/grpo_server/model "
        "--logprobs-mode processed_logprobs --port 8000"
    ): "tests/test_server_setup.py::test_readme_server_commands",
    (
        "lit-rl fit -c configs/grpo_server.yaml --trainer.default_root_dir runs/grpo_nodes --model.init_args.model "
        "runs/grpo_server/model --rollout.engine.init_args.launch null --rollout.engine.init_args.urls "
        "'[http://rollout1:8000,http://rollout2:8000]'"
    ): "tests/test_server_setup.py::test_readme_server_commands",
    "lit-rl fit -c trl_grpo.yaml": (
        "tests/test_readme_trl.py (the guide's own files and commands, in order)"
    ),
    "lit-rl export runs/from_trl -o from_trl_adapter --adapter": "tests/test_readme_trl.py",
    "lit-rl explain-trl -c trl_grpo.yaml": "tests/test_readme_trl.py",
    (
        "srun lit-rl fit -c configs/grpo.yaml -c configs/strategies/fsdp.yaml --trainer.devices 4 "
        "--trainer.num_nodes 2"
    ): "SLURM",
    "lit-rl models smollm2 runs/smollm2": "tests/test_smollm2_checkpoint.py (the real checkpoint, marker real_ckpt)",
    (
        "python scripts/experts_to_student.py --model runs/smollm2 --out runs/e2s --seeds 0,1 --iterations 16 "
        "--expert-iterations 32 --eval-every 4 --jobs 2"
    ): "2.7 hours on the real checkpoint; its --tiny mode (with --jobs 2) is tests/test_e2s_pipeline.py (slow)",
    "python scripts/experts_to_student.py --tiny --out /tmp/e2s_tiny": "tests/test_e2s_pipeline.py (slow)",
    "python scripts/agent_credit.py --model runs/smollm2 --iterations 4 --seeds 0 1 --baseline-once": (
        "a real-model comparison (an hour); the same script on the tiny model: tests/agent/test_agent_credit.py (slow)"
    ),
    # why self-distillation collapses: minutes on the real checkpoint each; --variants without experts is
    # tests/test_e2s_pipeline.py::test_variants_that_read_no_expert_skip_the_expert_stage (--tiny, slow), the
    # probe (with --ckpt and --frozen) tests/test_e2s_opsd.py on the tiny model
    "python scripts/experts_to_student.py --model runs/smollm2 --out runs/opsd --variants opsd --iterations 2 "
    "--eval-every 2": "tests/test_e2s_pipeline.py (--tiny, slow)",
    "python scripts/experts_to_student.py --model runs/smollm2 --out runs/opsd_frozen --variants opsd_frozen "
    "--iterations 4 --eval-every 2": "tests/test_e2s_pipeline.py (--tiny, slow)",
    "python scripts/experts_to_student_opsd.py --model runs/smollm2 --sampled 32": "tests/test_e2s_opsd.py",
    (
        "python scripts/experts_to_student_opsd.py --model runs/smollm2 --sampled 32 --ckpt "
        "runs/opsd/students/opsd/seed0/checkpoints/last.ckpt"
    ): "tests/test_e2s_opsd.py",
    (
        "python scripts/experts_to_student_opsd.py --model runs/smollm2 --sampled 32 --frozen --ckpt "
        "runs/opsd_frozen/students/opsd_frozen/seed0/checkpoints/last.ckpt"
    ): "tests/test_e2s_opsd.py",
    (
        "python scripts/bench_time_to_accuracy.py --sides lit --threads 2 --heldout 200 --eval-every 4 "
        "--max-minutes 20 --hold 1"
    ): "minutes on the real checkpoint; tests/test_bench_time_to_accuracy.py (its --smoke run: slow)",
    (
        "python scripts/bench_time_to_accuracy.py --sides trl --threads 2 --heldout 200 --eval-every 4 "
        "--max-minutes 25 --hold 1"
    ): "half an hour on the real checkpoint; tests/test_bench_time_to_accuracy.py (its --smoke run: slow)",
    "python scripts/time_to_accuracy.py --seeds 0 1 2 --out runs/tta --plot runs/tta/curve.png": (
        "an hour on the real checkpoint; its parsing and verdicts: tests/test_time_to_accuracy_script.py"
    ),
    "python scripts/agent_hacking.py --model runs/smollm2 --iterations 6 --arms monitor --retry-episodes 16": (
        "half an hour on the real checkpoint; its --tiny mode is tests/agent/test_agent_hacking.py (slow)"
    ),
    "lit-rl fit -c configs/agent_openai_calculator.yaml": (
        "tests/agent/test_openai_agent_recipe.py (its printed config on the tiny model, slow)"
    ),
    "lit-rl fit -c configs/agent_calculator.yaml": (
        "tests/agent/test_agent_recipes.py (its printed config on the tiny model; on SmolLM2: real_ckpt, slow)"
    ),
    "lit-rl fit -c configs/agent_guess.yaml": (
        "tests/agent/test_agent_recipes.py (its printed config on the tiny model; on SmolLM2: real_ckpt, slow)"
    ),
    "lit-rl fit -c configs/agent_lookup.yaml": (
        "tests/agent/test_agent_recipes.py (its printed config on the tiny model; on SmolLM2: real_ckpt, slow)"
    ),
    "lit-rl fit -c configs/smollm2_addition.yaml": (
        "tests/test_smollm2_recipe.py and tests/test_cli_recipes.py (real_ckpt, slow)"
    ),
    (
        "MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 lit-rl fit -c configs/smollm2_addition.yaml "
        "--model.init_args.lora '{r: 16, lora_alpha: 32, target_modules: all-linear}' "
        "--rollout.engine.init_args.dtype bfloat16 --rollout.engine.init_args.kv_cache_memory_bytes 67108864"
    ): "tests/test_smollm2_recipe.py::test_lora_fit_syncs_merged_weights_and_exports_a_merged_model (its flags, "
    "read from docs/guides/real-checkpoint.md, in-process and shortened; the environment variables act at "
    "process start)",
    (
        "OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536 lit-rl fit -c configs/smollm2_addition.yaml "
        "--model.init_args.optimizer '{class_path: torch.optim.Adafactor, init_args: {lr: 5.0e-5}}' "
        "--rollout.engine.init_args.dtype bfloat16 --rollout.engine.init_args.kv_cache_memory_bytes 134217728"
    ): "tests/test_smollm2_recipe.py::test_adafactor_fit_keeps_factored_state_and_a_bfloat16_engine (its flags, "
    "read from docs/guides/real-checkpoint.md, in-process and shortened; the environment variables act at "
    "process start)",
    (
        "python scripts/bench_memory_real.py --model ~/.cache/lit_rl/smollm2-135m-instruct --prompts 4 --group 4 "
        "--new-tokens 16 --iterations 2 --configs lora_mb8,lora_mb8_arena2,lora_mb8_trim,lora_mb8_mmap,"
        "lora_mb8_kv64_bf16_trim,lora_mb8_kv64_bf16_mmap"
    ): "a benchmark script (minutes); its table: docs/experiments/speed-and-memory.md",
    (
        "python scripts/bench_memory_real.py --model ~/.cache/lit_rl/smollm2-135m-instruct --prompts 8 --group 4 "
        "--new-tokens 24 --configs full_mmap,full_gc_mmap"
    ): "a benchmark script (minutes); its table: docs/experiments/speed-and-memory.md",
}


def readme_commands() -> list[str]:
    """The documented commands, in reading order (README, then the guides and the experiment logs)."""
    return doc_commands()


def test_every_readme_command_is_run_or_accounted_for():
    cmds = readme_commands()
    missing = [c for c in cmds if c not in RUN and c not in ELSEWHERE]
    assert not missing, f"documented commands without a test: {missing}"
    assert set(RUN) <= set(cmds), f"stale entries: {set(RUN) - set(cmds)}"


def test_every_page_with_commands_is_read():
    """A page under docs/ with a bash block that ``DOCS`` does not list would hold commands no test runs."""
    with_commands = {rel for rel in markdown_files() if bash_commands(text(rel))}
    assert with_commands <= set(DOCS), (
        f"pages with commands missing from tests/_docs.py DOCS: {with_commands - set(DOCS)}"
    )
    assert all((ROOT / rel).exists() for rel in DOCS)


def _main(cmd: str, extra: list[str]):
    args = shlex.split(cmd)
    assert args[0] == "lit-rl"
    return main([*args[1:], *SHORT, *extra])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The user's directory: their data (the README's example record, in TRL form) and the README's reward."""
    d = tmp_path_factory.mktemp("user")
    for sub in ("configs", "callbacks"):  # README commands run from a checkout: the recipes are at hand
        (d / sub).symlink_to(ROOT / sub)
    example = json.loads(re.search(r"```\n(\{\"prompt\".*?)\n```", README).group(1))
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b), "domain": "math"}
        for a in range(4)
        for b in range(4)
    ]
    assert set(example) == set(rows[0])
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [example, *rows]))
    (d / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (d / "my_reward.py").write_text(
        re.search(r"```python\n(def ends_with_answer.*?)```", README, re.DOTALL).group(1)
    )
    return d


def test_readme_commands_in_order(workdir, monkeypatch, capsys):
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.models.tiny import _main as tiny_main

    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))  # what console_main does for the working directory
    results = {}
    for cmd in readme_commands():
        if cmd in ELSEWHERE:
            continue
        extra = RUN[cmd]
        if cmd.startswith("python -m lit_rl.models.tiny"):
            tiny_main(shlex.split(cmd)[3:])
        elif cmd.startswith("lit-rl inspect"):  # console_main dispatches `inspect` to lit_rl.report.main
            from lit_rl.report import main as inspect_main

            assert inspect_main(shlex.split(cmd)[2:]) == 0
        elif cmd.startswith("lit-rl explain-trl"):  # console_main dispatches it to lit_rl.cli.trl_diff.main
            from lit_rl.cli.trl_diff import main as explain_main

            capsys.readouterr()
            assert explain_main(shlex.split(cmd)[2:]) == 0
            assert "under TRL 1.16's learning_rate=1e-6" in capsys.readouterr().out
        elif "--print_config >" in cmd:
            first, second = cmd.split(" && ")
            capsys.readouterr()  # only what --print_config prints goes to the file
            with pytest.raises(SystemExit):
                _main(first.split(" > ")[0], extra)
            Path("my_run.yaml").write_text(capsys.readouterr().out)
            results[cmd] = main(shlex.split(second)[1:])
        elif "--model.help" in cmd:
            capsys.readouterr()
            with pytest.raises(SystemExit):
                main(shlex.split(cmd)[1:])
            assert "--model.loss_agg {token_mean," in capsys.readouterr().out
        else:
            results[cmd] = _main(cmd, extra)
    runs = workdir / "runs"
    assert (
        results["lit-rl fit -c configs/quickstart.yaml --ckpt_path last_or_new"].model.iteration == 5
    )  # resumed
    validate = results["lit-rl validate -c configs/quickstart.yaml --ckpt_path last"]
    assert "eval/accuracy" in validate.trainer.callback_metrics
    rc = next(
        c
        for c in results[
            "lit-rl fit -c configs/grpo.yaml --rollout.group_size 4 --rollout.sampling.max_new_tokens 2"
        ].trainer.callbacks
        if isinstance(c, RolloutCallback)
    )
    assert (rc.settings.group_size, rc.settings.sampling.max_new_tokens) == (4, 2)
    mine = next(
        c
        for c in results[next(c for c in RUN if "my_reward" in c)].trainer.callbacks
        if isinstance(c, RolloutCallback)
    )
    assert list(mine.rewards.rewards) == ["mine"]
    trl = results["lit-rl fit -c configs/quickstart.yaml -c callbacks/trl_defaults.yaml"]
    assert trl.model.iteration == 2 and trl.model.hparams.gradient_checkpointing
    assert (workdir / "report.html").exists() and (runs / "quickstart/report.html").exists()
    for rel in (
        "quickstart/checkpoints/last.ckpt",
        "quickstart/final_model/config.json",
        "mine/logs/metrics.csv",
        "printed/config.yaml",
        "distill/final_model/config.json",
    ):
        assert (runs / rel).exists(), rel
