"""README "Coming from TRL", run as written (issue 26's done-when): its reward module (the README's python block,
unchanged), its config (the yaml block: a conversational dataset through `datasets` with a `main` configuration
and a `test` split, two TRL-signature rewards with weights, LoRA, gradient checkpointing), its `lit-rl fit` and
`lit-rl export` commands (shortened to one iteration of small batches); then the adapter and the merged model
load in PEFT / transformers."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from _docs import section

from lit_rl.cli import console_main, main

ROOT = Path(__file__).resolve().parents[1]
SECTION = section("docs/guides/coming-from-trl.md", "# Coming from TRL")
SHORT = [
    "--trainer.max_steps",
    "1",
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
]
CONFIGS = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
"""


def section_commands() -> list[str]:
    block = re.findall(r"```bash\n(.*?)```", SECTION, re.DOTALL)[
        0
    ]  # the walkthrough's (later ones: test_readme)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_coming_from_trl_runs_as_written(tmp_path, monkeypatch, capsys, tiny_model_dir):
    import datasets  # noqa: F401 - a core dependency: fails, never skips, when missing
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    shutil.copytree(tiny_model_dir, tmp_path / "runs/quickstart/final_model")  # what the quickstart leaves
    (tmp_path / "trl_rewards.py").write_text(re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1))
    for split, n in (("train", 8), ("test", 2)):
        rows = [
            {"question": [{"role": "user", "content": f"{a}+1="}], "solution": str(a + 1)} for a in range(n)
        ]
        path = tmp_path / "my_dataset/main" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_dataset/README.md").write_text(CONFIGS)
    config = re.search(r"```yaml\n(# trl_grpo.yaml\n.*?)```", SECTION, re.DOTALL).group(1)
    (tmp_path / "trl_grpo.yaml").write_text(config)

    fit, export, explain = section_commands()
    cli = main([*shlex.split(fit)[1:], *SHORT])
    assert cli.model.iteration == 1 and len(cli.datamodule.heldout_prompts) == 2
    from lit_rl.callbacks import RolloutCallback

    rollouts = [c for c in cli.trainer.callbacks if isinstance(c, RolloutCallback)]
    assert [c.settings.sampling.top_p for c in rollouts] == [0.95]
    assert isinstance(cli.model.model, PeftModel) and cli.model.model.is_gradient_checkpointing
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    # the weights apply: every row has both rewards, so mean(total) = 1.0 * mean(acc) + 0.1 * mean(brevity)
    assert m["reward/mean"] == pytest.approx(m["reward/acc"] + 0.1 * m["reward/brevity"], abs=1e-6)
    assert m["reward/brevity"] < 0 and {"lr-AdamW", "tokens_seen"} <= set(m)
    # the inspector shows what the model received: the conversation through the tokenizer's chat template
    row = json.loads((tmp_path / "runs/from_trl/rollouts/step_000001.jsonl").read_text().splitlines()[0])
    assert re.fullmatch(r"<\|im_start\|>user\n\d\+1=<\|im_end\|>\n<\|im_start\|>assistant\n", row["prompt"])
    monkeypatch.setattr(sys, "argv", shlex.split(export))
    with pytest.raises(SystemExit) as e:
        console_main()
    assert e.value.code == 0, capsys.readouterr().err
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        want = cli.model.model.eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained("runs/quickstart/final_model")
        adapter = PeftModel.from_pretrained(base, "from_trl_adapter")(ids).logits
        merged = AutoModelForCausalLM.from_pretrained("runs/from_trl/final_model")(ids).logits
    assert torch.allclose(adapter, want, atol=1e-5) and torch.allclose(merged, want, atol=1e-5)
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", shlex.split(explain))
    with pytest.raises(SystemExit) as e:
        console_main()
    out = capsys.readouterr()
    assert e.value.code == 0, out.err
    lines = out.out.splitlines()  # as the README says: the learning rate, top-p, the completion budget
    for line in (
        "model.init_args.optimizer.init_args.lr: 1e-05 here, 1e-06 under TRL 1.16's learning_rate=1e-6",
        "rollout.sampling.top_p: 0.95 here, 1.0 under TRL 1.16's top_p=1.0",
        "rollout.sampling.max_new_tokens: 16 here, 512 under TRL 1.16's max_completion_length=512",
    ):
        assert line in lines, out.out


def test_a_trl_name_is_answered_as_the_readme_says(tmp_path, monkeypatch, capsys):
    """The section's inline example: `lit-rl fit -c trl_grpo.yaml --learning_rate 1e-5` and the error line it
    quotes, through the console script (the early check: nothing is loaded)."""
    cmd = re.search(r"`(lit-rl fit -c trl_grpo\.yaml --learning_rate [^`]+)` says", SECTION).group(1)
    said = " ".join(re.search(r"says `(lit-rl: error: [^`]+)`", SECTION).group(1).split())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trl_grpo.yaml").write_text(
        re.search(r"```yaml\n(# trl_grpo.yaml\n.*?)```", SECTION, re.DOTALL).group(1)
    )
    monkeypatch.setattr(sys, "argv", shlex.split(cmd))
    with pytest.raises(SystemExit) as e:
        console_main()
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == said
