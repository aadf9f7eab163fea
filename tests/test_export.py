"""Getting the trained model out (issue 26 section 1), the way a user does it: every recipe's final_model/, LoRA
runs' adapter beside the merged model, `lit-rl export` from any checkpoint, a run started from a PEFT adapter
directory, and a finished run resumed with save_hf.yaml writing its model."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from lit_rl.cli import console_main, main

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--data.init_args.batch_size",
    "4",
    "--rollout.group_size",
    "2",
    "--trainer.enable_progress_bar",
    "false",
]
LORA = ["--model.init_args.lora", "{r: 4, lora_alpha: 8}"]


def _fit(run: str, model, *extra, recipe="configs/grpo.yaml"):
    return main(
        [
            "fit",
            "-c",
            str(ROOT / recipe),
            "--model.init_args.model",
            str(model),
            "--trainer.max_steps",
            "1",
            "--trainer.default_root_dir",
            run,
            *SMALL,
            *extra,
        ]
    )


def _lit_rl(monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["lit-rl", *args])
    with pytest.raises(SystemExit) as e:
        console_main()
    out = capsys.readouterr()
    return e.value.code, out.out + out.err


def _logits(model, ids=(5, 6, 7, 8)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


def test_full_run_export_matches_final_model(tmp_path, monkeypatch, capsys, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    _fit("runs/full", tiny_model_dir)
    final = AutoModelForCausalLM.from_pretrained("runs/full/final_model")
    rc, out = _lit_rl(monkeypatch, capsys, "export", "runs/full", "-o", "exported")
    assert rc == 0 and "wrote exported" in out
    exported = AutoModelForCausalLM.from_pretrained("exported")
    assert torch.equal(_logits(final), _logits(exported))
    # a .ckpt file itself: its weights, not the base model's (one tensor of the checkpoint is edited)
    ckpt = torch.load("runs/full/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    key = (
        "model.lm_head.weight" if "model.lm_head.weight" in ckpt["state_dict"] else "model.model.norm.weight"
    )
    ckpt["state_dict"][key] = ckpt["state_dict"][key] + 1.0
    torch.save(ckpt, "runs/full/checkpoints/edited.ckpt")
    rc, _ = _lit_rl(monkeypatch, capsys, "export", "runs/full/checkpoints/edited.ckpt", "-o", "exported2")
    assert rc == 0
    edited = AutoModelForCausalLM.from_pretrained("exported2").state_dict()[key[len("model.") :]]
    assert torch.allclose(edited, final.state_dict()[key[len("model.") :]] + 1.0)
    rc, out = _lit_rl(monkeypatch, capsys, "export", "runs/full", "-o", "x", "--adapter")
    assert rc == 2 and "trained without LoRA" in out and "Traceback" not in out


def test_export_refuses_what_it_cannot_write(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run/checkpoints/last.ckpt/checkpoint").mkdir(
        parents=True
    )  # a DeepSpeed directory, no states
    (tmp_path / "run/config.yaml").write_text("model: {init_args: {model: base}}\n")
    rc, out = _lit_rl(monkeypatch, capsys, "export", "run", "-o", "x")
    assert rc == 2 and "is a DeepSpeed checkpoint directory without model states" in out
    (tmp_path / "odd.ckpt").mkdir()  # a directory that is no checkpoint of any strategy
    (tmp_path / "config.yaml").write_text("model: {init_args: {model: base}}\n")
    rc, out = _lit_rl(monkeypatch, capsys, "export", "odd.ckpt", "-o", "x")
    assert rc == 2 and "neither a DeepSpeed checkpoint" in out
    rc, out = _lit_rl(monkeypatch, capsys, "export", "nowhere", "-o", "x")
    assert rc == 2 and "'nowhere' does not exist" in out


def test_lora_run_saves_adapter_and_merged_and_restarts_from_the_adapter(
    tmp_path, monkeypatch, capsys, tiny_model_dir
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "base")
    cli = _fit("runs/lora", "base", *LORA)
    trained = _logits(cli.model.model.eval())
    merged = AutoModelForCausalLM.from_pretrained("runs/lora/final_model")
    assert not (tmp_path / "runs/lora/final_model/adapter_config.json").exists()  # plain HF weights
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained("base"), "runs/lora/final_model/adapter"
    )
    assert torch.allclose(_logits(merged), trained, atol=1e-5) and torch.allclose(
        _logits(peft), trained, atol=1e-5
    )
    # lit-rl export --adapter: a PEFT directory
    rc, _ = _lit_rl(monkeypatch, capsys, "export", "runs/lora", "-o", "ad", "--adapter")
    assert rc == 0
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("base"), "ad")
    assert torch.allclose(_logits(again), trained, atol=1e-5)
    # model.init_args.adapter: the base as model, the adapter on it; the initial weights are the adapter's
    from lit_rl.learners import PolicyModule

    start = PolicyModule(model="base", adapter="ad").model.eval()
    assert isinstance(start, PeftModel) and torch.equal(_logits(start), _logits(again))
    assert not torch.allclose(_logits(start), _logits(AutoModelForCausalLM.from_pretrained("base")))
    assert {n for n, p in start.named_parameters() if p.requires_grad} == {
        n for n, p in cli.model.model.named_parameters() if p.requires_grad
    }  # the adapter trains, the base not
    cli3 = _fit("runs/from_ad", "base", "--model.init_args.adapter", "ad")
    assert isinstance(cli3.model.model, PeftModel) and cli3.model.iteration == 1
    rc, _ = _lit_rl(
        monkeypatch, capsys, "export", "runs/from_ad", "-o", "ad3", "--adapter"
    )  # config: base + adapter
    assert rc == 0
    again3 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("base"), "ad3")
    assert torch.allclose(_logits(again3), _logits(cli3.model.model.eval()), atol=1e-5)
    with pytest.raises(Exception, match="sets the LoRA settings; drop lora"):
        _fit("runs/ad_lora", "base", "--model.init_args.adapter", "ad", *LORA)
    with pytest.raises(Exception, match="not a PEFT adapter directory"):
        _fit("runs/ad_none", "base", "--model.init_args.adapter", "base")
    # a new run from the adapter directory (was: "holds no Hugging Face model (missing config.json)")
    cli2 = _fit("runs/from_adapter", "runs/lora/final_model/adapter")
    assert isinstance(cli2.model.model, PeftModel) and cli2.model.iteration == 1
    assert (tmp_path / "runs/from_adapter/final_model/adapter/adapter_config.json").exists()
    with pytest.raises(Exception, match="is a PEFT adapter directory"):
        _fit("runs/both", "runs/lora/final_model/adapter", *LORA)


def test_finished_run_resumed_with_save_hf_writes_the_model(tmp_path, monkeypatch, tiny_model_dir):
    """Issue 26: `-c callbacks/save_hf.yaml --ckpt_path last` on a finished run exited 0 and wrote nothing."""
    monkeypatch.chdir(tmp_path)
    _fit("runs/done", tiny_model_dir)
    shutil.rmtree(tmp_path / "runs/done/final_model")
    _fit("runs/done", tiny_model_dir, "-c", str(ROOT / "callbacks/save_hf.yaml"), "--ckpt_path", "last")
    assert (tmp_path / "runs/done/final_model/model.safetensors").exists()
