"""Per-token policy-gradient losses: PPO-clip, GSPO, CISPO, SAPO, VESPO, REINFORCE.

Every loss is registered in ``POLICY_LOSSES`` with one signature: it takes a ``PolicyLossInputs`` and returns
``(per_token_loss, metrics)``. ``per_token_loss`` is (B, T), zero wherever ``mask`` is False, and still has to be
aggregated (token mean, sequence mean, ...) by the caller, so the loss and the aggregation mode stay independent
config choices. ``metrics`` holds plain floats computed without grad on masked tokens only; every loss reports the
same keys so a logger sees a stable set:

- ``clipfrac_low``: fraction of masked tokens where the lower bound of the ratio clip changes the gradient
  (for the surrogate losses: A < 0 and r < 1 - clip_low);
- ``clipfrac_high``: the same for the upper bound (A > 0 and r > 1 + clip_high); ``clipfrac``: either;
- ``dual_clipfrac``: fraction where the dual-clip bound -c*A is the active loss (A < 0 and r > c);
- ``ratio_min`` / ``ratio_mean`` / ``ratio_max``: statistics of r = pi / pi_old (GSPO: of the sequence ratio s_i,
  over rows that have at least one masked token);
- ``approx_kl``: k3 estimate of KL(pi_old || pi), mean over masked tokens of (r - 1) - log r (unbiased because the
  tokens were sampled from pi_old).

An all-masked batch gives an all-zero loss (and zero gradient) and all-zero metrics.

Numerics: the log-ratio that enters a loss is clamped to [-20, 20] before ``exp`` (veRL does the same) so that a
stale or corrupted row cannot overflow float32 into an inf loss or a NaN gradient. Inside that range nothing
changes; outside it the only affected case with a non-negligible effect is A < 0, no dual clip, r > e^20 ~ 4.9e8,
where the unclamped PPO loss is unbounded anyway. The ratio metrics use the unclamped log-ratio in float64 and can
report ``inf``, never NaN.

Files: this module holds the registry, ``ADVANTAGE_LINEAR``, the losses and the math they share;
``core.policy_loss_base`` the settings, ``LOSS_PARAMS`` and ``PolicyLossInputs`` (re-exported here).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# The settings, the inputs and LOSS_PARAMS are declared in core.policy_loss_base and re-exported here, the path
# users, configs and tests import them from.
from lit_rl.core.policy_loss_base import (  # noqa: F401 - PolicyLossKwargs, loss_settings, loss_param_error re-exported
    LOSS_PARAMS,
    PolicyLossInputs,
    PolicyLossKwargs,
    PolicyLossSettings,
    loss_param_error,
    loss_settings,
)
from lit_rl.core.registry import Registry

__all__ = [
    "ADVANTAGE_LINEAR",
    "LOSS_PARAMS",
    "POLICY_LOSSES",
    "PolicyLossInputs",
    "PolicyLossSettings",
    "compute_policy_loss",
]

POLICY_LOSSES: Registry = Registry("policy_loss")
# The losses whose per-token value is A_t times a finite factor (is_weights included): a row whose advantages
# are 0 on every masked-in token adds exactly 0 to the loss and to its gradient, so a step may leave it out of
# the forward (PolicyModule's skip_zero_advantage_rows). A user's loss is outside the set (its rows are never
# skipped) until its registration also declares ``ADVANTAGE_LINEAR.add(name)``; tests/test_signal_rows.py
# checks the property numerically for every registered loss against membership.
ADVANTAGE_LINEAR: set[str] = {"ppo_clip", "gspo", "cispo", "sapo", "vespo", "reinforce"}

# Bound on |log r| inside the losses; e^20 ~ 4.85e8 is far outside any useful clip range yet far from overflow.
_LOG_RATIO_CLAMP = 20.0
_METRIC_KEYS = (
    "clipfrac_low",
    "clipfrac_high",
    "clipfrac",
    "dual_clipfrac",
    "ratio_min",
    "ratio_mean",
    "ratio_max",
    "approx_kl",
)


def compute_policy_loss(name: str, inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Look ``name`` up in ``POLICY_LOSSES`` and apply it.

    Shapes:
        inputs: see ``PolicyLossInputs`` (all (B, T)).
        returns: per_token_loss (B, T), zero where ``inputs.mask`` is False; metrics dict[str, float].
    """
    return POLICY_LOSSES.get(name)(inputs)


