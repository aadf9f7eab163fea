"""One optimizer step against the documented objective, with the conformance suite's references.

For each recorded optimizer step (its minibatch rows and gradient) the reference is the family's loss from
``tests/conformance/_conformance.py`` on those rows, with advantages computed from the rewards by the paper's
formula over the whole Experience (r_i = reward_i + Σ_t token_rewards_{i,t}: the reward-form KL's penalty,
which is 0 up to float32 storage of μ at the on-policy point, enters exactly as the module received it), and
for the clipped-surrogate families the documented correction weights from the stored μ (``_weights``): at the
on-policy point they are 1 up to that storage, and a correction that drops or shrinks tokens there differs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))  # the shared references
from _conformance import (
    cispo_reference,
    clip_reference,
    flat,
    group_advantage,
    gspo_reference,
    max_rel_diff,
    reference_grad,
    reinforce_reference,
    trained,
)

from invariants._grid import FAMILIES
from invariants._harness import rows_of

GRAD_RTOL = 1e-9  # float64 (the recipe conformance suite measures ≤ 3e-16 for the same references)
CAP = 2.0  # PolicyModule's default correction_cap (the band of mis: [1/CAP, CAP])


def checkable(settings: dict) -> bool:
    """The combinations whose step has a conformance reference: untruncated sampling (the references use the
    full softmax), and a correction only with the clipped surrogate (the only reference that takes
    weights)."""
    untruncated = (
        settings["top_p"] == 1
        and settings["top_k"] == 0
        and settings["min_p"] == 0
        and settings["repetition_penalty"] == 1
    )
    return untruncated and (
        settings["correction"] == "none" or FAMILIES[settings["family"]]["policy_loss"] == "ppo_clip"
    )


def _shaped_rewards(exp):
    """The Experience with r_i + Σ_t token_rewards as its rewards (what every group advantage reads)."""
    out = exp.select(list(range(exp.batch_size)))
    r = exp.rewards.double()
    if exp.token_rewards is not None:
        r = r + torch.where(exp.loss_mask, exp.token_rewards.double(), 0.0).sum(-1)
    out.rewards = r
    return out


def advantages(exp, family: str) -> torch.Tensor:
    """(B, 1): GRPO / Dr. GRPO (conformance ``group_advantage``); RLOO (arXiv 2402.14740 eq. 5):
    r_i − mean of the other valid rows of its group."""
    adv_name = FAMILIES[family]["advantage"]
    shaped = _shaped_rewards(exp)
    if adv_name in ("grpo", "dr_grpo"):
        return group_advantage(shaped, std_normalize=adv_name == "grpo")[:, None]
    r, adv = shaped.rewards, torch.zeros(exp.batch_size, dtype=torch.float64)
    for g in exp.group_ids.unique():
        rows = ((exp.group_ids == g) & exp.valid).nonzero().flatten()
        if len(rows) > 1:
            adv[rows] = r[rows] - (r[rows].sum() - r[rows]) / (len(rows) - 1)
    return adv[:, None]


def _weights(sub, correction: str):
    """The documented per-token weights w(lp) of rollout_correction from the stored μ (θ_old = sg(lp))."""
    mode, _, level = correction.partition("/")
    mu, m = sub.rollout_logprobs.double(), trained(sub)

    def w(lp):
        lr = torch.where(m, lp.detach() - mu, 0.0)
        if level == "sequence":
            lr = lr.sum(-1, keepdim=True).expand_as(lr)
        rho = lr.clamp(max=math.log(CAP)).exp()
        if mode == "mis":  # the two-sided band [1/cap, cap]: outside it a token (row) is dropped
            rho = torch.where((lr <= math.log(CAP)) & (lr >= -math.log(CAP)), rho, 0.0)
        return rho

    return w


def step_diffs(run) -> list[float]:
    """max relative difference of each optimizer step's gradient from its reference."""
    s, module, exp = run.settings, run.module, run.exp
    fam = FAMILIES[s["family"]]
    adv_all = advantages(exp, s["family"])
    T = s["temperature"]
    diffs = []
    for mb, grads in run.steps:
        idx = rows_of(exp, mb)
        sub, adv = exp.select(idx), adv_all[idx]
        if fam["policy_loss"] == "ppo_clip":
            weights = None if s["correction"] == "none" else _weights(sub, s["correction"])
            loss = clip_reference(
                module,
                sub,
                adv,
                fam["loss_agg"],
                fam["clip_low"],
                fam["clip_high"],
                horizon=exp.horizon,
                weights=weights,
                temperature=T,
            )
        elif fam["policy_loss"] == "gspo":
            loss = gspo_reference(module, sub, adv, fam["clip_low"], fam["clip_high"], temperature=T)
        elif fam["policy_loss"] == "cispo":
            loss = cispo_reference(module, sub, adv, fam["clip_low"], fam["clip_high"], temperature=T)
        else:
            loss = reinforce_reference(module, sub, adv, temperature=T)
        ref = reference_grad(module, loss)
        assert float(ref.abs().max()) > 0, "degenerate reference (zero gradient): the check would be vacuous"
        diffs.append(max_rel_diff(flat(grads), ref))
    return diffs
