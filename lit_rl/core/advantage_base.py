"""The shared ground of the advantage estimators: the registry object, the settings group, the one input and
output type (``AdvantageInputs`` → ``AdvantageOutputs``) and the masking / metric helpers every estimator uses.

Separate from ``core.advantages`` (the registry that registers the estimators) and ``core.token_advantages``
(reinforce, gae, opd) so that both estimator modules read one definition of the inputs without importing each
other. ``ADVANTAGES`` is created here, empty, because ``AdvantageSettings`` names its registered names as the
choices of ``advantage``; ``core.advantages`` fills it. Import these names from ``lit_rl.core.advantages``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import get_args

import torch
from torch import Tensor

from lit_rl.core.aggregation import masked_mean, masked_var
from lit_rl.core.names import AdvantageName, StdScope
from lit_rl.core.registry import Registry
from lit_rl.core.settings import setting

# What grpo divides by when std_normalize is on: each group's reward std, or the whole (global) batch's.
STD_SCOPES: tuple[str, ...] = get_args(StdScope)  # declared once as the Literal (core/names.py)

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
