"""Advantage estimators: one registry (``ADVANTAGES``), one signature (``AdvantageInputs`` → ``AdvantageOutputs``).

Which fields each estimator reads (everything else is ignored, so one config can switch estimators):

=========  =========================================================================================
grpo       rewards (+ Σ token_rewards), group_ids, valid, std_normalize, std_scope, eps, reduce
dr_grpo    rewards (+ Σ token_rewards), group_ids, valid
rloo       rewards (+ Σ token_rewards), group_ids, valid
reinforce  rewards, token_rewards, valid, gamma, baseline
gae        rewards, token_rewards, values, valid, gamma, lam, bootstrap
opd        logprobs, teacher_logprobs, valid
=========  =========================================================================================

Conventions shared by all estimators:

* Advantages (and returns) are zero on tokens where ``mask`` is False and on rows with
  ``valid=False``. Zero advantage removes a row from the policy gradient, but a caller should still
  drop invalid rows from its loss mask so that KL/value/entropy terms ignore them too.
* Group estimators score a row as r_i = rewards_i + Σ_t token_rewards_{i,t} (over action tokens), as
  veRL does when a KL penalty is folded into the reward; without ``token_rewards`` it is just rewards_i.
  ``group_ids=None`` puts the whole batch in one group.
* Group statistics use only valid rows. A group with one valid row (a "singleton") and a group whose
  valid rewards are all exactly equal (a "zero-std" group — DAPO's no-signal group) get advantage 0;
  equality is tested exactly, not by std < eps, so rounding in the mean cannot leak a 1e-17 signal.
* Token-level estimators (reinforce, gae) run their recursions over *action tokens only*: a token
  with mask False (padding, or an environment-observation span in a multi-turn episode) is skipped,
  so "next token" means the next action token and γ discounts once per action token, not per position.

Files: this module holds the group estimators (grpo, dr_grpo, rloo) and registers all six, in the order of the
table; ``core.advantage_base`` the registry object, settings, input/output types and shared helpers;
``core.token_advantages`` the token-level estimators. Every name is importable from here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# The registry object, the settings group and the input/output types live in core.advantage_base (shared with
# core.token_advantages); they are re-exported here, the path users, configs and tests import them from.
from lit_rl.core.advantage_base import (  # noqa: F401 - AdvantageSettings, STD_SCOPES re-exported
    ADVANTAGES,
    STD_SCOPES,
    AdvantageInputs,
    AdvantageOutputs,
    AdvantageSettings,
    _action_mask,
    _dtype,
    _to_floats,
    _token_field,
    _token_metrics,
    _zero,
)
from lit_rl.core.group_size import GROUP_RELATIVE, check_group_size  # noqa: F401 (torch-free: the CLI's early check)
from lit_rl.core.groups import GroupStats, group_stats
from lit_rl.core.token_advantages import gae, opd, reinforce


def compute_advantages(name: str, inputs: AdvantageInputs) -> AdvantageOutputs:
    """Run the estimator registered as ``name`` (unknown names raise ValueError listing the valid ones).

    Shapes:
        inputs: see ``AdvantageInputs``; returns advantages (B, T), returns (B, T) or None.
    """
    return ADVANTAGES.get(name)(inputs)


def _sequence_scores(inp: AdvantageInputs, dtype: torch.dtype) -> Tensor:
    """(B,) r_i = rewards_i + Σ_t token_rewards_{i,t} over action tokens; 0 on invalid rows."""
    r = torch.where(
        inp.valid_rows(), inp.rewards.to(dtype), torch.zeros((), dtype=dtype, device=inp.rewards.device)
    )
    if inp.token_rewards is not None:
        r = r + _token_field(inp, "token_rewards", dtype).sum(dim=1)
    return r


def _group_output(inp: AdvantageInputs, row_adv: Tensor, stats: GroupStats) -> AdvantageOutputs:
    """Broadcast a (B,) per-row advantage to the row's action tokens; zero for no-signal groups."""
    valid = inp.valid_rows()
    row_adv = torch.where(stats.no_signal[stats.inverse] | ~valid, _zero(row_adv), row_adv)
    sel = _action_mask(inp)
    adv = torch.where(sel, row_adv[:, None], _zero(row_adv))  # (B,) -> (B, T)
    metrics = {**stats.metrics, **_token_metrics(adv, sel, int((~valid).sum()))}
    return AdvantageOutputs(adv, None, _to_floats(metrics))


# ------------------------------------------------------------------------------------------ estimators


