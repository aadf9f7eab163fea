"""`DistillModule`: on-policy distillation (and its mix with RL) on top of PolicyModule's update loop.

The student samples on-policy through the usual RolloutCallback; a ``TeacherRouter`` (ExperienceHook) scores
the student's tokens with each row's domain teacher. The module then optimises a weighted sum of terms, each
logged as ``loss/<name>`` (already multiplied by its coefficient); those on the student's rollouts are one
loss term of the module's own (``StudentDistillation``, first in ``own_loss_terms``):

=====================  =====================================================================================
``reverse_kl_sampled``  policy-gradient loss (the module's ``policy_loss``) with the per-token advantage
                        A_t = −(log π_θ(y_t) − log π_T(y_t)) (``core.advantages`` "opd"); its expected
                        gradient is ∇ KL(π_θ‖π_T) (GKD arXiv 2306.13649; MiniLLM arXiv 2306.08543); under
                        a truncating sampler π^s ∇ KL(π^s_θ‖π_T) over the kept set (a warning at setup).
``reverse_kl_full``     exact Σ_v p_v (log p_v − log q_v) per position (``core.kl.kl_from_logits``), chunked.
``topk_reverse_kl``     the same over the teacher's top-k tokens + a tail bucket (``core.distill``).
``forward_kl``          Σ_v q_v (log q_v − log p_v) per position (classic KD, mode-covering).
``jsd``                 generalised JSD_β of GKD (``core.kl.generalized_jsd``), β = ``jsd_beta``.
``sft_on_success``      rejection-sampled distillation: teacher rollouts that pass the reward are trained on
                        with cross-entropy, as one extra optimizer step per RL iteration (see below).
=====================  =====================================================================================

RL mixing: ``rl_coef`` > 0 keeps the reward policy-gradient term (the PolicyModule's ``advantage`` estimator,
e.g. GRPO) with its advantages multiplied by ``rl_coef`` — for the PPO-clip / GSPO / CISPO / REINFORCE losses
that scales the term by exactly ``rl_coef`` (they are positively homogeneous in the advantage); ``rl_coef=0``
is pure distillation (the rewards are then only monitored).

``kd_on`` picks which rollouts the full-distribution terms (forward_kl, jsd) read: ``student`` (on-policy,
GKD λ=1), ``teacher`` (the teacher's own samples, i.e. supervised KD; done in the teacher-data step), or both.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.core.aggregation import aggregate
from lit_rl.core.distill import check_losses, masked_cross_entropy, topk_reverse_kl, topk_reverse_kl_linear
from lit_rl.core.fused_logprobs import Projection, linear_divergence, linear_logprobs
from lit_rl.core.group_size import check_group_size
from lit_rl.core.kl import generalized_jsd, kl_from_logits, sampler_differs
from lit_rl.core.logprobs import token_logprobs
from lit_rl.core.policy_losses import PolicyLossInputs, compute_policy_loss, loss_settings
from lit_rl.core.settings import check_choices, flat_settings, setting
from lit_rl.data.experience import Experience
from lit_rl.learners.assembly import advantages_of, store_dtype
from lit_rl.learners.binding import TeacherSource
from lit_rl.learners.config import POLICY_GROUPS, PolicyConfig
from lit_rl.learners.critic import CriticModule
from lit_rl.learners.heads import LazyLogits
from lit_rl.learners.optim_step import LossParts
from lit_rl.learners.policy import OptimizerFactory, PolicyModule, SchedulerFactory, _default_optimizer
from lit_rl.learners.protocols import LossTerm

KD_ON = ("student", "teacher", "both")
# losses that compare the teacher's and the student's full next-token distributions: one vocabulary
FULL_VOCAB_LOSSES = ("reverse_kl_full", "topk_reverse_kl", "forward_kl", "jsd")


@dataclass(frozen=True, kw_only=True)
class DistillSettings:
    """The settings only ``DistillModule`` has (every ``PolicyModule`` setting keeps its meaning there)."""

    losses: dict[str, float] = setting(
        doc="{name: coefficient} over reverse_kl_sampled, reverse_kl_full, topk_reverse_kl, forward_kl, jsd, "
        "sft_on_success (e.g. {reverse_kl_sampled: 1.0}).",
        factory=lambda: {"reverse_kl_sampled": 1.0},
    )
    rl_coef: float = setting(0.0, "Weight of the reward policy-gradient term (0 = distillation only).")
    jsd_beta: float = setting(0.5, "Beta of jsd in (0, 1) (the teacher's weight in the mixture).")
    topk: int = setting(16, "k of topk_reverse_kl.")
    kd_on: str = setting("student", "The rollouts the forward_kl / jsd terms read.", choices=KD_ON)
    opd_baseline: bool = setting(
        False,
        "reverse_kl_sampled subtracts the leave-one-out group mean of the per-token advantage at each "
        "position (core.advantages opd with baseline; unbiased, lower variance).",
    )


@dataclass(frozen=True)
class DistillConfig(PolicyConfig):
    """``PolicyConfig`` and the ``DistillSettings`` group."""

    distill: DistillSettings = field(default_factory=DistillSettings)

    def validate(self, source: bool = True) -> DistillConfig:
        d = self.distill
        check_choices(d)
        losses = check_losses(d.losses)
        if not (d.rl_coef >= 0 and d.rl_coef < float("inf")):
            raise ValueError(f"rl_coef must be a finite number >= 0, got {d.rl_coef}")
        if not 0.0 < d.jsd_beta < 1.0:
            raise ValueError(f"jsd_beta must lie strictly in (0, 1), got {d.jsd_beta}")
        if d.topk < 1:
            raise ValueError(f"topk must be >= 1, got {d.topk}")
        if d.kd_on != "student" and not {"forward_kl", "jsd"} & set(losses):
            raise ValueError(
                f"kd_on={d.kd_on!r} only affects forward_kl / jsd, which are not in losses {sorted(losses)}"
            )
        if not isinstance(d.opd_baseline, bool):
            raise TypeError(f"opd_baseline must be true or false, got {d.opd_baseline!r}")
        if d.opd_baseline and "reverse_kl_sampled" not in losses:
            raise ValueError(
                f"opd_baseline only affects reverse_kl_sampled, which is not in losses {sorted(losses)}"
            )
        super().validate(source)
        return self


DISTILL_GROUPS = (*POLICY_GROUPS, DistillSettings)  # DistillConfig's fields (cli/precheck.py reads it)


@flat_settings(DISTILL_GROUPS)
class DistillModule(PolicyModule):
    """On-policy distillation from one or many teachers (``TeacherRouter``), optionally mixed with RL.

    Takes every ``PolicyModule`` setting (same meaning) and the ``DistillSettings`` group's, read from
    ``self.config.distill``.

    Args:
        model: the student: local directory or hub id of a causal LM.
        optimizer: LightningCLI ``OptimizerCallable`` (default AdamW, lr 1e-5).
        lr_scheduler: LightningCLI ``LRSchedulerCallable``; None = a constant learning rate.
        critic: a ``CriticModule`` (PPO), as in ``PolicyModule``.
    """

    config_type = DistillConfig
    config: DistillConfig  # built from config_type

    def __init__(
        self,
        model: str,
        *,
        optimizer: OptimizerFactory = _default_optimizer,
        lr_scheduler: SchedulerFactory | None = None,
        critic: CriticModule | None = None,
        **settings: Any,
    ):
        # its own __init__ only so that flat_settings gives this class its own signature (not PolicyModule's)
        super().__init__(model, optimizer=optimizer, lr_scheduler=lr_scheduler, critic=critic, **settings)

    @property
    def losses(self) -> dict[str, float]:
        return self.config.distill.losses

    # ------------------------------------------------------------ teachers
    @property
    def teacher_topk_k(self) -> int | None:
        """Asked by the TeacherRouter: store the teacher's top-k (only when topk_reverse_kl is used)."""
        return self.config.distill.topk if "topk_reverse_kl" in self.losses else None

    def router(self) -> TeacherSource:
        """The TeacherRouter of the rollout binding (``learners/binding.py``: the RolloutCallback binds the
        one in trainer.callbacks at its setup)."""
        bound = self.bound_rollout
        if bound is not None and bound.teacher_router is not None:
            return bound.teacher_router
        raise RuntimeError(
            "DistillModule needs a TeacherRouter and a RolloutCallback in trainer.callbacks (the router "
            "scores the student's rollouts with the teachers; the rollout callback binds it to the module at "
            "setup); e.g. -c callbacks/teachers.yaml"
        )

    def setup(self, stage: str) -> None:
        if stage == "fit":  # fail before the first rollout, not in the middle of it
            full = [n for n in FULL_VOCAB_LOSSES if n in self.losses]
            self.router().check_teachers(self, full[0] if full else None)
            # (the rollout callback's setup, which sets the sampler, runs before the module's)
            if "reverse_kl_sampled" in self.losses and (why := sampler_differs(self.processing)):
                warnings.warn(
                    f"reverse_kl_sampled with a rollout sampler other than the model's softmax ({why}): its "
                    "expected gradient is that of KL(π^s‖π_T), the reverse KL of the sampler's distribution over "
                    "its kept set to the teacher; the student's probability outside the kept set gets no gradient. "
                    "reverse_kl_full is the exact per-token KL(π‖π_T) over the whole vocabulary (identical "
                    "vocabularies).",
                    UserWarning,
                    stacklevel=2,
                )

    # ---------------------------------------------------------- advantages
    def compute_advantages(self, exp: Experience) -> dict[str, float]:
        metrics = super().compute_advantages(exp)
        # rl_coef scales the reward PG term (0 = off)
        exp.advantages = advantages_of(exp) * self.config.distill.rl_coef
        if "reverse_kl_sampled" in self.losses:
            if exp.teacher_logprobs is None:
                raise RuntimeError(
                    "reverse_kl_sampled: the Experience has no teacher_logprobs; add a TeacherRouter"
                )
            # the model's full softmax (with processed sampling too), on the Experience's device like the teacher's
            pol = self.kl_policy_logprobs(exp)
            out = compute_advantages(
                "opd",
                AdvantageInputs(
                    rewards=torch.zeros_like(exp.rewards),
                    mask=exp.loss_mask,
                    logprobs=pol,
                    teacher_logprobs=exp.teacher_logprobs,
                    valid=torch.ones_like(exp.valid),
                    group_ids=exp.group_ids,
                    baseline=self.config.distill.opd_baseline,
                ),
            )
            exp.extras["opd_advantages"] = store_dtype(out.advantages, pol)  # (B, C)
            metrics.update(
                {f"distill/{k.split('/')[-1]}": v for k, v in out.metrics.items() if k.startswith("opd/")}
            )
        return metrics

    # ---------------------------------------------------------------- loss
    @property
    def own_loss_terms(self) -> list[LossTerm]:
        """The student distillation first (its parts are added before a critic's, as the policy objective's
        are), then PolicyModule's own terms."""
        return [STUDENT_DISTILLATION, *super().own_loss_terms]

    def full_vocab_terms(self, names, micro, mask, fwd) -> dict[str, Tensor]:
        """The full-vocabulary divergences ``names`` (reverse_kl_full, forward_kl, jsd) of one micro-batch
        against its teacher, each coefficient-weighted: of the student's rollouts (``StudentDistillation``) or
        of the teacher's own (the teacher-data step)."""
        c, out, beta = self.losses, {}, self.config.distill.jsd_beta
        chunk = self.config.forward.logprob_chunk_size
        head = fwd.get("head")
        if head is None:  # materialised path: student and teacher logits as (b, C, V) tensors
            logits = fwd["logits"]
            t_logits = self.router().teacher_logits(self, micro, names[0])  # (b, C, V), no grad
            for n in names:
                if n == "jsd":
                    d = generalized_jsd(logits, t_logits, beta, mask, chunk, self.temperature)
                else:
                    d = kl_from_logits(
                        logits,
                        t_logits,
                        mask,
                        "reverse" if n == "reverse_kl_full" else "forward",
                        chunk,
                        self.temperature,
                    )
                out[n] = c[n] * self.aggregate(d, mask, fwd)
            return out
        groups = self.router().teacher_heads(
            self, micro, names[0]
        )  # [(rows, Projection | (b', C, V) logits)]
        kinds = {"reverse_kl_full": "reverse", "forward_kl": "forward", "jsd": "jsd"}
        for n in names:
            parts = []
            for idx, teacher in groups:
                rows = torch.as_tensor(idx, device=head.hidden.device)
                student = head if len(groups) == 1 else Projection(head.hidden[rows], head.weight, head.bias)
                parts.append(
                    (
                        rows,
                        linear_divergence(
                            kinds[n],
                            student,
                            teacher,
                            mask[rows.to(mask.device)],
                            self.temperature,
                            beta,
                            chunk,
                        ),
                    )
                )
            if len(parts) == 1:
                d = parts[0][1]
            else:  # rows of several teachers: put each group's (b', C) back in place (differentiable)
                d = torch.zeros(mask.shape, dtype=parts[0][1].dtype, device=parts[0][1].device)
                for rows, dg in parts:
                    d = d.index_put((rows.to(d.device),), dg)
            out[n] = c[n] * self.aggregate(d, mask, fwd)
        return out

    # ------------------------------------------------------ teacher-data step
    def training_step(self, batch, batch_idx: int):
        student_terms = self.config.distill.rl_coef > 0 or set(self.losses) - {"sft_on_success"} - (
            {"forward_kl", "jsd"} if self.config.distill.kd_on == "teacher" else set()
        )
        if student_terms:
            super().training_step(batch, batch_idx)
        else:  # nothing reads the student's rollouts: skip a zero-gradient optimizer step, still log them
            self.iteration += 1
            for k, v in batch.metrics.items():
                self.log(k, float(v), on_step=True, on_epoch=False, batch_size=1)
        if "sft_on_success" in self.losses or self.config.distill.kd_on != "student":
            self._teacher_data_step(batch)

    def check_group_size(self, group_size: int) -> None:
        """As ``PolicyModule``'s, except that ``rl_coef`` 0 (no reward term) needs no groups."""
        check_group_size(self.config.advantages.advantage, group_size, self.config.distill.rl_coef)

    def optimizer_steps_per_iteration(self, rows: int) -> int | None:
        """None (no max_steps check) with teacher-data steps: there is one only when some rank has survivors."""
        if "sft_on_success" in self.losses or self.config.distill.kd_on != "student":
            return None
        return super().optimizer_steps_per_iteration(rows)

    def _teacher_data_step(self, batch) -> None:
        """One optimizer step on the teacher's own rollouts for this iteration's prompts: cross-entropy on the
        survivors of the reward filter (``sft_on_success``) + forward_kl / jsd on them (``kd_on`` teacher/both).

        Distributed: ranks keep different numbers of survivors (or none). Every rank pads its rows to the
        largest count with untrained rows (``valid`` False), so all ranks run the same micro-batches; when no
        rank has a survivor every rank skips the step. Denominators are global (``_denominators``) and the step
        goes through the module's ``_optimizer_step`` (clipping, non-finite guard, scheduler).
        """
        rc = self.rollout  # the rollout binding: its sampling and reward pool
        exp = batch.experience
        seen, prompts = set(), []
        for g, p in zip(exp.group_ids.tolist(), exp.prompts):
            if g not in seen:
                seen.add(g)
                prompts.append(p)
        texp, metrics = self.router().teacher_rollouts(self, prompts, rc.settings.sampling, rc.rewards)
        local = 0 if texp is None else texp.batch_size
        rows = int(self._all_reduce_sum(torch.tensor([float(local)]), op="max")[0])
        if rows > 0:
            texp = _pad_rows(texp if texp is not None else exp, rows, keep=local)
            stats = self._optimizer_step(
                self.optimizers(),
                self.lr_schedulers(),
                texp.to(self.device),
                micro_loss=self._teacher_micro_loss,
            )
            metrics.update({k: v for k, v in stats.items() if k.startswith("loss/")})
            metrics["distill/teacher_step_grad_norm"] = stats["actor/grad_norm"]
        for k, v in metrics.items():
            self.log(k, float(v), on_step=True, on_epoch=False, batch_size=1)

    def _teacher_micro_loss(self, micro: Experience, fwd: dict) -> dict[str, Tensor]:
        """Loss terms of one micro-batch of teacher rollouts (the ``micro_loss`` of ``_optimizer_step``)."""
        c, chunk = self.losses, self.config.forward.logprob_chunk_size
        mask = micro.train_mask
        out = self.forward_outputs(micro)
        fwd = LazyLogits(fwd, head=out["head"])
        if out["head"] is not None:
            hd = out["head"]
            lp = linear_logprobs(
                hd.hidden,
                hd.weight,
                micro.completion_ids.to(hd.hidden.device),
                hd.bias,
                self.temperature,
                chunk,
                entropy=False,
            )[0]
        else:
            fwd["logits"] = out["logits"]
            lp = token_logprobs(out["logits"], micro.completion_ids, chunk, self.temperature)
        parts: dict[str, Tensor] = {}
        if "sft_on_success" in c:  # CE on the teacher's tokens: token_mean over the survivors' tokens
            ce = masked_cross_entropy(lp, mask)
            parts["sft_on_success"] = c["sft_on_success"] * aggregate(
                ce, mask, "token_mean", num_tokens=fwd["num_tokens"], num_seqs=fwd["num_seqs"]
            )
        kd = [n for n in ("forward_kl", "jsd") if n in c and self.config.distill.kd_on != "student"]
        if kd:
            parts.update(
                {f"{k}_teacher_rollouts": v for k, v in self.full_vocab_terms(kd, micro, mask, fwd).items()}
            )
        return parts


