"""`CriticPretrainModule`: train a `CriticModule` on its own, before PPO, from (prefix, completion, target) records.

A fresh value head predicts noise, so PPO's first advantages are noise too. Bootstrapping the critic on
labelled data first — Monte-Carlo returns of sampled completions, or step-level process-reward labels — gives
PPO a fitted V from its first iteration. Each record's ``target`` is the value of every state before a token of
``completion``: V(prefix), V(prefix + c_0), … (as in PPO, V_t is read before token t), e.g. a terminal return
with γ = 1, or a step's label with a one-token ``completion``; the loss is the critic's own (squared
error for ``regression``, BCE for ``token``). ``save(dir)`` writes the backbone (HF format, it may have been
trained too) and ``critic.pt``; ``PolicyModule(model=dir, critic=CriticModule(init_from=dir))`` resumes from it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit_rl.data.experience import Experience
from lit_rl.learners.critic import CriticModule
from lit_rl.learners.optim_step import default_adamw
from lit_rl.rollout.build import ExperienceBuilder, Rows

CRITIC_FILE = "critic.pt"
FIELDS = ("prefix", "completion", "target")


def parse_value_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validate (prefix, completion, target) records; errors name the record index and the field."""
    for i, r in enumerate(records):
        for f in FIELDS:
            if f not in r:
                raise ValueError(f"value record {i}: missing field {f!r}; fields present: {sorted(r)}")
        if not isinstance(r["target"], (int, float)) or r["target"] != r["target"]:
            raise ValueError(f"value record {i}: field 'target' must be a finite number, got {r['target']!r}")
    return records


def records_to_experience(tokenizer, records: list[dict[str, Any]]) -> Experience:
    """Left-padded prefixes | right-padded completions (the one ``ExperienceBuilder``; each record its own
    group, ``prompts`` = the records), ``returns`` = each record's target on its completion tokens."""
    rows = Rows(
        prompt_ids=[tokenizer.encode(r["prefix"], add_special_tokens=False) for r in records],
        completion_ids=[tokenizer.encode(r["completion"], add_special_tokens=False) for r in records],
        prompts=list(records),
        rewards=torch.tensor([float(r["target"]) for r in records]),
    )
    exp = ExperienceBuilder().pack(rows, tokenizer.pad_token_id, group_ids=torch.arange(len(records)))
    exp.returns = torch.where(exp.loss_mask, exp.rewards[:, None], 0.0)  # (B, C)
    return exp


def _default_optimizer(params) -> torch.optim.Optimizer:
    return default_adamw(params, lr=1e-4)


class CriticPretrainModule(L.LightningModule):
    """Standalone critic training (see module doc). Batches are lists of record dicts.

    Args:
        model: the causal LM the critic sits on (the policy PPO will train, for a shared backbone).
        critic: the ``CriticModule`` to train (``value_clip`` is moot here: old values = current values).
        tiny_if_missing: as in ``PolicyModule``.
    """

    def __init__(
        self,
        model: str,
        critic: CriticModule | None = None,
        tiny_if_missing: dict[str, Any] | None = None,
        optimizer: Callable = _default_optimizer,
    ):
        super().__init__()
        from lit_rl.learners.policy import PolicyModule

        critic = critic if critic is not None else CriticModule()
        self.policy = PolicyModule(model=model, tiny_if_missing=tiny_if_missing, critic=critic)
        self.critic = critic  # the policy's critic (one object), registered after the policy as before
        self.optimizer_factory = optimizer

    def configure_optimizers(self):
        return self.optimizer_factory([p for p in self.parameters() if p.requires_grad])

    def value_loss(self, records: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, Experience]:
        exp = records_to_experience(self.policy.tokenizer, parse_value_records(records)).to(self.device)
        logits, hidden = self.policy.forward_logits(exp, model=self.critic.backbone, return_hidden=True)
        n = int(exp.loss_mask.sum())
        fwd = {
            "logits": logits,
            "hidden": hidden,
            "mask": exp.loss_mask,
            "num_tokens": n,
            "num_seqs": int(exp.loss_mask.any(-1).sum()),
        }
        v, _ = self.critic.predict(self.policy, exp, fwd)
        exp.values = (
            v.detach().float()
        )  # old values = current: the PPO2 clip is inactive (no old policy here)
        return (
            self.critic.loss_terms(self.policy, exp, fwd)["value"] / max(self.critic.vf_coef, 1e-12),
            v,
            exp,
        )

    def training_step(self, batch: list[dict[str, Any]], batch_idx: int) -> torch.Tensor:
        loss, _, _ = self.value_loss(batch)
        self.log("critic/value_loss", loss.detach(), on_step=True, on_epoch=False, batch_size=len(batch))
        return loss

    def save(self, path: str) -> None:
        """Backbone + tokenizer in HF format, and the critic's own weights in ``critic.pt``."""
        Path(path).mkdir(parents=True, exist_ok=True)
        (self.critic.backbone or self.policy.model).save_pretrained(path)
        self.policy.tokenizer.save_pretrained(path)
        torch.save(
            {k: v for k, v in self.critic.state_dict().items() if not k.startswith("backbone.")},
            Path(path) / CRITIC_FILE,
        )