@ADVANTAGES.register("grpo")
def grpo(inp: AdvantageInputs) -> AdvantageOutputs:
    """Group-relative advantage (GRPO, outcome supervision; arXiv 2402.03300 §4.1.2).

    A_{i,t} = (r_i − mean_g) / (std_g + eps)   if std_normalize,   else   r_i − mean_g,
    broadcast to every action token t of row i; mean/std over the valid rows of i's group g.
    Departures: std is the unbiased sample std (``group_stats``); singleton and zero-std groups get
    0 exactly (the paper's formula would give 0/eps·0); invalid rows are excluded from the statistics.

    ``std_scope="batch"`` keeps the group mean but divides by std_B, the unbiased std of r over every valid
    row of the batch — of all ranks, summed with ``reduce`` (PPO Lite / "Tricks or Traps", arXiv 2508.08221;
    TRL's ``scale_rewards="batch"``): a group of near-identical rewards is no longer blown up to unit scale.
    Metric ``adv/batch_std`` = std_B.

    Shapes:
        rewards: (B,); group_ids: (B,); mask: (B, T); returns advantages (B, T), returns None.
    """
    dt = _dtype(inp)
    r = _sequence_scores(inp, dt)
    st = group_stats(r, inp.valid_rows(), inp.group_ids)
    adv = r - st.mean[st.inverse]
    if inp.std_normalize and inp.std_scope == "batch":
        std_b = _batch_std(r, inp.valid_rows(), inp.reduce)
        out = _group_output(inp, adv / (std_b.to(dt) + inp.eps), st)
        out.metrics["adv/batch_std"] = float(std_b)
        return out
    if inp.std_normalize:
        adv = adv / (st.std[st.inverse] + inp.eps)
    return _group_output(inp, adv, st)


def _batch_std(r: Tensor, valid: Tensor, reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
    """Unbiased std of ``r`` over the valid rows of every rank: n, Σr, Σr² summed with ``reduce`` (in float64,
    where the one-pass form's cancellation is negligible at reward scales); 0 when fewer than 2 rows.

    Shapes:
        r: (B,); valid: (B,) bool; returns a scalar float64 tensor.
    """
    x = torch.where(valid, r.double(), torch.zeros((), dtype=torch.float64, device=r.device))
    stats = torch.stack([valid.double().sum(), x.sum(), (x * x).sum()])  # (3,)
    if reduce is not None:
        stats = reduce(stats.cpu()).to(torch.float64)
    n, s1, s2 = (float(v) for v in stats)
    if n < 2:
        return torch.zeros((), dtype=torch.float64)
    return torch.tensor(max(s2 - s1 * s1 / n, 0.0) / (n - 1), dtype=torch.float64).sqrt()


@ADVANTAGES.register("dr_grpo")
def dr_grpo(inp: AdvantageInputs) -> AdvantageOutputs:
    """GRPO without the std division (Dr. GRPO, arXiv 2503.20783 §3.2): A_{i,t} = r_i − mean_g.

    Dividing by std up-weights prompts that are nearly always solved or failed (a difficulty bias);
    Dr. GRPO drops it. ``std_normalize`` is ignored. Pair it with ``seq_mean_token_sum_norm``
    aggregation to remove the length bias as well, as the paper does.

    Shapes:
        rewards: (B,); group_ids: (B,); mask: (B, T); returns advantages (B, T), returns None.
    """
    dt = _dtype(inp)
    r = _sequence_scores(inp, dt)
    st = group_stats(r, inp.valid_rows(), inp.group_ids)
    return _group_output(inp, r - st.mean[st.inverse], st)


@ADVANTAGES.register("rloo")
def rloo(inp: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE leave-one-out (RLOO, arXiv 2402.14740 eq. 5): A_{i,t} = r_i − (Σ_{j∈g, j≠i} r_j) / (n_g − 1).

    The baseline of each sample is the mean of the *other* valid samples of its group, so it is
    independent of r_i and the estimator unbiased; it equals n_g/(n_g − 1)·(r_i − mean_g).
    Groups with one valid row have no "others" and get 0. ``std_normalize`` is ignored.

    Shapes:
        rewards: (B,); group_ids: (B,); mask: (B, T); returns advantages (B, T), returns None.
    """
    dt = _dtype(inp)
    r = _sequence_scores(inp, dt)
    st = group_stats(r, inp.valid_rows(), inp.group_ids)
    n = st.count[st.inverse]
    others = (st.total[st.inverse] - r) / (n - 1).clamp_min(1)
    return _group_output(inp, r - others, st)


# The token-level estimators (core.token_advantages), registered after the group ones: the registry's order.
ADVANTAGES.register("reinforce")(reinforce)
ADVANTAGES.register("gae")(gae)
ADVANTAGES.register("opd")(opd)
