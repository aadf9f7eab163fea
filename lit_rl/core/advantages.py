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
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lit_rl.core.aggregation import masked_mean, masked_var
from lit_rl.core.group_size import GROUP_RELATIVE, check_group_size  # noqa: F401 (torch-free: the CLI's early check)
from lit_rl.core.groups import GroupStats, group_stats
from lit_rl.core.names import AdvantageName, StdScope
from lit_rl.core.registry import Registry
from lit_rl.core.settings import setting

# What grpo divides by when std_normalize is on: each group's reward std, or the whole (global) batch's.
STD_SCOPES: tuple[str, ...] = ("group", "batch")

ADVANTAGES: Registry[Callable[[AdvantageInputs], AdvantageOutputs]] = Registry("advantage")


@dataclass(frozen=True, kw_only=True)
class AdvantageSettings:
    """The advantage settings of a learner (``PolicyModule`` takes them flat): the one declaration of each."""

    advantage: AdvantageName | str = setting(
        "grpo", "Advantage estimator (core.advantages).", choices=ADVANTAGES.names
    )
    std_normalize: bool = setting(True, "grpo: divide each advantage by a reward std (see std_scope).")
    std_scope: StdScope = setting(
        "group",
        "What grpo's std_normalize divides by: group (each group's reward std) or batch (the whole "
        "batch's, all ranks; TRL's scale_rewards=batch).",
        choices=STD_SCOPES,
    )
    gamma: float = setting(1.0, "Discount of reinforce / gae returns, in [0, 1].")
    lam: float = setting(1.0, "GAE's lambda, in [0, 1].")
    baseline: bool = setting(
        False, "reinforce: subtract the batch-mean return; opd: the leave-one-out group mean per position."
    )
    whiten_advantages: bool | None = setting(
        None,
        "Standardise the advantages over the batch's trainable tokens (all ranks; mean 0, variance 1); "
        "null = on for gae (as TRL / veRL / OpenRLHF), off otherwise.",
    )

    @property
    def whitens(self) -> bool:
        return self.advantage == "gae" if self.whiten_advantages is None else bool(self.whiten_advantages)


@dataclass
class AdvantageInputs:
    """Everything an advantage estimator may read (see the module table for which field each uses).

    Shapes:
        rewards: (B,) float; mask: (B, T) bool; group_ids: (B,) int; token_rewards, values, logprobs,
        teacher_logprobs: (B, T) float; valid: (B,) bool.

    ``valid=False`` marks a row whose reward is unavailable (infra error, timeout): its reward and
    token fields may hold NaN/Inf; they are never read. Non-finite values anywhere an estimator would
    read them (valid rows; action tokens for (B, T) fields) raise ``ValueError``.
    ``baseline`` (reinforce only): subtract one scalar, the mean of G_t over all valid action tokens
    of the batch — see ``reinforce``.
    ``std_scope`` (grpo with ``std_normalize``): ``group`` divides by each group's reward std, ``batch`` by
    the std of every valid row of the batch (TRL's ``scale_rewards="batch"``) — see ``grpo``.
    ``reduce``: sums a small float64 tensor over the data-parallel ranks (None = one process); ``std_scope
    ="batch"`` calls it so that every rank divides by the std of the *global* batch.
    """

    rewards: Tensor
    mask: Tensor
    group_ids: Tensor | None = None
    token_rewards: Tensor | None = None
    values: Tensor | None = None
    valid: Tensor | None = None
    logprobs: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    # the estimator options' defaults are the settings' (one declaration: AdvantageSettings)
    gamma: float = AdvantageSettings.gamma
    lam: float = AdvantageSettings.lam
    std_normalize: bool = AdvantageSettings.std_normalize
    std_scope: str = AdvantageSettings.std_scope
    eps: float = 1e-6
    baseline: bool = AdvantageSettings.baseline
    bootstrap: Tensor | None = None
    reduce: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        r, m = self.rewards, self.mask
        if self.std_scope not in STD_SCOPES:
            raise ValueError(f"std_scope={self.std_scope!r}; valid values: {', '.join(STD_SCOPES)}")
        if not isinstance(r, Tensor) or r.dim() != 1:
            raise ValueError(f"rewards must be a (B,) tensor, got shape {_shape(r)}")
        if not r.is_floating_point():
            raise TypeError(f"rewards must be a floating tensor, got {r.dtype}")
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise TypeError(
                f"mask must be a torch.bool tensor, got {m.dtype if isinstance(m, Tensor) else type(m)}"
            )
        if m.dim() != 2 or m.shape[0] != r.shape[0]:
            raise ValueError(
                f"mask shape {tuple(m.shape)} does not match rewards shape {tuple(r.shape)}; "
                "expected (B, T) with B = len(rewards)"
            )
        for name in ("group_ids", "valid", "bootstrap"):
            x = getattr(self, name)
            if x is not None and (not isinstance(x, Tensor) or x.shape != r.shape):
                raise ValueError(f"{name} shape {_shape(x)} does not match rewards shape {tuple(r.shape)}")
        g = self.group_ids
        if g is not None and (g.is_floating_point() or g.is_complex() or g.dtype == torch.bool):
            raise TypeError(f"group_ids must be an integer tensor, got {g.dtype}")
        for name in ("valid", "bootstrap"):
            x = getattr(self, name)
            if x is not None and x.dtype != torch.bool:
                raise TypeError(f"{name} must be a torch.bool tensor, got {x.dtype}")
        for name in _TOKEN_FIELDS:
            x = getattr(self, name)
            if x is None:
                continue
            if not isinstance(x, Tensor) or x.shape != m.shape:
                raise ValueError(f"{name} shape {_shape(x)} does not match mask shape {tuple(m.shape)}")
            if not x.is_floating_point():
                raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        if not isinstance(self.eps, numbers.Real) or not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps!r}")
        self._check_finite()

    def _check_finite(self) -> None:
        ok = self.valid_rows()
        bad = ok & ~torch.isfinite(self.rewards)
        if bad.any():
            raise ValueError(
                f"rewards hold NaN/Inf at valid rows {bad.nonzero().flatten().tolist()}; "
                "mark unavailable rewards with valid=False"
            )
        read = self.mask & ok[:, None]  # (B, T): the only token positions any estimator reads
        for name in _TOKEN_FIELDS:
            x = getattr(self, name)
            if x is not None and (read & ~torch.isfinite(x)).any():
                rows = (read & ~torch.isfinite(x)).any(dim=1).nonzero().flatten().tolist()
                raise ValueError(f"{name} holds NaN/Inf on action tokens of valid rows {rows}")

    def valid_rows(self) -> Tensor:
        """(B,) bool: ``valid``, or all True when it was not given."""
        if self.valid is None:
            return torch.ones_like(self.rewards, dtype=torch.bool)
        return self.valid


