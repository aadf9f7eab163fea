"""Standalone critic training from (prefix, completion, target) records, then loading it into PPO."""

import functools

import lightning as L
import pytest
import torch
from _learning import record, seed
from torch.utils.data import DataLoader

from lit_rl.core.value import explained_variance
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.learners.critic_pretrain import CriticPretrainModule, parse_value_records, records_to_experience


def _records():
    # V_t is read *before* completion token t, so a one-token completion is valued from its prefix alone: the
    # target must be a function of the prefix (here: the first operand / 3)
    return [
        {"prefix": f"{a}+{b}=", "completion": str(c), "target": a / 3}
        for a in range(4)
        for b in range(4)
        for c in (1, 7)
    ]


def test_records_to_experience_layout(tiny_model_dir):
    tok = PolicyModule(model=str(tiny_model_dir)).tokenizer
    exp = records_to_experience(
        tok,
        [
            {"prefix": "1+1=", "completion": "2", "target": 1.0},
            {"prefix": "10+1=", "completion": "11", "target": 0.5},
        ],
    )
    assert exp.prompt_len == 5 and exp.completion_len == 2
    assert exp.loss_mask.tolist() == [[True, False], [True, True]]
    assert exp.returns.tolist() == [[1.0, 0.0], [0.5, 0.5]]
    assert exp.input_ids[0, 0] == tok.pad_token_id  # prefixes are left-padded


def test_value_record_errors_name_index_and_field():
    with pytest.raises(ValueError, match="value record 1: missing field 'target'"):
        parse_value_records(
            [{"prefix": "a", "completion": "b", "target": 0.0}, {"prefix": "a", "completion": "b"}]
        )
    with pytest.raises(ValueError, match="value record 0: field 'target' must be a finite number"):
        parse_value_records([{"prefix": "a", "completion": "b", "target": float("nan")}])


def test_pretrained_critic_fits_and_loads_into_ppo(tiny_model_dir, tmp_path):
    torch.manual_seed(seed(0))
    mod = CriticPretrainModule(
        model=str(tiny_model_dir),
        critic=CriticModule(),
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.0),
    )
    recs = _records()
    with torch.no_grad():
        _, v0, exp = mod.value_loss(recs)
    ev0 = explained_variance(v0, exp.returns, exp.loss_mask)
    L.Trainer(
        max_epochs=20,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(mod, DataLoader(recs, batch_size=8, shuffle=True, collate_fn=list))
    with torch.no_grad():
        _, v1, exp = mod.value_loss(recs)
    ev1 = explained_variance(v1, exp.returns, exp.loss_mask)
    record("critic_pretrain/explained_variance", before=float(ev0), after=float(ev1))
    assert ev1 > 0.5 > ev0
    mod.save(str(tmp_path))
    ppo = PolicyModule(model=str(tmp_path), critic=CriticModule(init_from=str(tmp_path)), advantage="gae")
    ppo.critic.attach_values(ppo, exp)
    torch.testing.assert_close(exp.values[exp.loss_mask], v1[exp.loss_mask], rtol=1e-5, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="no critic.pt there"):
        PolicyModule(model=str(tiny_model_dir), critic=CriticModule(init_from=str(tiny_model_dir)))
