"""RLHF path: preference records, Bradley-Terry reward model on synthetic preferences, RM as a GRPO reward."""

import functools
import json

import lightning as L
import pytest
import torch
from _learning import record, seed

from lit_rl.data.preferences import PreferenceDataModule, load_preferences, parse_preferences, prefers
from lit_rl.learners.reward_model import RewardModelModule
from lit_rl.rewards.reward_model import RewardModelReward


def _trainer(**kw):
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


@pytest.fixture(scope="module")
def trained_rm(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    mod = RewardModelModule(
        model=str(tiny_model_dir),
        save_dir=str(out),
        seed=seed(0),
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-3),
    )
    dm = PreferenceDataModule(
        synthetic={"n": 300, "prop": "larger", "seed": seed(0)}, batch_size=32, seed=seed(0)
    )
    trainer = _trainer(max_epochs=3)
    trainer.fit(mod, datamodule=dm)
    return out, dm, {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_missing_field_names_record_and_field(tmp_path):
    with pytest.raises(ValueError, match=r"preference record 1: missing field 'rejected'"):
        parse_preferences([{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b"}])
    with pytest.raises(TypeError, match=r"preference record 0: field 'chosen' must be a string"):
        parse_preferences([{"prompt": "a", "chosen": 3, "rejected": "c"}])
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n\n")
    assert load_preferences(f)[0].chosen == "2"


def test_bradley_terry_rm_reaches_90_percent_heldout_and_scores_as_a_reward(trained_rm):
    path, dm, metrics = trained_rm
    record("reward_model/bradley_terry", val_accuracy=metrics["rm/val_accuracy"])
    assert metrics["rm/val_accuracy"] >= 0.9
    rm = RewardModelReward(str(path))  # reloaded from the saved HF directory
    held = dm.heldout_pairs
    s_c = rm.score_batch([p.prompt for p in held], [p.chosen for p in held])
    s_r = rm.score_batch([p.prompt for p in held], [p.rejected for p in held])
    acc = sum(a > b for a, b in zip(s_c, s_r)) / len(held)
    assert acc == pytest.approx(
        metrics["rm/val_accuracy"], abs=1e-6
    )  # same model after save/load (metric is fp32)
    assert rm(held[0].prompt, "9") > rm(held[0].prompt, "0")
    assert prefers("larger", "1+2=", "9") == 1.0 and prefers("correct", "1+2=", "3") == 1.0


@pytest.mark.slow
def test_grpo_against_the_rm_raises_its_score(trained_rm, tiny_model_dir):
    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.data.prompts import render_prompt
    from lit_rl.learners import PolicyModule
    from lit_rl.rollout import SamplingConfig

    L.seed_everything(seed(0), verbose=False)
    rm = RewardModelReward(str(trained_rm[0]))
    pol = PolicyModule(model=str(tiny_model_dir), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    pdm = PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=4)
    pdm.setup()
    prompts = pdm.heldout_prompts[:8]

    @torch.no_grad()
    def greedy_rm_score():
        texts = [
            pol.tokenizer.decode(
                [int(pol.model(torch.tensor([render_prompt(p, pol.tokenizer)])).logits[0, -1].argmax())]
            )
            for p in prompts
        ]
        return sum(rm.score_batch(prompts, texts)) / len(prompts)

    before = greedy_rm_score()
    rc = RolloutCallback(rewards={"rm": rm}, group_size=8, sampling=SamplingConfig(max_new_tokens=1))
    _trainer(max_steps=30, max_epochs=-1, callbacks=[rc]).fit(pol, datamodule=pdm)
    after = greedy_rm_score()
    record("reward_model/grpo_against_rm", before=before, after=after)
    assert after > before + 1.0, (before, after)