# ---------------------------------------------------------------------------------------------------------------
# shared pieces


def _sanitized(inputs: PolicyLossInputs) -> tuple[Tensor, Tensor, Tensor]:
    """logprobs, old_logprobs (detached) and advantages with padding replaced by 0.

    Replacing rather than multiplying keeps an Inf/NaN in padding from turning into a NaN value or NaN gradient
    (``where`` sends a zero gradient to the unselected branch).
    """
    m = inputs.mask
    lp = torch.where(m, inputs.logprobs, torch.zeros_like(inputs.logprobs))
    old = torch.where(m, inputs.old_logprobs.detach(), torch.zeros_like(inputs.old_logprobs))
    adv = torch.where(m, inputs.advantages.detach(), torch.zeros_like(inputs.advantages))
    return lp, old, adv


def _finish(loss: Tensor, inputs: PolicyLossInputs) -> Tensor:
    """Apply the caller's detached per-token weights and zero the padding."""
    if inputs.is_weights is not None:
        w = torch.where(inputs.mask, inputs.is_weights.detach(), torch.zeros_like(inputs.is_weights)).to(
            loss.dtype
        )
        loss = loss * w
    return torch.where(inputs.mask, loss, torch.zeros_like(loss))


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's pessimistic clipped surrogate, negated so it is a loss.

    L = -min(r*A, clip(r, 1 - clip_low, 1 + clip_high)*A); with dual clip c and A < 0: L = min(L, -c*A).

    Shapes:
        ratio, adv: (B, T). returns loss (B, T) and three bool (B, T) masks: lower clip binds, upper clip binds,
        dual clip binds (before masking by the caller).
    """
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    unclipped_obj = ratio * adv
    clipped_obj = clipped_ratio * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    with torch.no_grad():
        # The clip "binds" exactly when the clipped branch is the strictly smaller objective: its gradient is then 0.
        binds = clipped_obj < unclipped_obj
        low, high = binds & (adv < 0), binds & (adv > 0)
    if dual_clip is None:
        return loss, low, high, torch.zeros_like(low)
    bound = -dual_clip * adv  # (B, T), only meaningful where A < 0
    with torch.no_grad():
        dual = (adv < 0) & (loss > bound)
    loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss, low, high, dual


def _metrics(
    mask: Tensor,
    low: Tensor,
    high: Tensor,
    dual: Tensor,
    tok_log_ratio: Tensor,
    ratio_log: Tensor,
    ratio_mask: Tensor,
) -> dict[str, float]:
    """Clip fractions over masked tokens; ratio stats of exp(``ratio_log``) over ``ratio_mask`` entries; k3 KL from
    the token log-ratio. Computed in float64 without grad; all zeros when nothing is masked in."""
    with torch.no_grad():
        n_tok = int(mask.sum())
        n_ratio = int(ratio_mask.sum())
        if n_tok == 0 or n_ratio == 0:
            return dict.fromkeys(_METRIC_KEYS, 0.0)
        lr = tok_log_ratio.detach().double()[mask]
        k3 = torch.expm1(lr) - lr  # (r - 1) - log r; expm1 keeps precision for r close to 1
        ratios = ratio_log.detach().double()[ratio_mask].exp()
        low_n, high_n = float((low & mask).sum()), float((high & mask).sum())
        return {
            "clipfrac_low": low_n / n_tok,
            "clipfrac_high": high_n / n_tok,
            "clipfrac": (low_n + high_n)
            / n_tok,  # the two cases are disjoint (they need opposite signs of A)
            "dual_clipfrac": float((dual & mask).sum()) / n_tok,
            "ratio_min": float(ratios.min()),
            "ratio_mean": float(ratios.mean()),
            "ratio_max": float(ratios.max()),
            "approx_kl": float(k3.mean()),
        }


def _reject_dual_clip(name: str, inputs: PolicyLossInputs) -> None:
    # A configured setting that a loss would ignore is an error, never a silent no-op.
    if inputs.dual_clip is not None:
        raise ValueError(
            f"dual_clip={inputs.dual_clip} is not used by policy loss {name!r}; "
            "only 'ppo_clip' and 'gspo' apply it"
        )
    _reject_foreign_params(name, inputs)


def _reject_foreign_params(name: str, inputs: PolicyLossInputs) -> None:
    """Refuse a set ``LOSS_PARAMS`` field that belongs to another loss (it would be silently ignored)."""
    for field, (owner, *_) in LOSS_PARAMS.items():
        if owner != name and getattr(inputs, field) is not None:
            raise ValueError(
                f"{field}={getattr(inputs, field)} is not used by policy loss {name!r}; only "
                f"{owner!r} applies it (set it to null)"
            )


def _param(inputs: PolicyLossInputs, field: str) -> float:
    v = getattr(inputs, field)
    return LOSS_PARAMS[field][1] if v is None else float(v)


# ---------------------------------------------------------------------------------------------------------------
# losses


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Token-level PPO clipped surrogate with asymmetric and optional dual clipping.

    r_t = exp(log pi(y_t) - log pi_old(y_t));
    L_t = -min(r_t * A_t, clip(r_t, 1 - clip_low, 1 + clip_high) * A_t);
    dual clip (c > 1), for A_t < 0 only: L_t = min(L_t, -c * A_t), bounding the loss by c * |A_t|.

    PPO: arXiv 1707.06347; asymmetric "clip-higher": DAPO arXiv 2503.14476; dual clip: arXiv 1912.09729.
    Departures: log r is clamped to [-20, 20] before exp (see module docstring); the paper's value and entropy
    terms are separate loss terms in lit_rl.

    Shapes:
        inputs: (B, T) tensors (see ``PolicyLossInputs``). returns loss (B, T), metrics dict[str, float].
    """
    _reject_foreign_params("ppo_clip", inputs)
    lp, old, adv = _sanitized(inputs)
    log_ratio = lp - old  # (B, T), 0 on padding
    ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    loss, low, high, dual = _clipped_surrogate(
        ratio, adv, inputs.clip_low, inputs.clip_high, inputs.dual_clip
    )
    metrics = _metrics(inputs.mask, low, high, dual, log_ratio, log_ratio, inputs.mask)
    return _finish(loss, inputs), metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization, token form ("GSPO-token", arXiv 2507.18071).

    s_i = exp(mean_{t in y_i} (log pi(y_t) - log pi_old(y_t)))   (length-normalised sequence ratio)
    s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]                    (value s_i, gradient s_i * grad log pi(y_t))
    L_{i,t} = -min(s_{i,t} * A_{i,t}, clip(s_{i,t}, 1 - clip_low, 1 + clip_high) * A_{i,t})

    Aggregated with a per-sequence token mean and then a mean over rows ("seq_mean_token_mean"), and with A
    constant along a row, the gradient is exactly the paper's sequence-level GSPO gradient
    s_i * A_i * (1/|y_i|) * sum_t grad log pi(y_t) (and 0 for a clipped sequence); per-token A keeps the
    GSPO-token generalisation. The clip is on the sequence ratio, so the useful range is tiny: the paper uses
    clip_low=3e-4, clip_high=4e-4, not PPO's 0.2. ``dual_clip`` is applied as in ``ppo_clip`` if set (not in the
    paper). Departure: the sequence log-ratio is clamped to [-20, 20]. Ratio metrics describe s_i over rows with at
    least one token; clip fractions and ``approx_kl`` are per token.

    Shapes:
        inputs: (B, T) tensors. returns loss (B, T), metrics dict[str, float].
    """
    _reject_foreign_params("gspo", inputs)
    mask = inputs.mask
    lp, old, adv = _sanitized(inputs)
    tok_log_ratio = lp - old  # (B, T), 0 on padding
    n_tok = mask.sum(dim=-1)  # (B,)
    seq_log_ratio = tok_log_ratio.sum(dim=-1) / n_tok.clamp(min=1).to(lp.dtype)  # (B,), 0 for empty rows
    seq_log_ratio_c = seq_log_ratio.detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    # log s_{i,t} = sg[log s_i] + log pi(y_t) - sg[log pi(y_t)]: equals log s_i, differentiates like log pi(y_t).
    log_s_tok = seq_log_ratio_c[:, None] + lp - lp.detach()  # (B, T)
    loss, low, high, dual = _clipped_surrogate(
        log_s_tok.exp(), adv, inputs.clip_low, inputs.clip_high, inputs.dual_clip
    )
    metrics = _metrics(mask, low, high, dual, tok_log_ratio, seq_log_ratio, n_tok > 0)
    return _finish(loss, inputs), metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

    L_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A_t * log pi(y_t),  r_t = pi(y_t) / pi_old(y_t).

    Unlike PPO, a clipped token keeps its gradient; only its weight is bounded. The paper bounds the weight from
    above only (it sets eps_low large); here ``clip_low=1.0`` gives the lower bound 0, i.e. none. A clip "binds"
    (``clipfrac_low``/``clipfrac_high``) where the weight is actually changed and A != 0, whatever the sign of A.
    The paper aggregates with a token mean over the batch. ``dual_clip`` is rejected (no meaning here).

    Shapes:
        inputs: (B, T) tensors. returns loss (B, T), metrics dict[str, float].
    """
    _reject_dual_clip("cispo", inputs)
    lp, old, adv = _sanitized(inputs)
    log_ratio = lp - old  # (B, T)
    with torch.no_grad():
        ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
        weight = ratio.clamp(1.0 - inputs.clip_low, 1.0 + inputs.clip_high)
        active = adv != 0
        low, high = active & (ratio < weight), active & (ratio > weight)
    loss = -weight * adv * lp
    metrics = _metrics(inputs.mask, low, high, torch.zeros_like(low), log_ratio, log_ratio, inputs.mask)
    return _finish(loss, inputs), metrics