@dataclass
class AdvantageOutputs:
    """What an estimator returns.

    Shapes:
        advantages: (B, T), zero where mask is False and on invalid rows;
        returns: (B, T) value targets (reinforce, gae) or None; metrics: name → float.
    """

    advantages: Tensor
    returns: Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


_TOKEN_FIELDS = ("token_rewards", "values", "logprobs", "teacher_logprobs")


def compute_advantages(name: str, inputs: AdvantageInputs) -> AdvantageOutputs:
    """Run the estimator registered as ``name`` (unknown names raise ValueError listing the valid ones).

    Shapes:
        inputs: see ``AdvantageInputs``; returns advantages (B, T), returns (B, T) or None.
    """
    return ADVANTAGES.get(name)(inputs)


# --------------------------------------------------------------------------------------------- helpers


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def _dtype(inp: AdvantageInputs) -> torch.dtype:
    """Compute in the widest float dtype among the given tensors (float64 tests stay float64)."""
    dt = inp.rewards.dtype
    for name in _TOKEN_FIELDS:
        x = getattr(inp, name)
        if x is not None:
            dt = torch.promote_types(dt, x.dtype)
    return dt


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _action_mask(inp: AdvantageInputs) -> Tensor:
    """(B, T) bool: action tokens of valid rows — where advantages may be non-zero."""
    return inp.mask & inp.valid_rows()[:, None]


def _token_field(inp: AdvantageInputs, name: str, dtype: torch.dtype) -> Tensor:
    """A (B, T) field with everything outside valid action tokens replaced by 0 (so NaN there never leaks)."""
    x = getattr(inp, name)
    if x is None:
        return torch.zeros(inp.mask.shape, dtype=dtype, device=inp.mask.device)
    x = x.to(dtype)
    return torch.where(_action_mask(inp), x, _zero(x))


def _sequence_scores(inp: AdvantageInputs, dtype: torch.dtype) -> Tensor:
    """(B,) r_i = rewards_i + Σ_t token_rewards_{i,t} over action tokens; 0 on invalid rows."""
    r = torch.where(
        inp.valid_rows(), inp.rewards.to(dtype), torch.zeros((), dtype=dtype, device=inp.rewards.device)
    )
    if inp.token_rewards is not None:
        r = r + _token_field(inp, "token_rewards", dtype).sum(dim=1)
    return r


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


def _token_metrics(adv: Tensor, sel: Tensor, invalid_rows: int) -> dict[str, Tensor | float]:
    """adv/{mean,std,max,min} over selected tokens (population std); zeros when nothing is selected."""
    anything = sel.any()
    inf = torch.full((), math.inf, dtype=adv.dtype, device=adv.device)
    lo = torch.where(sel, adv, inf).amin() if adv.numel() else _zero(adv)
    hi = torch.where(sel, adv, -inf).amax() if adv.numel() else _zero(adv)
    return {
        "adv/mean": masked_mean(adv, sel),
        "adv/std": masked_var(adv, sel).sqrt(),
        "adv/max": torch.where(anything, hi, _zero(adv)),
        "adv/min": torch.where(anything, lo, _zero(adv)),
        "adv/invalid_rows": float(invalid_rows),
    }


def _to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """One host transfer for all tensor metrics instead of one ``.item()`` each."""
    tensors = {k: v for k, v in metrics.items() if isinstance(v, Tensor)}
    keys = list(tensors)
    vals = torch.stack([v.detach().double().reshape(()) for v in tensors.values()]).tolist() if keys else []
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    out.update(zip(keys, vals))
    return out


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


@ADVANTAGES.register("reinforce")
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


@ADVANTAGES.register("gae")
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


@ADVANTAGES.register("opd")
def opd(inp: AdvantageInputs) -> AdvantageOutputs:
    """On-policy distillation with a per-token reverse-KL reward (GKD, arXiv 2306.13649; Thinking
    Machines, "On-Policy Distillation", 2025): A_t = −(log π_θ(y_t) − log π_T(y_t)).

    The sampled-token log-ratio is a one-sample estimate of the reverse KL KL(π_θ ‖ π_T) at step t;
    its negation is a per-token reward. Like the Thinking Machines recipe, no discounting or
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
