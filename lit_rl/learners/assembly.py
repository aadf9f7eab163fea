"""The assembly contracts of ``PolicyModule`` (docs/architecture.md, "The three assembly contracts"): advantages
zeroed off ``Experience.train_mask``, whitening and denominators over the trainable tokens of *all* ranks, and
the constant horizon of ``seq_mean_token_sum_norm``. ``PolicyAssembly`` is a mixin of ``PolicyModule`` (it uses
``self.config``, ``self.active_loss_terms()`` and ``self._trainer``); ``DistillModule`` inherits it through
``PolicyModule``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.core.aggregation import aggregate
from lit_rl.data.experience import Experience
from lit_rl.learners.host import PolicyHost


def store_dtype(t: Tensor, like: Tensor | None = None) -> Tensor:
    """Per-token annotations are stored in float32, or float64 when the model / the Experience's rewards are
    float64 (exact float64 checks of the whole step, tests/conformance)."""
    wide = t.dtype == torch.float64 or (like is not None and like.dtype == torch.float64)
    return t.double() if wide else t.float()


def advantages_of(exp: Experience) -> Tensor:
    """``exp.advantages`` (B, C), which ``PolicyAssembly.compute_advantages`` fills before any loss reads them."""
    if exp.advantages is None:
        raise RuntimeError("Experience.advantages is None: PolicyModule.compute_advantages fills them first")
    return exp.advantages


class PolicyAssembly(PolicyHost):
    """Advantages, whitening, rank reductions, horizon and aggregation of ``PolicyModule`` (see the module doc)."""

    def compute_advantages(self, exp: Experience) -> dict[str, float]:
        """Advantages (and returns) of every row, zero off ``exp.train_mask``.

        Group statistics use every ``valid`` row (a row filtered by ``trainable`` still tells its group what
        the prompt's rewards look like), and so does ``std_scope: batch``'s std, over all ranks; whitening
        (``whiten_advantages``) uses the trainable tokens of all ranks.
        """
        a = self.config.advantages
        # A float64 policy (precision "64-true", the exact checks) computes its advantages in float64 also
        # from the float32 rewards ExperienceBuilder stores: float32 group statistics cost ~1e-6 of the gradient.
        rewards = exp.rewards.double() if self._float64_policy() else exp.rewards
        out = compute_advantages(
            a.advantage,
            AdvantageInputs(
                rewards=rewards,
                mask=exp.loss_mask,
                group_ids=exp.group_ids,
                token_rewards=exp.token_rewards,
                values=exp.values,
                valid=exp.valid,
                teacher_logprobs=exp.teacher_logprobs,
                # a teacher's advantage compares two models: the policy's full softmax, not the sampler's (processed)
                logprobs=self.kl_policy_logprobs(exp)
                if exp.teacher_logprobs is not None
                else exp.rollout_logprobs,
                gamma=a.gamma,
                lam=a.lam,
                std_normalize=a.std_normalize,
                std_scope=a.std_scope,
                baseline=a.baseline,
                bootstrap=self._bootstrap_rows(exp),
                reduce=self._all_reduce_sum,
            ),
        )
        train = exp.train_mask
        adv = torch.where(train, out.advantages, torch.zeros((), dtype=out.advantages.dtype))
        metrics = dict(out.metrics)
        if a.whitens:
            adv, wm = self._whiten(adv, train)
            metrics.update(wm)
        exp.advantages = store_dtype(adv, rewards)
        exp.returns = None if out.returns is None else store_dtype(out.returns, rewards)
        for term in self.active_loss_terms():  # e.g. a critic's explained variance
            metrics.update(term.advantage_metrics(exp))
        return metrics

    def _float64_policy(self) -> bool:
        model = getattr(self, "model", None)
        p = next(model.parameters(), None) if model is not None else None
        return p is not None and p.dtype == torch.float64

    def _bootstrap_rows(self, exp: Experience) -> Tensor | None:
        """Rows whose last value is bootstrapped (GAE on a truncated completion), from the first loss term that
        decides it (a critic with ``bootstrap_truncated``); None = none."""
        for term in self.active_loss_terms():
            rows = term.bootstrap_rows(exp)
            if rows is not None:
                return rows
        return None

    def _whiten(self, adv: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        """(A − μ) / sqrt(σ² + 1e-8) over the trainable tokens of every rank (population variance, float64),
        so each rank applies the same μ, σ (the single-process result on the global batch)."""
        a = adv.double()
        stats = torch.stack([a[mask].sum(), (a[mask] ** 2).sum(), mask.sum().double()])  # (3,)
        stats = self._all_reduce_sum(stats)
        n = float(stats[2])
        if n == 0:
            return adv, {}
        mean = stats[0] / n
        var = (stats[1] / n - mean**2).clamp_min(0.0)
        out = torch.where(mask, (a - mean) * torch.rsqrt(var + 1e-8), torch.zeros((), dtype=a.dtype))
        return out.to(adv.dtype), {"adv/raw_mean": float(mean), "adv/raw_std": float(var.sqrt())}

    def _all_reduce_sum(self, t: Tensor, op: str = "sum") -> Tensor:
        """Reduce a small CPU tensor over ranks with ``op`` (sum | max; identity in one process)."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return t
        dev = self.device if self.device.type != "cpu" else torch.device("cpu")
        return trainer.strategy.reduce(t.to(dev), reduce_op=op).cpu()

    def horizon_for(self, exp: Experience) -> int | None:
        """H of ``seq_mean_token_sum_norm``: ``loss_horizon``, else the Experience's; an error without either."""
        o = self.config.objective
        if o.loss_agg != "seq_mean_token_sum_norm":
            return None
        H = o.loss_horizon if o.loss_horizon is not None else exp.horizon
        if H is None:
            raise ValueError(
                "loss_agg='seq_mean_token_sum_norm' divides by a constant horizon, but neither "
                "PolicyModule.loss_horizon nor the Experience's horizon is set (RolloutCallback sets it to "
                "sampling.max_new_tokens; an Experience built by hand needs horizon=...)"
            )
        return int(H)

    def aggregate(self, values: Tensor, mask: Tensor, forward_out: dict[str, Any]) -> Tensor:
        """Aggregate a per-token term with the module's ``loss_agg`` and the *minibatch* denominators
        (``num_tokens`` / ``num_seqs`` of the trainable tokens of all ranks) and the run's constant horizon."""
        return aggregate(
            values,
            mask,
            self.config.objective.loss_agg,
            forward_out.get("horizon"),
            num_tokens=forward_out["num_tokens"],
            num_seqs=forward_out["num_seqs"],
        )
