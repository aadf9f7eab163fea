"""`PolicyModule`: the policy-gradient learner (GRPO family, PPO-clip, GSPO, CISPO, REINFORCE).

One Lightning training step = one RL iteration over the Experience RolloutCallback attached to the batch
(docs/architecture.md "Data flow"). Manual optimisation: ``ppo_epochs`` × minibatches steps, each accumulated.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lit_rl.checkpoint import RNG_KEY, PendingRNG, rng_checkpoint_state
from lit_rl.core.advantages import ADVANTAGES
from lit_rl.core.aggregation import AGG_MODES
from lit_rl.core.fused_logprobs import linear_logprobs
from lit_rl.core.importance import CORRECTION_LEVELS, CORRECTION_MODES, k3_mismatch_kl, rollout_correction
from lit_rl.core.logprobs import entropy_from_logits, token_logprobs
from lit_rl.core.microbatch import token_budget_groups
from lit_rl.core.names import AdvantageName, CorrectionLevel, CorrectionMode, LossAgg, PolicyLossName
from lit_rl.core.policy_losses import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss
from lit_rl.data.experience import Experience
from lit_rl.models.dropout import disable_dropout
from lit_rl.models.loading import check_model_source, load_causal_lm, load_tokenizer, resolve_dtype
from lit_rl.modules.assembly import PolicyAssembly, store_dtype
from lit_rl.modules.critic import CriticModule
from lit_rl.modules.forward import PolicyForward, enable_gradient_checkpointing
from lit_rl.modules.heads import LazyLogits
from lit_rl.modules.protocols import loss_term_providers
from lit_rl.modules.validation import HeldoutValidation
from lit_rl.strategies import deepspeed_engine as _deepspeed_engine
from lit_rl.strategies import uncount_optimizer_step as _uncount_optimizer_step


def _reduce_fx(key: str) -> str:
    """How a metric combines over micro-batches, minibatches and ranks: extremes stay extremes (a spike in any
    micro-batch must stay visible, e.g. ``is/max_weight``); everything else is averaged."""
    name = key.rsplit("/", 1)[-1]
    return "max" if "max" in name else "min" if "min" in name else "mean"


def _reduce(key: str, values: list[float]) -> float:
    fx = _reduce_fx(key)
    return max(values) if fx == "max" else min(values) if fx == "min" else sum(values) / len(values)


OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


def _default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)


class PolicyModule(HeldoutValidation, PolicyAssembly, PolicyForward, L.LightningModule):
    """Policy-gradient RL on a causal LM.

    Args:
        model: local directory or hub id of a causal LM.
        tiny_if_missing: if set and ``model`` is a missing local directory, build a tiny random model there
            with ``lit_rl.models.tiny.build_tiny_model(model, **tiny_if_missing)`` (quickstart, tests).
        dtype: parameter dtype (``float32``, ``bfloat16``, ``float16``).
        lora: peft ``LoraConfig`` keyword arguments (e.g. ``{r: 8, lora_alpha: 16}``); None = full fine-tune.
        adapter: a PEFT adapter directory to continue training (its own LoRA settings; ``model`` is its base).
        advantage: advantage estimator (``core.advantages``): grpo, dr_grpo, rloo, reinforce, gae, opd.
        std_normalize, gamma, lam, baseline: estimator options (baseline: reinforce's batch-mean baseline;
            opd's leave-one-out per-position group baseline).
        policy_loss: ``core.policy_losses`` name: ppo_clip, gspo, cispo, reinforce.
        loss_agg: token_mean (DAPO), seq_mean_token_mean (GRPO), seq_mean_token_sum, seq_mean_token_sum_norm
            (Dr. GRPO).
        loss_horizon: the constant H that ``seq_mean_token_sum_norm`` divides every row's token sum by. None =
            the Experience's ``horizon`` (RolloutCallback sets it to ``sampling.max_new_tokens``); with neither,
            that mode raises instead of dividing by the padded width (which changes between minibatches).
        whiten_advantages: standardise the advantages over the batch's trainable tokens (all ranks' tokens;
            mean 0, variance 1). None = on for ``gae`` (PPO, as TRL / veRL / OpenRLHF do), off otherwise.
        disable_dropout: zero every dropout probability of the policy (and a separate critic backbone), so the
            rollout, old-log-prob, reference, value and training passes evaluate the same function (TRL does
            the same); False keeps the checkpoint's dropout.
        clip_low, clip_high, dual_clip: ratio clipping (asymmetric bounds = DAPO clip-higher).
        ppo_epochs: passes over each Experience.
        minibatch_size: rows per optimizer step (None = the whole Experience).
        micro_batch_size: rows per forward/backward (gradient accumulation); None = the minibatch. With
            ``micro_batch_tokens`` it caps the rows of a token-budget micro-batch; it also sizes the no-grad
            passes over the Experience (old log-probs, reference, values).
        micro_batch_tokens: token budget per training forward/backward instead of a row count: each minibatch's
            rows are sorted by length and cut so that rows × (trimmed width) ≤ the budget, each micro-batch
            trimmed to its own longest prompt and completion (``core.microbatch``). A row longer than the
            budget forms a micro-batch alone. The loss is still the minibatch loss (global denominators), and
            every rank runs the same number of micro-batches (the count is agreed with an all-reduce; a rank
            with fewer runs zero-weight ones). None = fixed ``micro_batch_size`` rows.
        max_grad_norm: gradient clipping; a non-finite norm skips the step.
        max_nonfinite_steps: this many skipped steps in a row raise.
        rollout_correction / correction_level / correction_cap: engine-vs-trainer mismatch correction
            (``none|tis|mis`` at ``token|sequence|geometric`` level, ``core.importance``).
        correction_low: lower bound of the ``mis`` band [low, cap] (IcePop, arXiv 2510.18855); None = 1/cap.
        logprob_chunk_size: rows per chunk of the log-softmax (bounds memory for large vocabularies).
        share_prompt_forward: run each distinct prompt of a micro-batch once and let its group's completions
            reuse the prompt's key/value cache (``models/shared_prompt.py``): the same log-probs and gradients
            up to float summation order, about 3/8 fewer forward/backward FLOPs at G=4 with prompts as long
            as completions. Applies to the policy, reference and old-log-prob forwards (not a critic's
            hidden-state / cache reads, which keep the plain forward). None (default) = on, except for a float64
            model: transformers' RMSNorm computes in float32 inside, so summing a group's gradients before it
            (shared) or after it (plain) differs by float32 rounding (~1e-7), and float64 runs are the exact
            (1e-12) invariance checks. True / False force it.
        gradient_checkpointing: recompute decoder layers in backward (non-reentrant; no shared-prompt pass).
        optimizer / lr_scheduler: LightningCLI ``OptimizerCallable`` / ``LRSchedulerCallable``.
        critic: a ``CriticModule`` (PPO): values attached to each Experience, value loss added to the policy loss;
            pair it with ``advantage: gae``.
    """

    def __init__(
        self,
        model: str,
        tiny_if_missing: dict[str, Any] | None = None,
        dtype: str = "float32",
        lora: dict[str, Any] | None = None,
        advantage: AdvantageName | str = "grpo",
        std_normalize: bool = True,
        gamma: float = 1.0,
        lam: float = 1.0,
        baseline: bool = False,
        policy_loss: PolicyLossName | str = "ppo_clip",
        loss_agg: LossAgg = "token_mean",
        loss_horizon: int | None = None,
        whiten_advantages: bool | None = None,
        disable_dropout: bool = True,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        ppo_epochs: int = 1,
        minibatch_size: int | None = None,
        micro_batch_size: int | None = None,
        micro_batch_tokens: int | None = None,
        max_grad_norm: float = 1.0,
        max_nonfinite_steps: int = 5,
        rollout_correction: CorrectionMode = "none",
        correction_level: CorrectionLevel = "token",
        correction_cap: float = 2.0,
        correction_low: float | None = None,
        logprob_chunk_size: int | None = None,
        share_prompt_forward: bool | None = None,
        gradient_checkpointing: bool = False,
        seed: int = 0,
        optimizer: OptimizerFactory = _default_optimizer,
        lr_scheduler: SchedulerFactory | None = None,
        critic: CriticModule | None = None,
        adapter: str | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", "critic"])
        ADVANTAGES.check(advantage, "advantage")
        POLICY_LOSSES.check(policy_loss, "policy_loss")
        if loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg={loss_agg!r}; valid values: {', '.join(AGG_MODES)}")
        if rollout_correction not in CORRECTION_MODES:
            raise ValueError(f"rollout_correction={rollout_correction!r}; valid values: {', '.join(CORRECTION_MODES)}")
        if correction_level not in CORRECTION_LEVELS:
            raise ValueError(f"correction_level={correction_level!r}; valid values: {', '.join(CORRECTION_LEVELS)}")
        for name, v in (("ppo_epochs", ppo_epochs), ("max_nonfinite_steps", max_nonfinite_steps)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, v in (("minibatch_size", minibatch_size), ("micro_batch_size", micro_batch_size)):
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {v}")
        if micro_batch_tokens is not None and (isinstance(micro_batch_tokens, bool)
                                               or not isinstance(micro_batch_tokens, int) or micro_batch_tokens < 1):
            raise ValueError(f"micro_batch_tokens must be a positive integer (padded tokens per micro-batch) or "
                             f"null, got {micro_batch_tokens!r}")
        if minibatch_size and micro_batch_size and minibatch_size % micro_batch_size:
            raise ValueError(f"micro_batch_size={micro_batch_size} must divide minibatch_size={minibatch_size}")
        if not 0 <= clip_low <= 1:
            raise ValueError(f"clip_low must be in [0, 1] (1.0 = no lower bound), got {clip_low}")
        if not clip_high > 0:  # `not >` also rejects NaN
            raise ValueError(f"clip_high must be > 0, got {clip_high}")
        if dual_clip is not None and not dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 or null, got {dual_clip}")
        if not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        if not correction_cap > 0:
            raise ValueError(f"correction_cap must be > 0, got {correction_cap}")
        if correction_low is not None and not (rollout_correction == "mis" and 0 < correction_low < 1):
            raise ValueError(f"correction_low={correction_low} needs rollout_correction='mis' and 0 < correction_low "
                             f"< 1 (null = 1/correction_cap); got rollout_correction={rollout_correction!r}")
        if rollout_correction == "mis" and not correction_cap > 1:
            raise ValueError(f"correction_cap={correction_cap} with rollout_correction='mis' must be > 1 (the kept "
                             "band [correction_low, correction_cap] must contain ratio 1)")
        for name, v in (("gamma", gamma), ("lam", lam)):
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if loss_horizon is not None and (isinstance(loss_horizon, bool) or not loss_horizon >= 1):
            raise ValueError(f"loss_horizon must be a positive integer (tokens) or null, got {loss_horizon!r}")
        if logprob_chunk_size is not None and logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size must be >= 1 or null, got {logprob_chunk_size}")
        resolve_dtype(dtype)
        if tiny_if_missing is None:
            check_model_source(model)
        self.model_path = model
        self.tiny_if_missing = tiny_if_missing
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.automatic_optimization = False
        self.temperature = 1.0  # set by RolloutCallback from its sampling config (logprobs must match)
        self.critic = critic  # PPO critics attach here (CriticModule); a submodule, so its params are optimized
        self.nonfinite_in_a_row = 0
        self.skipped_steps = 0
        self.iteration = 0
        self.model = None
        self.tokenizer = None
        self._build()
        if critic is not None:
            critic.bind(self)

    # ----------------------------------------------------------------- model
    def _build(self) -> None:
        if self.tiny_if_missing is not None and not (Path(self.model_path) / "config.json").exists():
            from lit_rl.models.tiny import ensure_tiny_model

            ensure_tiny_model(self.model_path, **self.tiny_if_missing)
        torch.manual_seed(self.hparams.seed)
        self.model = load_causal_lm(self.model_path, self.hparams.dtype, self.hparams.lora,
                                    adapter=self.hparams.get("adapter")).train()
        if self.hparams.disable_dropout:
            disable_dropout(self.model)
        enable_gradient_checkpointing(self.model, self.hparams.get("gradient_checkpointing", False))
        self.tokenizer = load_tokenizer(self.model_path)

    def configure_model(self) -> None:
        """FSDP2 under Lightning's ``ModelParallelStrategy`` (which sets ``self.device_mesh``; a no-op otherwise).

        Each decoder layer is its own ``fully_shard`` unit (all-gathered just for its forward/backward, so
        peak memory stays near one layer's full weights), then the LM root (embeddings, tied head, norm)
        and a critic's own parameters: every parameter must belong to some FSDP unit, or its gradient
        would never be averaged across ranks.
        """
        mesh = getattr(self, "device_mesh", None)
        if mesh is None or getattr(self, "_sharded", False):
            return
        from torch.distributed.fsdp import fully_shard

        dp = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
        for m in self.model.modules():
            if type(m).__name__.endswith("DecoderLayer"):
                fully_shard(m, mesh=dp)
        fully_shard(self.model, mesh=dp)
        if self.critic is not None and any(True for _ in self.critic.parameters()):
            fully_shard(self.critic, mesh=dp)
        self._sharded = True

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}

    # ------------------------------------------------------------ experience
    @property
    def needs_old_logprobs(self) -> bool:
        """Several optimizer steps per Experience make later steps off-policy: the ratio's denominator
        must then be the pre-update policy, computed once before any update."""
        return self.hparams.ppo_epochs > 1 or self.hparams.minibatch_size is not None

    @torch.no_grad()
    def on_experience(self, trainer, module, exp: Experience) -> None:
        """ExperienceHook of the module itself: old log-probs (when needed) and critic values."""
        if self.needs_old_logprobs:
            t0 = time.perf_counter()
            chunks = [self.completion_logprobs(m) for m in exp.micro_batches(self.hparams.micro_batch_size)]
            exp.old_logprobs = store_dtype(torch.cat(chunks))
            self._old_logprob_s = time.perf_counter() - t0
        if self.critic is not None:
            self.critic.attach_values(self, exp)

    # -------------------------------------------------------------- training
    def training_step(self, batch, batch_idx: int):
        exp: Experience | None = getattr(batch, "experience", None)
        if exp is None:
            raise RuntimeError("PolicyModule got a batch without an Experience: add a RolloutCallback to "
                               "trainer.callbacks (it generates the rollouts each step)")
        exp = exp.to(self.device)
        h, t0 = self.hparams, time.perf_counter()
        opt = self.optimizers()
        sched = self.lr_schedulers()
        gen = torch.Generator().manual_seed(h.seed + self.iteration)
        sums: dict[str, list[float]] = {}
        for _ in range(h.ppo_epochs):
            for mb in exp.minibatches(h.minibatch_size, shuffle=h.minibatch_size is not None, generator=gen):
                stats = self._optimizer_step(opt, sched, mb)
                for k, v in stats.items():
                    sums.setdefault(k, []).append(v)
        metrics = {k: _reduce(k, v) for k, v in sums.items() if v}
        metrics["actor/skipped_steps"] = float(self.skipped_steps)
        metrics["perf/update_s"] = time.perf_counter() - t0
        metrics["perf/old_logprob_s"] = self._old_logprob_s
        metrics.update(batch.metrics)
        tokens = float(exp.attention_mask.sum())
        step_s = sum(metrics.get(k, 0.0) for k in ("perf/generate_s", "perf/reward_s", "perf/old_logprob_s",
                                                    "perf/update_s"))
        metrics["perf/tokens_per_s"] = tokens / max(step_s, 1e-9)
        self.iteration += 1
        bar = {"reward/mean", "eval/accuracy"}
        # Across ranks: means are averaged (equal rows per rank), extremes stay extremes (as _reduce does)
        distributed = self._trainer is not None and self._trainer.world_size > 1
        for k, v in metrics.items():
            if isinstance(v, float) and math.isnan(v):
                continue
            self.log(k, float(v), on_step=True, on_epoch=False, prog_bar=k in bar, batch_size=exp.batch_size,
                     sync_dist=distributed, reduce_fx=_reduce_fx(k))

    def _optimizer_step(self, opt, sched, mb: Experience, micro_loss=None) -> dict[str, float]:
        """One optimizer step on minibatch ``mb``: accumulate ``micro_loss`` (default: the RL loss) over its
        micro-batches with the minibatch's global denominators, clip, skip a non-finite step, step the
        scheduler. Every optimizer step of the module (DistillModule's teacher-data step too) goes through here.
        """
        h = self.hparams
        micro_loss = self._micro_loss if micro_loss is None else micro_loss
        mb = mb.trim()
        fwd_common = self._denominators(mb)
        opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        per_micro: dict[str, list[float]] = {}
        self._last_metrics = {}
        ds = _deepspeed_engine(self)
        for micro in self.train_micro_batches(mb):
            if ds is not None:  # what DeepSpeed's engine.forward does first (the model is called directly here):
                ds.optimizer.clear_backward_seen_flag()  # a new micro step; ZeRO-3 would overwrite, not add, grads
            if micro is None:  # this rank has fewer token-budget micro-batches: a zero-weight pass keeps the
                # ranks' collectives (DDP gradient all-reduce, FSDP all-gathers) in step
                parts = micro_loss(self._zero_weight_micro(mb), fwd_common)
                self.manual_backward(sum(parts.values()) * 0.0)
                continue
            parts = micro_loss(micro, fwd_common)
            loss = sum(parts.values())
            self.manual_backward(loss)
            for k, v in parts.items():
                stats[f"loss/{k}"] = stats.get(f"loss/{k}", 0.0) + float(v.detach())
            for k, v in self._last_metrics.items():
                per_micro.setdefault(k, []).append(v)
        stats.update({k: _reduce(k, v) for k, v in per_micro.items()})
        if ds is None:
            params = [p for p in self.parameters() if p.requires_grad and p.grad is not None]
            norm = float(torch.nn.utils.clip_grad_norm_(params, h.max_grad_norm)) if params else 0.0
        else:
            # ZeRO: gradients live in the engine's partitions (p.grad is None here), so only the engine knows
            # the global norm. Its step clips to max_grad_norm (DeepSpeedZeROStrategy sets gradient_clipping)
            # and itself skips a step whose norm is not finite; read both outcomes back.
            opt.step()
            got = ds.get_global_grad_norm()
            norm = float(got) if got is not None and ds.was_step_applied() else math.inf
            if not math.isfinite(norm):
                _uncount_optimizer_step(self.trainer)
        stats["actor/grad_norm"] = norm
        if not math.isfinite(norm):
            # Skip: parameters and optimizer state stay exactly as they were.
            opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.nonfinite_in_a_row += 1
            if self.nonfinite_in_a_row >= h.max_nonfinite_steps:
                raise RuntimeError(
                    f"{self.nonfinite_in_a_row} optimizer steps in a row had a non-finite gradient norm "
                    f"(max_nonfinite_steps={h.max_nonfinite_steps}); training diverged. Lower the learning rate, "
                    "use float32, or check rewards/advantages for extreme values.")
            return stats
        self.nonfinite_in_a_row = 0
        if ds is None:
            opt.step()
        if sched is not None:
            sched.step()
        return stats

    def train_micro_batches(self, mb: Experience) -> list[Experience | None]:
        """The micro-batches of one optimizer step: ``micro_batch_size`` rows each, or with
        ``micro_batch_tokens`` token-budget groups (``core.microbatch.token_budget_groups``), each trimmed to
        its own width, padded with ``None`` (a zero-weight pass) up to the largest count over the ranks."""
        h = self.hparams
        budget = h.get("micro_batch_tokens")
        if budget is None:
            return list(mb.micro_batches(h.micro_batch_size))
        plens, clens = mb.row_extents()
        groups = token_budget_groups(plens, clens, budget, h.micro_batch_size)
        n = int(self._all_reduce_sum(torch.tensor([float(len(groups))]), op="max")[0])
        micros: list[Experience | None] = [mb.select(g).trim(prompt=True) for g in groups]
        return micros + [None] * (n - len(micros))

    @staticmethod
    def _zero_weight_micro(mb: Experience) -> Experience:
        """One real row with nothing to train (``trainable`` False): a forward/backward whose loss is scaled
        by 0, so it adds exactly nothing to the gradient but takes part in every collective."""
        one = mb.select([0]).trim(prompt=True)
        one.trainable = torch.zeros(1, dtype=torch.bool, device=one.valid.device)
        return one

    def _denominators(self, mb: Experience) -> dict[str, Any]:
        """Token and sequence counts that ``loss_agg`` divides by, with global semantics across ranks, and the
        constant horizon of ``seq_mean_token_sum_norm``.

        Counts are of ``train_mask`` (trainable tokens of valid rows): an invalid or filtered row is in no
        denominator. DDP and FSDP average gradients over the W ranks, so rank r's loss must be
        Σ_r ℓ / (N_global / W) for the average to be Σ ℓ / N_global: the loss a single process would compute
        on the global batch (token_mean over *all* ranks' tokens, not the mean of per-rank means).
        A minibatch with no trainable token anywhere divides by 1 (its loss is 0 with zero gradients).
        """
        tm = mb.train_mask
        counts = torch.tensor([float(tm.sum()), float(tm.any(-1).sum())], dtype=torch.float64)
        trainer = self._trainer
        world = trainer.world_size if trainer is not None else 1
        counts = self._all_reduce_sum(counts) / world
        floor = 1.0 / world  # all ranks empty: Σ 0 / anything = 0; keeps the positive-count contract
        return {"num_tokens": max(float(counts[0]), floor), "num_seqs": max(float(counts[1]), floor),
                "horizon": self.horizon_for(mb)}

    def _micro_loss(self, micro: Experience, common: dict[str, int]) -> dict[str, Tensor]:
        h = self.hparams
        critic = self.critic
        # a shared value head reads this same forward: hidden states (regression) or its cache (yes/no question)
        out = self.forward_outputs(micro, hidden=critic is not None and critic.wants_hidden,
                                   cache=critic is not None and critic.wants_cache)
        head, hidden = out["head"], out["hidden"]  # Projection | None, (b, C, H) | None
        if head is not None:  # chunked through the LM head: no (b, C, V) tensor in forward or backward
            logprobs, entropy = linear_logprobs(head.hidden, head.weight, micro.completion_ids.to(head.hidden.device),
                                                head.bias, self.temperature, h.logprob_chunk_size)
        else:  # materialised path (lm_head_projection says why)
            logprobs = token_logprobs(out["logits"], micro.completion_ids, h.logprob_chunk_size, self.temperature)
            entropy = None
        mask = micro.train_mask  # the one training mask: valid, trainable rows' generated tokens
        old = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
        is_w, metrics = None, {}
        if h.rollout_correction != "none" and micro.rollout_logprobs is not None:
            w, keep, cm = rollout_correction(old, micro.rollout_logprobs, mask, h.rollout_correction,
                                             h.correction_level, h.correction_cap, h.get("correction_low"))
            is_w = w * keep
            metrics.update({f"is/{k}": v for k, v in cm.items()})
        if micro.is_weights is not None:
            is_w = micro.is_weights if is_w is None else is_w * micro.is_weights
        per_token, pm = compute_policy_loss(h.policy_loss, PolicyLossInputs(
            logprobs=logprobs, old_logprobs=old, advantages=micro.advantages, mask=mask,
            rollout_logprobs=None, is_weights=is_w, clip_low=h.clip_low, clip_high=h.clip_high,
            dual_clip=h.dual_clip))
        # ``entropy`` (b, C) is differentiable (an entropy bonus backpropagates through the same chunked pass);
        # ``logits`` stay unmaterialised unless a consumer reads them (LazyLogits).
        fwd = LazyLogits(common, logprobs=logprobs, entropy=entropy, mask=mask, hidden=hidden, head=head,
                         cache=out["cache"])
        if head is None:
            fwd["logits"] = out["logits"]
        parts = {"policy": self.aggregate(per_token, mask, fwd)}
        parts.update(self.extra_loss_terms(micro, fwd))  # subclass hook (DistillModule)
        if self.critic is not None:
            parts.update(self.critic.loss_terms(self, micro, fwd))
        for cb in loss_term_providers(self.trainer):
            parts.update(cb.loss_terms(self, micro, fwd))
        if self.critic is not None and self.iteration < self.critic.warmup_steps:  # value-only warmup
            parts = {k: v if k == "value" else v * 0.0 for k, v in parts.items()}
        with torch.no_grad():
            if mask.any():
                ent = entropy.detach() if entropy is not None else entropy_from_logits(
                    out["logits"].detach(), h.logprob_chunk_size, self.temperature)
                metrics["actor/entropy"] = float(ent[mask].mean())
                if micro.rollout_logprobs is not None:
                    metrics["rollout/logprob_mismatch_kl"] = k3_mismatch_kl(logprobs.detach(),
                                                                             micro.rollout_logprobs, mask)
        metrics.update({f"actor/{k}": v for k, v in pm.items()})
        self._last_metrics = metrics
        return parts

    def extra_loss_terms(self, micro: Experience, fwd: dict[str, Any]) -> dict[str, Tensor]:
        """Subclass hook: more loss terms from this micro-batch's forward (``fwd`` as a LossTerm sees it),
        each added to the loss and logged as ``loss/<name>``. The base module adds none."""
        return {}

    # ------------------------------------------------------------ checkpoint
    # Exact resume (lit_rl/checkpoint.py): ``iteration`` seeds the minibatch shuffles and the critic warmup,
    # the non-finite counters keep max_nonfinite_steps honest, and every rank's RNG states drive sampling.
    _RESUME_ATTRS = ("iteration", "skipped_steps", "nonfinite_in_a_row")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rl_policy"] = {k: getattr(self, k) for k in self._RESUME_ATTRS}
        checkpoint[RNG_KEY] = rng_checkpoint_state(self.trainer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for k, v in checkpoint.get("lit_rl_policy", {}).items():
            setattr(self, k, v)
        if self._trainer is not None:  # resuming fit (not load_from_checkpoint): RNG applied at the next batch
            self._pending_rng = PendingRNG()
            self._pending_rng.load(checkpoint, self._trainer.global_rank, self._trainer.world_size)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self._pending_rng is not None:
            self._pending_rng.apply()
            self._pending_rng = None
        return batch

    _pending_rng: PendingRNG | None = None
    # True = every forward materialises the (b, C, V) logits (the pre-chunking path): the reference the tests
    # compare the chunked path against. Not a user option.
    materialize_logits: bool = False
    _last_metrics: dict[str, float] = {}
    _old_logprob_s: float = 0.0
