"""The on-policy invariants, each a function of a ``Run`` returning the violations (empty = holds).

Known values at the on-policy point (engine weights = policy = reference = old policy):

- structure (``structure``): PPO ratio 1 (``actor/ratio_min|mean|max``), no clipping (``actor/*clipfrac``),
  the loss-form KL 0 (``kl/mean``), every loss part, the gradient norm and every gradient finite;
- distribution (``distribution``): the reward-form KL 0, every importance weight of the mismatch correction
  1 and every token kept (``is/*`` and the weights themselves), the engine/trainer mismatch KL 0.

Float64 tolerances. The engine reports float64 log-probs, but ``ExperienceBuilder`` stores
``rollout_logprobs`` in float32 (``rollout/build.py``): each is off by at most |μ_t|·2⁻²⁴ (round to nearest),
``eps_t`` below, plus float64 noise (1e-12 covers it: measured ≤ 1e-14). Everything read from μ is bounded
through eps_t: a weight by expm1(Σ_t eps_t) (the sequence level sums a row), k1 by max eps_t, k3 (≈ Δ²/2) by
max eps_t²/2 (+10 %). What does not involve μ is exact: ratio and loss-form KL compare two float64 forwards of
the same weights (1e-9 / 1e-12). Logged metrics pass through a float32 tensor (``trainer.callback_metrics``):
ratio 1 ± 1e-9 then means "rounds to exactly 1.0 in float32"; the weights are read from the recorded tensors
instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

F32 = 2.0**-24  # float32 round-to-nearest relative error
NOISE = 1e-12  # float64 forwards of the same weights through different batching / packing (measured ≤ 1e-14)
RATIO_TOL = 1e-9
LOSS_KL_TOL = 1e-12
CLIPFRAC = ("actor/clipfrac", "actor/clipfrac_low", "actor/clipfrac_high", "actor/dual_clipfrac")


@dataclass(frozen=True)
class Float32Bounds:
    """precision 32-true: measured on the 26 EXACT rows (2026-12-05, this repo's CPU), bound = 10x the
    largest. ratio 4.8e-7 (4 float32 ulps of the logged 1.0: old log-probs from a separate forward), loss-form
    KL 1.9e-14, reward-form k1 5.3e-8 (k3 1.9e-14), mismatch KL 3.2e-14, |w − 1| 9.5e-7 (sequence level)."""

    ratio: float = 5e-6
    loss_kl: float = 2e-13
    reward_k1: float = 5e-7
    reward_k3: float = 2e-13
    mismatch: float = 3e-13
    weight: float = 1e-5


FLOAT32 = Float32Bounds()


def engine_eps(run) -> torch.Tensor:
    """(B, C) bound on |stored μ_t − engine μ_t| (float32 storage), 0 off the completion tokens."""
    mu = run.exp.rollout_logprobs.double()
    return torch.where(run.exp.loss_mask, mu.abs() * F32 + NOISE, torch.zeros_like(mu))


def _near(name: str, got: float, want: float, tol: float, out: list[str]) -> None:
    if not (math.isfinite(got) and abs(got - want) <= tol):
        out.append(f"{name} = {got!r}, expected {want} ± {tol:.1e}")


def structure(run, f32: Float32Bounds | None = None) -> list[str]:
    """``f32``: the measured float32 bounds (None: float64's)."""
    m, out = run.metrics, []
    for k in ("actor/ratio_min", "actor/ratio_mean", "actor/ratio_max"):
        if k not in m:
            out.append(f"{k} not logged")
        else:
            _near(k, m[k], 1.0, f32.ratio if f32 else RATIO_TOL, out)
    for k in CLIPFRAC:
        if m.get(k, 0.0) != 0.0:
            out.append(f"{k} = {m[k]!r}, expected 0 (nothing is clipped at ratio 1)")
    if run.settings["kl"].startswith("loss/"):
        if "kl/mean" not in m:
            out.append("kl/mean not logged")
        else:
            _near("kl/mean (loss form)", m["kl/mean"], 0.0, f32.loss_kl if f32 else LOSS_KL_TOL, out)
    for k, v in m.items():
        if k.startswith("loss/") and not math.isfinite(v):
            out.append(f"{k} = {v!r} is not finite")
    if not math.isfinite(m.get("actor/grad_norm", math.nan)):
        out.append(f"actor/grad_norm = {m.get('actor/grad_norm')!r} is not finite")
    if run.weight_diffs:
        out.append(
            f"the engine's own weights differ from the policy's when it generated: {len(run.weight_diffs)} "
            f"tensors, e.g. {run.weight_diffs[:2]} (name, engine dtype, policy dtype)"
        )
    if run.settings["stop"] and "stop" not in run.exp.finish_reasons:
        out.append(
            f"no row ended on a stop string {run.settings['stop']}: the setting was not exercised "
            f"(texts {run.exp.texts})"
        )
    if not run.steps:
        out.append("no optimizer step ran")
    for i, (_, grads) in enumerate(run.steps):
        if grads is not None and not all(bool(torch.isfinite(g).all()) for g in grads):
            out.append(f"optimizer step {i}: non-finite gradient")
    return out


def distribution(run, f32: Float32Bounds | None = None) -> list[str]:
    """``f32``: the measured float32 bounds (None: float64's, from eps_t)."""
    m, out = run.metrics, []
    eps = engine_eps(run)
    e_max = float(eps.max())
    k3_bound = f32.mismatch if f32 else 0.5 * e_max**2 * 1.1 + 1e-15
    # a sequence-level weight sums its row's log-ratios
    row_bound = f32.weight if f32 else math.expm1(float(eps.sum(-1).max())) * 1.1
    kl = run.settings["kl"]
    if kl.startswith("reward/"):
        if f32:
            tol = f32.reward_k1 if kl.endswith("k1") else f32.reward_k3
        else:
            tol = e_max * 1.1 if kl.endswith("k1") else k3_bound
        if "kl/mean" not in m:
            out.append("kl/mean not logged")
        else:
            _near(f"kl/mean (reward form, {kl[-2:]})", m["kl/mean"], 0.0, tol, out)
    bound = k3_bound
    mis = m.get("rollout/logprob_mismatch_kl")
    if mis is None:
        out.append("rollout/logprob_mismatch_kl not logged")
    elif not -1e-15 <= mis <= bound:
        out.append(f"rollout/logprob_mismatch_kl = {mis!r}, expected in [0, {bound:.1e}]")
    if run.settings["correction"] != "none":
        out += _weights(run, row_bound)
    return out


def _weights(run, tol: float) -> list[str]:
    m, out = run.metrics, []
    for k in ("is/masked_frac", "is/clipped_frac"):
        if m.get(k, 0.0) != 0.0:
            out.append(f"{k} = {m[k]!r}, expected 0")
    _near("is/max_weight", m.get("is/max_weight", math.nan), 1.0, max(tol, 1.2e-7), out)  # float32-logged
    if not run.corrections:
        out.append("the mismatch correction never ran")
    for i, (w, keep, mask) in enumerate(run.corrections):
        if not torch.equal(keep, mask):
            out.append(
                f"correction call {i}: kept {int(keep.sum())} of {int(mask.sum())} tokens, expected all"
            )
        dev = float((w.double() - 1.0)[mask].abs().max()) if mask.any() else 0.0
        if not dev <= tol:
            out.append(
                f"correction call {i}: max |w − 1| = {dev:.3e} (mean weight "
                f"{float(w.double()[mask].mean()):.6f}), expected ≤ {tol:.1e}"
            )
    return out
