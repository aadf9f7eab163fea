"""`ReferenceKL`: keep the policy close to a frozen reference model (PPO's π_ref, GRPO's KL term).

PPO for language models has three policies: θ (being trained), θ_old (that sampled the rollouts) and
π_ref (frozen, usually the initial policy). This callback owns π_ref and adds a KL penalty either to the
*reward* (classic RLHF PPO, Ziegler et al. 2019 arXiv 1909.08593; Ouyang et al. 2022 arXiv 2203.02155:
r_t ← r_t − β·k_t, so the critic and the advantages see it) or to the *loss* (GRPO, arXiv 2402.03300:
L ← L + β·agg(k_t), the advantages don't). β is fixed or driven toward a target KL by the adaptive
controller of Ziegler et al. (``core.controllers``).

**The objective** (docs/architecture.md "Truncated sampling"): at every generated position t of the rollouts
(states s_t reached by the rollout sampler), the per-position KL(π(·|s_t) ‖ π_ref(·|s_t)) of the two models'
full softmax(z / T) over the whole vocabulary. ``kl/mean`` is its mean over those positions.

``kind="exact"`` computes it exactly: both models' logits, chunk by chunk through their LM heads
(``core.fused_logprobs.linear_divergence`` / ``core.kl.kl_from_logits``, as the distillation divergences; no
(B, C, V) tensor), with the reference's forward in the training step. Its value and its gradient are exact
whatever the sampler. In the loss: β·agg(KL_t(π_θ‖π_ref)), gradient β∇KL_t. In the reward: −β·KL_t(π_old‖π_ref)
per token *and* the same β·agg(KL_t) in the loss: KL_t is a function of the state, so the reward carries only
how earlier tokens lead to high-KL states (the return), and the loss part the direct ∇KL_t that no reward on the
state can (its policy gradient Σ π^s ∇log π^s · KL_t is 0).

The sampled estimators k1/k2/k3 (``core.kl.kl_estimate``) read only the sampled token's two log-probs. They are
unbiased only for tokens drawn from π itself: with top-k / top-p / min-p / a repetition penalty / greedy the
tokens come from the sampler π^s ≠ π, the mean is Σ_a π^s(a)·k(a), not KL(π‖π_ref), and no sample can see the
mass outside the kept set (tests/callbacks/test_reference_kl_truncated.py, top_k 3 of 101 tokens: E_π^s[k3]
0.208, E_π^s[k1] 0.508, where KL is 0.527). Sampling from π, in the loss (differentiated through log π):

* k1: expected gradient exactly 0 — a noise term; rejected at construction.
* k2 = ½(log r)²: expected gradient = ∇ KL(π‖π_ref) exactly (the "reverse" KL the reward form targets).
* k3 = (r − 1) − log r (GRPO's choice): expected gradient = ∇ KL(π_ref‖π), the *forward* KL, exactly. Its
  value estimates KL(π‖π_ref); the two gradients agree only to first order as π → π_ref.

(checked by exact enumeration in tests/core/test_kl_gradients.py). ``kind="auto"`` (the default) is ``exact``
when the rollout sampler is not the model's softmax(z / T) and ``k3`` when it is (cheap, GRPO's and TRL's
choice, unbiased there). An explicit k1/k2/k3 under such a sampler is honoured, with a warning.

The loss form's sampled estimators are on-policy only for the first optimizer step of an Experience; later
steps (ppo_epochs > 1, minibatches) sample from θ_old, which the estimator does not correct for (``exact`` does
not need samples of θ: it is exact at every step, at the rollout's states).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch

from lit_rl.callbacks._rank_sums import global_sums
from lit_rl.core.controllers import AdaptiveKLController, FixedController
from lit_rl.core.fused_logprobs import Projection, linear_divergence
from lit_rl.core.kl import DEFAULT_LOG_RATIO_CLAMP, KL_KINDS, kl_estimate, kl_from_logits, sampler_differs
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners.protocols import LossTerm
from lit_rl.models.loading import resolve_dtype

KL_WHERE = ("reward", "loss")
REFERENCE_KL_KINDS = ("auto", "exact", *KL_KINDS)


class ReferenceKL(L.Callback, LossTerm):
    """Frozen reference model + KL penalty (an ExperienceHook and a LossTerm, docs/architecture.md "Contracts").

    Args:
        path: reference model directory / hub id; None = a frozen copy of the policy taken at ``setup``
            (before any checkpoint is restored, so a resumed run still references the initial weights).
        kind: ``auto`` (default) | ``exact`` | ``k1`` | ``k2`` | ``k3``. ``exact``: the per-position KL over the
            whole vocabulary from both models' logits (see the module doc); ``k1|k2|k3``: the sampled estimators
            (``core.kl.kl_estimate``; k1 the classic reward penalty, k3 GRPO's loss term), unbiased only when
            the rollout samples from the model's softmax(z / T) (a warning otherwise); ``auto``: ``exact``
            when the sampler truncates, penalises or is greedy (``core.kl.sampler_differs``), else ``k3``.
            ``k1`` with ``where="loss"`` is an error: its expected gradient is zero.
        where: ``reward`` (−β·KL per token added to ``token_rewards`` before advantages; with ``exact`` also
            β·agg(KL) in the loss, logged as ``loss/kl``) or ``loss`` (β·agg(KL) in the loss).
        beta: the (initial) coefficient β.
        target_kl: None = fixed β; otherwise β adapts toward this mean per-token KL (Ziegler et al. 2019),
            measured over all ranks' tokens, with ``n_steps`` = the rows of the global batch.
        horizon, kl_clip: controller horizon (in rows) and error clip.
        device: where the reference lives (``cpu`` saves accelerator memory); None = the policy's device.
        dtype: reference dtype; None = the dtype of the policy's weights at the first reference forward (so
            a copy taken at ``setup`` follows a later precision conversion, e.g. Lightning's ``64-true``).
        micro_batch_size: rows per reference forward; None = the policy's ``micro_batch_size``.
        log_ratio_clamp: |log π_ref − log π| clamp of the estimator (None disables).

    Metrics (per RL iteration): ``kl/mean`` (mean per-token KL (estimate) over all ranks' tokens it applies to:
    at rollout time for ``reward``, over ``reward_mask`` (valid rows, filtered ones included), during the update
    for ``loss``, over the trainable tokens), ``kl/beta`` (β used in this
    iteration, the same on every rank).
    """

    def __init__(
        self,
        path: str | None = None,
        kind: str = "auto",
        where: str = "loss",
        beta: float = 0.05,
        target_kl: float | None = None,
        horizon: float = 10000.0,
        kl_clip: float = 0.2,
        device: str | None = None,
        dtype: str | None = None,
        micro_batch_size: int | None = None,
        log_ratio_clamp: float | None = DEFAULT_LOG_RATIO_CLAMP,
    ):
        if kind not in REFERENCE_KL_KINDS:
            raise ValueError(f"kind={kind!r}; valid values: {', '.join(REFERENCE_KL_KINDS)}")
        if where not in KL_WHERE:
            raise ValueError(f"where={where!r}; valid values: {', '.join(KL_WHERE)}")
        if kind == "k1" and where == "loss":
            raise ValueError(
                "ReferenceKL(kind='k1', where='loss'): k1 = log π − log π_ref in the loss has zero expected "
                "gradient (E_π[∇ log π] = 0), so it would not pull the policy toward the reference at all. "
                "Use kind='k1' with where='reward', or kind='exact' / 'k2' / 'k3' with where='loss'."
            )
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        if target_kl is not None and not target_kl > 0:
            raise ValueError(f"target_kl must be > 0 or null, got {target_kl}")
        if not (math.isfinite(horizon) and horizon > 0):
            raise ValueError(f"horizon must be a finite number > 0 (steps), got {horizon}")
        if not (math.isfinite(kl_clip) and kl_clip >= 0):
            raise ValueError(f"kl_clip must be a finite number >= 0, got {kl_clip}")
        if log_ratio_clamp is not None and not log_ratio_clamp > 0:
            raise ValueError(f"log_ratio_clamp must be > 0 or null, got {log_ratio_clamp}")
        if dtype is not None:
            resolve_dtype(dtype)
        self.path, self.kind, self.where = path, kind, where
        self.device, self.dtype, self.micro_batch_size = device, dtype, micro_batch_size
        self.log_ratio_clamp = log_ratio_clamp
        self.controller = (
            FixedController(beta)
            if target_kl is None
            else AdaptiveKLController(beta, target_kl, horizon, kl_clip)
        )
        self.ref: torch.nn.Module | None = None
        self._kl_sum, self._kl_count, self._rows = 0.0, 0, 0
        self._warned = False

    def resolved_kind(self, module) -> str:
        """The KL this callback computes for ``module``'s rollouts: ``exact`` or a sampled ``k1|k2|k3``
        (``auto`` resolved against the rollout sampler, ``module.processing``). Warns once when an explicit
        sampled estimator meets a sampler other than the model's softmax (the user's choice is kept)."""
        differs = sampler_differs(module.processing)
        if self.kind == "auto":
            return "exact" if differs else "k3"
        if self.kind != "exact" and differs and not self._warned:
            self._warned = True
            warnings.warn(
                f"ReferenceKL(kind={self.kind!r}) with a rollout sampler other than the model's softmax "
                f"({differs}): the tokens come from the truncated / processed sampler π^s, so the sampled "
                f"estimator's mean is Σ_a π^s(a)·{self.kind}(a), biased for KL(π‖π_ref) (and its loss gradient "
                f"for ∇KL), and it cannot see the probability outside the kept set. kind='exact' (or 'auto', "
                f"the default) computes the per-position KL over the whole vocabulary instead.",
                UserWarning,
                stacklevel=2,
            )
        return self.kind

    @property
    def beta(self) -> float:
        return self.controller.value

    # ------------------------------------------------------------ reference
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.ref is None:
            self.build_reference(pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.resolved_kind(
            pl_module
        )  # after every setup (the rollout's sets the sampler): warn before rollouts

    def build_reference(self, module) -> torch.nn.Module:
        """Create the frozen reference (copy of ``module.model`` or loaded from ``path``)."""
        if self.path is None:
            ref = copy.deepcopy(module.model)
        else:
            from lit_rl.models.loading import load_causal_lm

            ref = load_causal_lm(self.path, self.dtype or module.config.precision.dtype)
        ref.eval().requires_grad_(False)  # eval: no dropout, the reference is a fixed function
        if self.device is not None:
            ref.to(self.device)
        self.ref = ref
        return ref

    def _place(self, module) -> None:
        """Reference on its device and in its dtype. Without ``dtype`` it takes the policy's weight dtype
        now, not at ``setup``: the copy is taken before the strategy's precision plugin converts the policy
        (``precision="64-true"`` makes the policy float64 after ``setup``), and a float32 reference under a
        float64 policy would round every ``ref_logprobs`` to float32."""
        if self.ref is None:
            self.build_reference(module)
        target = torch.device(self.device) if self.device is not None else module.device
        policy_dtype = module.model.get_input_embeddings().weight.dtype
        dtype = resolve_dtype(self.dtype) if self.dtype is not None else policy_dtype
        ref = self.ref
        assert ref is not None  # build_reference set it
        p = next(ref.parameters())
        if p.device != target or p.dtype != dtype:
            ref.to(device=target, dtype=dtype)

    @torch.no_grad()
    def reference_logprobs(self, module, exp) -> torch.Tensor:
        """log π_ref of every completion token, (B, C) float32 on the Experience's device, at the
        module's sampling temperature (the same distribution the policy's log-probs use)."""
        self._place(module)
        size = self.micro_batch_size or module.config.step.micro_batch_size
        chunks = []
        for micro in exp.micro_batches(size):
            lp = module.completion_logprobs(
                micro, model=self.ref
            )  # (b, C), chunked through the ref's LM head
            chunks.append((lp.double() if lp.dtype == torch.float64 else lp.float()).to(exp.input_ids.device))
        return torch.cat(chunks)  # (B, C)

    # ---------------------------------------------------------- ExperienceHook
    def on_experience(self, trainer, module, exp) -> None:
        """Attach ``ref_logprobs`` (sampled estimators); with ``where="reward"`` also add −β·KL_t to
        ``token_rewards``.

        The policy side of the reward KL is the rollout policy θ_old under the model's full softmax(z / T), as
        the reference side is (``module.kl_policy_logprobs``): with truncated sampling the engine's log-probs are
        of another distribution, and the KL would not be 0 where the policy equals the reference. ``exact``
        needs no ``ref_logprobs``: in the loss form it runs entirely in the training step, in the reward form
        KL_t(π_old‖π_ref) comes from a no-grad forward of both models here (``rollout_kl``).
        """
        kind = self.resolved_kind(module)
        if kind == "exact":
            if self.where == "reward":
                mask = self.reward_mask(exp)
                kl = self.rollout_kl(module, exp)
                self._penalise(exp, kl, mask, kl.dtype)
            return
        exp.ref_logprobs = self.reference_logprobs(module, exp)
        if self.where != "reward":
            return
        pol = module.kl_policy_logprobs(exp)
        # float64: the penalty is an exact −β·k on top of whatever rewards are there (B·C values, cheap)
        ref = exp.ref_logprobs.double()
        mask = self.reward_mask(exp)
        kl = kl_estimate(pol.to(ref), ref, kind, mask, self.log_ratio_clamp)  # (B, C), 0 off mask
        self._penalise(exp, kl, mask, exp.ref_logprobs.dtype)

    def _penalise(self, exp, kl: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> None:
        """token_rewards −= β·kl (kl (B, C), 0 off ``mask``; new token rewards in ``dtype``: float64 for a float64
        policy, else float32), and count it in ``kl/mean``."""
        base = exp.token_rewards if exp.token_rewards is not None else torch.zeros_like(kl, dtype=dtype)
        exp.token_rewards = base - (self.beta * kl).to(base.dtype)
        self._accumulate(kl, mask, exp.batch_size)

    @torch.no_grad()
    def rollout_kl(self, module, exp) -> torch.Tensor:
        """(B, C) exact KL(π_old(·|s_t) ‖ π_ref(·|s_t)) at every ``reward_mask`` position, 0 elsewhere: a no-grad
        forward of the policy (its weights at the rollout, θ_old) and of the reference per micro-batch, the KL
        chunked through both LM heads. float64 for a float64 policy, else float32."""
        size = self.micro_batch_size or module.config.step.micro_batch_size
        chunks = []
        for micro in exp.micro_batches(size):
            kl = self.exact_kl(module, micro, module.forward_outputs(micro), self.reward_mask(micro))
            chunks.append(kl.detach().to(exp.input_ids.device))
        kl = torch.cat(chunks)  # (B, C)
        return kl if kl.dtype == torch.float64 else kl.float()

    def exact_kl(self, module, micro, out, mask: torch.Tensor) -> torch.Tensor:
        """(b, C) KL(π(·|s_t) ‖ π_ref(·|s_t)) over the whole vocabulary at the module's temperature, 0 off
        ``mask``, differentiable w.r.t. the policy's forward ``out`` (``head`` (a Projection) or materialised
        ``logits``). The reference runs here, without gradient, on the same micro-batch; its logits are formed
        chunk by chunk from its own hidden states and LM head when it allows (as a distillation teacher's), so
        no (b, C, V) tensor is built on the chunked path."""
        self._place(module)
        with torch.no_grad():
            ref_out = module.forward_outputs(micro, model=self.ref)
        ref = ref_out["head"] if ref_out["head"] is not None else ref_out["logits"]
        chunk, t = module.config.forward.logprob_chunk_size, module.temperature
        head = out.get("head")
        if head is not None:
            return linear_divergence("reverse", head, ref, mask.to(head.hidden.device), t, chunk_size=chunk)
        logits = out["logits"]
        ref_logits = ref.logits() if isinstance(ref, Projection) else ref
        return kl_from_logits(
            logits, ref_logits.to(logits.device), mask.to(logits.device), "reverse", chunk, t
        )

    @staticmethod
    def reward_mask(exp) -> torch.Tensor:
        """(B, C) bool: where the reward-form penalty applies — every generated token of every ``valid`` row,
        trainable or not. A valid row the overlong filter excluded (``trainable`` False) still enters its group's
        statistics (r_i = reward_i + Σ_t token_rewards_{i,t}), so it carries its KL penalty like its groupmates
        (as TRL / veRL apply KL-in-reward to every response token); invalid rows have no reward to penalise."""
        return exp.loss_mask & exp.valid.to(exp.loss_mask.device)[:, None]

    # ---------------------------------------------------------------- LossTerm
    def loss_terms(self, module, micro, fwd: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``{"kl": β · agg(KL_t)}`` with the module's loss aggregation: ``where="loss"``, and with ``exact``
        also ``where="reward"`` (the direct ∇KL_t the state-valued reward cannot carry; ``kl/mean`` then counts
        the rollout's KL only)."""
        kind = self.resolved_kind(module)
        mask = fwd["mask"]
        if kind == "exact":
            kl = self.exact_kl(module, micro, fwd, mask)  # (b, C), differentiable w.r.t. the policy
            if self.where == "loss":
                self._accumulate(kl.detach(), mask, micro.batch_size)
            return {"kl": self.beta * module.aggregate(kl, mask, fwd)}
        if self.where != "loss":
            return {}
        if micro.ref_logprobs is None:
            raise RuntimeError(
                "ReferenceKL.loss_terms: the micro-batch has no ref_logprobs; ReferenceKL must be "
                "in trainer.callbacks so its on_experience runs on every Experience"
            )
        lp = fwd["logprobs"]
        kl = kl_estimate(lp, micro.ref_logprobs.to(lp), kind, mask, self.log_ratio_clamp)  # (b, C)
        self._accumulate(kl.detach(), mask, micro.batch_size)
        return {"kl": self.beta * module.aggregate(kl, mask, fwd)}

    def _accumulate(self, kl: torch.Tensor, mask: torch.Tensor, rows: int) -> None:
        self._kl_sum += float(kl[mask].double().sum())
        self._kl_count += int(mask.sum())
        self._rows += rows

    # --------------------------------------------------- controller + metrics
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        """Log ``kl/mean`` and the β used, then let the controller move β for the next iteration.

        The KL sum, token count and rows are summed over ranks (``_rank_sums.global_sums``), so ``kl/mean``
        is the global per-token mean and every rank moves β identically (the checkpoint holds that β). Every
        rank takes part in the reduce, also one whose iteration had no trainable token.
        """
        exp = batch.experience
        local_rows = self._rows
        kl_sum, count, rows = global_sums(
            trainer,
            pl_module,
            [self._kl_sum, self._kl_count, exp.batch_size if exp is not None else self._rows],
        )
        self._kl_sum, self._kl_count, self._rows = 0.0, 0, 0
        if count == 0:  # the same decision on every rank: the counts are global
            return
        kl_mean = kl_sum / count
        pl_module.log("kl/mean", kl_mean, on_step=True, on_epoch=False, batch_size=max(local_rows, 1))
        pl_module.log("kl/beta", self.beta, on_step=True, on_epoch=False, batch_size=max(local_rows, 1))
        self.controller.update(kl_mean, n_steps=round(rows))

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
