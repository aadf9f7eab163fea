"""The token-level advantage estimators: reinforce and gae (right-to-left recursions over a row's action tokens)
and opd (a per-token reverse-KL reward against a teacher).

They share the dense-reward and reverse-scan helpers and read per-token fields, where the group estimators of
``core.advantages`` (grpo, dr_grpo, rloo) score one number per row; kept apart so each file stays readable.
``core.advantages`` registers them (as ``reinforce``, ``gae``, ``opd``) and re-exports them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rl.core.advantage_base import (
    AdvantageInputs,
    AdvantageOutputs,
    _action_mask,
    _dtype,
    _to_floats,
    _token_field,
    _token_metrics,
    _zero,
)
from lit_rl.core.aggregation import masked_mean


def _dense_rewards(inp: AdvantageInputs, dtype: torch.dtype) -> Tensor:
    """(B, T) per-token reward: token_rewards on action tokens plus rewards_i on row i's last action token.

    Rows without an action token drop their sequence reward (there is no token to credit).
    """
    mask = _action_mask(inp)
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)  # (B, T)
    last = torch.where(mask, pos, -1).amax(dim=1, keepdim=True) if T > 0 else None  # (B, 1); -1 = none
    dense = _token_field(inp, "token_rewards", dtype)
    if last is None:
        return dense
    seq = torch.where(
        inp.valid_rows(), inp.rewards.to(dtype), torch.zeros((), dtype=dtype, device=mask.device)
    )
    return dense + torch.where(pos == last, seq[:, None], _zero(dense))  # pos == -1 never matches


def _reverse_scan(
    r: Tensor, v: Tensor, mask: Tensor, gamma: float, lam: float, v_after: Tensor | None = None
) -> Tensor:
    """GAE over action tokens only, right to left: δ_t = r_t + γ V_next − V_t, A_t = δ_t + γλ A_next.

    ``next`` is the next *action* token of the row; after the last one A_next = 0 and V_next = ``v_after``
    (B,) (0 when None: the episode ended; a value when it was cut off and is bootstrapped).
    A token with mask False leaves the carried (A_next, V_next) untouched, which is what skips it.
    With V = 0 and λ = 1 this is the discounted reward-to-go. The loop is over T (the recursion is
    sequential in time); every step is vectorised over the B rows.

    Shapes:
        r, v: (B, T); mask: (B, T) bool; returns (B, T), zero where mask is False.
    """
    B, T = r.shape
    adv = torch.zeros_like(r)
    a_next = r.new_zeros(B)
    v_next = r.new_zeros(B) if v_after is None else v_after.to(r.dtype)
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        a_t = r[:, t] + gamma * v_next - v[:, t] + gamma * lam * a_next
        a_next = torch.where(m, a_t, a_next)
        v_next = torch.where(m, v[:, t], v_next)
        adv[:, t] = torch.where(m, a_next, _zero(r))
    return adv


def reinforce(inp: AdvantageInputs) -> AdvantageOutputs:
    """Discounted reward-to-go (REINFORCE, Williams 1992; no arXiv id): A_t = G_t − b.

    G_t = Σ_{k ≥ t, k action} γ^{n(t,k)} r_k, where r_k = token_rewards_k (+ rewards_i on the row's last
    action token) and n(t,k) = number of action tokens in (t, k]. So γ is applied once per *action*
    token: observation/padding tokens (mask False) are skipped, not discounted.
    Baseline: ``baseline=False`` → b = 0. ``baseline=True`` → b = mean of G_t over every valid action
    token in the batch — one scalar rather than a per-position mean, because rows are ragged (prompts,
    observation spans) and column t means different things in different rows. It includes the row's
    own return, so it is slightly biased, like the batch-mean baselines in practice.
    returns = G_t (value targets). ``std_normalize`` is ignored (whiten with ``masked_whiten``).

    Shapes:
        rewards: (B,); token_rewards: (B, T) or None; mask: (B, T); returns advantages and returns (B, T).
    """
    dt = _dtype(inp)
    sel = _action_mask(inp)
    ret = _reverse_scan(
        _dense_rewards(inp, dt), torch.zeros(sel.shape, dtype=dt, device=sel.device), sel, inp.gamma, 1.0
    )
    adv = ret
    if inp.baseline:
        adv = torch.where(sel, ret - masked_mean(ret, sel), _zero(ret))
    metrics = _token_metrics(adv, sel, int((~inp.valid_rows()).sum()))
    metrics["adv/returns_mean"] = masked_mean(ret, sel)
    return AdvantageOutputs(adv, ret, _to_floats(metrics))


def gae(inp: AdvantageInputs) -> AdvantageOutputs:
    """Generalized Advantage Estimation (arXiv 1506.02438 eq. 16), over action tokens only.

    δ_t = r_t + γ V_{t'} − V_t,  A_t = δ_t + γλ A_{t'},  t' = the next action token of the row
    (V_{t'} = A_{t'} = 0 after the row's last action token); r_t = token_rewards_t plus rewards_i on
    the last action token. returns R_t = A_t + V_t (the λ-return, the critic's target).
    Departure from the paper's per-timestep chain: env-observation tokens in a multi-turn episode are
    not actions, so they are skipped rather than treated as zero-reward steps (this matches treating
    each turn's tokens as consecutive actions of one trajectory). No whitening here (``std_normalize``
    is ignored): whiten with ``masked_whiten`` after computing returns, as PPO implementations do
    (``PolicyModule(whiten_advantages=...)`` does, over all ranks' trainable tokens).

    ``bootstrap`` (B,) bool marks rows cut off by the generation budget (finish reason "length"): the
    episode did not end, so instead of V = 0 after the last action token the recursion continues from
    the value of the last state the row has, V_{t_last} (the state after the final token is never
    scored by the forward that produced ``values``; its predecessor is the closest estimate).

    Shapes:
        rewards: (B,); token_rewards, values: (B, T); mask: (B, T); returns advantages and returns (B, T).
    """
    if inp.values is None:
        raise ValueError(
            "advantage 'gae' needs critic values: AdvantageInputs.values of shape (B, T) is None"
        )
    dt = _dtype(inp)
    sel = _action_mask(inp)
    v = _token_field(inp, "values", dt)
    v_after = None
    if inp.bootstrap is not None:
        T = sel.shape[1]
        pos = torch.arange(T, device=sel.device).expand_as(sel)  # (B, T)
        last = (
            torch.where(sel, pos, -1).amax(dim=1) if T else torch.full_like(inp.rewards, -1, dtype=torch.long)
        )
        v_last = (
            v.gather(1, last.clamp_min(0)[:, None]).squeeze(1) if T else _zero(inp.rewards.to(dt))
        )  # (B,)
        v_after = torch.where(inp.bootstrap & (last >= 0), v_last, _zero(v_last))
    adv = _reverse_scan(_dense_rewards(inp, dt), v, sel, inp.gamma, inp.lam, v_after)
    ret = torch.where(sel, adv + v, _zero(adv))
    metrics = _token_metrics(adv, sel, int((~inp.valid_rows()).sum()))
    metrics["adv/returns_mean"] = masked_mean(ret, sel)
    metrics["adv/values_mean"] = masked_mean(v, sel)
    return AdvantageOutputs(adv, ret, _to_floats(metrics))


def _loo_position_mean(x: Tensor, sel: Tensor, group_ids: Tensor | None) -> Tensor:
    """(B, T): for each row i and position t, the mean of x[j, t] over the other rows j of i's group with
    sel[j, t] (0 where there is none, and on unselected entries). ``group_ids=None`` = one group."""
    B = x.shape[0]
    inv = (
        torch.zeros(B, dtype=torch.long, device=x.device)
        if group_ids is None
        else torch.unique(group_ids, return_inverse=True)[1]
    )
    w = sel.to(x.dtype)
    n_groups = int(inv.max()) + 1 if B else 0
    tot = x.new_zeros((n_groups, x.shape[1])).index_add_(0, inv, x * w)  # (G, T)
    cnt = x.new_zeros((n_groups, x.shape[1])).index_add_(0, inv, w)  # (G, T)
    others = cnt[inv] - w
    mean = (tot[inv] - x * w) / others.clamp_min(1)
    return torch.where(sel & (others > 0), mean, torch.zeros((), dtype=x.dtype, device=x.device))


def opd(inp: AdvantageInputs) -> AdvantageOutputs:
    """On-policy distillation with a per-token reverse-KL reward (GKD, arXiv 2306.13649; Thinking
    Machines, "On-Policy Distillation", 2025): A_t = −(log π_θ(y_t) − log π_T(y_t)).

    The sampled-token log-ratio is a one-sample estimate of the reverse KL KL(π_θ ‖ π_T) at step t;
    its negation is a per-token reward. With tokens from a truncated sampler π^s (log π the full softmax's, as
    ``DistillModule`` passes it), log π = log π^s + log π(K) on the kept set K, a per-position constant, so the
    expected policy gradient (ratio of π^s) is exactly ∇ KL(π^s‖π_T) with K fixed (tests/core/test_kl_truncated.py);
    the tail outside K is reached only by a full-vocabulary loss. Like the Thinking Machines recipe, no discounting or
    reward-to-go (γ = 0 in effect): each token is credited only with its own log-ratio, which is
    lower variance than summing future log-ratios. ``rewards`` are not read (pass zeros);
    ``valid=False`` rows still get 0.

    ``baseline=True`` subtracts, at each position t, the mean advantage of the *other* valid rows of the
    row's group that have an action token at t (leave-one-out, as RLOO does for rewards; 0 when there is no
    other). The other rows are independent samples of the same prompt, so the baseline does not depend on
    row i's tokens and the gradient stays unbiased; it removes the −KL offset every sample of a prompt shares,
    which otherwise makes the update push down almost every sampled token (a confident teacher gives wrong
    tokens log π_T ≈ −15 but right ones only ≈ 0).

    Shapes:
        logprobs, teacher_logprobs: (B, T); mask: (B, T); returns advantages (B, T), returns None.
    """
    if inp.logprobs is None or inp.teacher_logprobs is None:
        missing = [n for n in ("logprobs", "teacher_logprobs") if getattr(inp, n) is None]
        raise ValueError(
            f"advantage 'opd' needs logprobs and teacher_logprobs (B, T); missing: {', '.join(missing)}"
        )
    dt = _dtype(inp)
    sel = _action_mask(inp)
    log_ratio = _token_field(inp, "logprobs", dt) - _token_field(inp, "teacher_logprobs", dt)  # (B, T)
    adv = -log_ratio
    if inp.baseline:
        adv = adv - _loo_position_mean(adv, sel, inp.group_ids)
    metrics = _token_metrics(adv, sel, int((~inp.valid_rows()).sum()))
    metrics["opd/reverse_kl"] = masked_mean(log_ratio, sel)
    return AdvantageOutputs(adv, None, _to_floats(metrics))