class StudentDistillation(LossTerm):
    """The distillation terms of a ``DistillModule`` on the student's own rollouts, one of its own loss terms:
    it reads the module's ``losses`` and settings, so one stateless instance serves every module."""

    def loss_terms(self, module: DistillModule, micro: Experience, fwd: dict) -> dict[str, Tensor]:
        """Each of the module's student-rollout terms for one micro-batch, coefficient-weighted and aggregated
        with its ``loss_agg`` over the minibatch's denominators (accumulation-exact).

        Full-vocabulary terms go through the student's ``fwd["head"]`` (hidden states + LM head) chunk by
        chunk, with the teacher's logits computed chunk-wise from its own hidden states: no (b, C, V) tensor
        is built (``fwd["logits"]`` is read only on the materialised path)."""
        c, o = module.losses, module.config.objective
        chunk = module.config.forward.logprob_chunk_size
        lp, mask, head = fwd["logprobs"], fwd["mask"], fwd.get("head")  # (b, C), (b, C), Projection | None
        out: dict[str, Tensor] = {}
        metrics: dict[str, float] = {}
        if "reverse_kl_sampled" in c:
            old = micro.old_logprobs if micro.old_logprobs is not None else lp.detach()
            # its clip statistics: the policy objective's own (actor/clipfrac) read the reward advantages, all 0
            # at rl_coef 0, so they never show this term's clipping
            per_tok, pm = compute_policy_loss(
                o.policy_loss,
                PolicyLossInputs(
                    logprobs=lp,
                    old_logprobs=old,
                    advantages=micro.extras["opd_advantages"],
                    mask=mask,
                    rollout_logprobs=None,
                    is_weights=None,
                    **loss_settings(o),
                ),
            )
            out["reverse_kl_sampled"] = c["reverse_kl_sampled"] * module.aggregate(per_tok, mask, fwd)
            metrics.update(
                {f"distill/{k}": pm[k] for k in ("clipfrac", "clipfrac_low", "clipfrac_high") if k in pm}
            )
        if "topk_reverse_kl" in c:
            C = mask.shape[1]
            ex = micro.extras
            teacher = (
                ex["teacher_topk_logprobs"][:, :C],
                ex["teacher_topk_ids"][:, :C],
                ex["teacher_tail_logprob"][:, :C],
            )
            if head is not None:
                kl = topk_reverse_kl_linear(head, *teacher, mask, module.temperature, chunk)
            else:
                kl = topk_reverse_kl(
                    fwd["logits"], *teacher, mask, module.temperature, module.config.step.micro_batch_size
                )
            out["topk_reverse_kl"] = c["topk_reverse_kl"] * module.aggregate(kl, mask, fwd)
        full = [
            n
            for n in ("reverse_kl_full", "forward_kl", "jsd")
            if n in c and (n == "reverse_kl_full" or module.config.distill.kd_on != "teacher")
        ]
        if full:
            out.update(module.full_vocab_terms(full, micro, mask, fwd))
        return LossParts(out, metrics)  # a dict of parts, its metrics attached (averaged over micro-batches)


STUDENT_DISTILLATION = StudentDistillation()


def _pad_rows(exp: Experience, rows: int, keep: int) -> Experience:
    """``exp``'s first ``keep`` rows followed by copies of row 0 marked untrained (``valid`` False) up to ``rows``
    rows: same micro-batch count on every rank, no effect on any loss or denominator."""
    idx = list(range(keep)) + [0] * (rows - keep)
    out = exp.select(idx)
    valid = out.valid.clone()
    valid[keep:] = False
    out.valid = valid
    return out