@POLICY_LOSSES.register("sapo")
def sapo_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimization (SAPO, arXiv 2511.20347): a smooth gate instead of the hard ratio
    clip.

    L_t = -f(r_t) * A_t,  f(r) = sigmoid(tau * (r - 1)) * 4 / tau,  r_t = pi(y_t) / pi_old(y_t),
    tau = ``sapo_tau_pos`` (default 1.0) where A_t > 0, ``sapo_tau_neg`` (default 1.05) where A_t <= 0.

    The gradient is -A_t * 4 s (1 - s) * r_t * grad log pi(y_t) with s = sigmoid(tau (r_t - 1)): exactly the
    policy gradient on-policy (r = 1, weight 1) and fading smoothly as r leaves 1, faster for the larger tau
    (the paper damps negative-advantage tokens harder, as their updates spread mass over the whole
    vocabulary). The paper (and TRL's ``loss_type="sapo"``) aggregates per sequence, then over rows:
    ``seq_mean_token_mean``. No hard clip: clip fractions are 0. ``dual_clip`` is rejected. Departure: log r
    clamped to [-20, 20].

    Shapes:
        inputs: (B, T) tensors. returns loss (B, T), metrics dict[str, float].
    """
    _reject_dual_clip("sapo", inputs)
    lp, old, adv = _sanitized(inputs)
    log_ratio = lp - old  # (B, T), 0 on padding
    ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    pos, neg = _param(inputs, "sapo_tau_pos"), _param(inputs, "sapo_tau_neg")
    tau = torch.where(adv > 0, torch.full_like(ratio, pos), torch.full_like(ratio, neg))  # (B, T)
    loss = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    none = torch.zeros_like(inputs.mask)
    metrics = _metrics(inputs.mask, none, none, none, log_ratio, log_ratio, inputs.mask)
    return _finish(loss, inputs), metrics


@POLICY_LOSSES.register("vespo")
def vespo_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Variational sequence-level soft policy optimization (VESPO, arXiv 2602.10693): a smooth Gamma-shaped
    weight of the *sequence* ratio on a REINFORCE term instead of a clip.

    w_i = exp(sum_{t in y_i} (log pi(y_t) - log pi_old(y_t)))   (the product of the token ratios, not a mean)
    phi(w) = e^lambda * w^k * e^(-lambda w)                       (phi(1) = 1; k, lambda from the sign of A)
    L_t = -sg[phi(w_i)] * A_t * log pi(y_t)

    k, lambda = ``vespo_k_pos``, ``vespo_lambda_pos`` (2, 3) where A_t >= 0, ``vespo_k_neg``,
    ``vespo_lambda_neg`` (3, 2) where A_t < 0: phi peaks at w = k / lambda and falls to 0 both for w -> 0
    (power k) and for large w (exponential decay lambda), so stale sequences fade instead of being cut.
    On-policy (w = 1) the gradient is the policy gradient -A_t * grad log pi(y_t). The paper (and TRL's
    ``loss_type="vespo"``) aggregates over the batch's tokens: ``token_mean``. Departures: log w is clamped to
    [log 1e-8, 20] (TRL clamps each token's log-ratio to [-20, 20] and the sum to the same band); an
    engine-mismatch correction (``is_weights``) multiplies the loss per token, where TRL folds it into w.
    ``dual_clip`` is rejected; clip fractions are 0; ratio metrics describe w_i over rows with at least one
    token.

    Shapes:
        inputs: (B, T) tensors. returns loss (B, T), metrics dict[str, float].
    """
    _reject_dual_clip("vespo", inputs)
    mask = inputs.mask
    lp, old, adv = _sanitized(inputs)
    tok_log_ratio = lp - old  # (B, T), 0 on padding
    with torch.no_grad():
        log_w = tok_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).sum(dim=-1)  # (B,)
        log_w = log_w.clamp(math.log(1e-8), _LOG_RATIO_CLAMP)[:, None]  # (B, 1)
        nonneg = adv >= 0

        def pick(pos: str, neg: str) -> Tensor:
            return torch.where(
                nonneg,
                torch.full_like(adv, _param(inputs, pos)),
                torch.full_like(adv, _param(inputs, neg)),
            )

        k, lam = pick("vespo_k_pos", "vespo_k_neg"), pick("vespo_lambda_pos", "vespo_lambda_neg")  # (B, T)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())  # (B, T), finite by the clamps
    loss = -phi * adv * lp
    none = torch.zeros_like(mask)
    seq_log_ratio = tok_log_ratio.sum(dim=-1)  # (B,) unclamped, for the metrics
    metrics = _metrics(mask, none, none, none, tok_log_ratio, seq_log_ratio, mask.sum(dim=-1) > 0)
    return _finish(loss, inputs), metrics


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Plain policy gradient (REINFORCE, Williams 1992; no arXiv id), optionally importance weighted.

    L_t = -A_t * log pi(y_t); if ``rollout_logprobs`` is given,
    L_t = -sg[exp(log pi(y_t) - log mu(y_t))] * A_t * log pi(y_t) with mu the rollout (behaviour) policy, the
    untruncated per-token IS correction. Truncating or masking that weight is the caller's job, through
    ``is_weights`` (and then ``rollout_logprobs`` should be left None to avoid weighting twice).
    ``old_logprobs`` and the clip settings do not enter the loss; ``ratio_*`` and ``approx_kl`` still describe
    pi / pi_old, clip fractions are 0. ``dual_clip`` is rejected. Departure: log(pi/mu) clamped to [-20, 20].

    Shapes:
        inputs: (B, T) tensors. returns loss (B, T), metrics dict[str, float].
    """
    _reject_dual_clip("reinforce", inputs)
    lp, old, adv = _sanitized(inputs)
    loss = -adv * lp
    if inputs.rollout_logprobs is not None:
        with torch.no_grad():
            mu = torch.where(inputs.mask, inputs.rollout_logprobs, torch.zeros_like(inputs.rollout_logprobs))
            weight = (lp - mu).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
        loss = loss * weight
    none = torch.zeros_like(inputs.mask)
    metrics = _metrics(inputs.mask, none, none, none, lp - old, lp - old, inputs.mask)
    return _finish(loss, inputs), metrics
