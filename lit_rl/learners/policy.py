"""`PolicyModule`: the policy-gradient learner (GRPO family, PPO-clip, GSPO, CISPO, REINFORCE).

One Lightning training step = one RL iteration over the Experience RolloutCallback attached to the batch
(docs/architecture.md "Data flow"). Manual optimisation: ``ppo_epochs`` × minibatches steps, each accumulated.
The loss of one micro-batch (``_micro_loss``) is the ``MicroLoss`` mixin's (``learners/micro_loss.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit_rl.checkpoint import RNG_KEY, PendingRNG, rng_checkpoint_state
from lit_rl.core.group_size import check_group_size
from lit_rl.core.metrics import METRICS
from lit_rl.core.microbatch import token_budget_groups
from lit_rl.core.seeds import run_seed
from lit_rl.core.settings import flat_settings
from lit_rl.core.signal_rows import by_prompt, signal_rows, skips_rows
from lit_rl.core.steps import optimizer_steps_per_iteration
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners.assembly import PolicyAssembly, advantages_of
from lit_rl.learners.binding import RolloutBound
from lit_rl.learners.config import (
    POLICY_GROUPS,
    ModelSettings,
    PolicyConfig,
    PrecisionSettings,
    record_settings,
)
from lit_rl.learners.critic import CriticModule
from lit_rl.learners.forward import PolicyForward, enable_gradient_checkpointing
from lit_rl.learners.micro_loss import MicroLoss
from lit_rl.learners.old_logprobs import OldLogprobs
from lit_rl.learners.optim_step import OptimizerStep, default_adamw
from lit_rl.learners.protocols import LossTerm, loss_term_providers
from lit_rl.learners.step_metrics import StepMetricsOnly
from lit_rl.learners.validation import HeldoutValidation
from lit_rl.models.dropout import disable_dropout
from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.models.packed import unsupported_reason
from lit_rl.strategies import deepspeed_engine as _deepspeed_engine
from lit_rl.strategies import uncount_optimizer_step as _uncount_optimizer_step

# How a metric combines over micro-batches, steps and ranks is declared per metric in ``core.metrics``.
_reduce_fx = METRICS.reduce_fx
_reduce = METRICS.reduce


OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
# LRScheduler as the return type lets a recipe name a scheduler by class_path + init_args, as the optimizer (with
# Any, jsonargparse refused every class_path)
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def _default_optimizer(params) -> torch.optim.Optimizer:
    return default_adamw(params, lr=1e-5)


@flat_settings(POLICY_GROUPS)
class PolicyModule(
    StepMetricsOnly,
    HeldoutValidation,
    PolicyAssembly,
    OldLogprobs,
    PolicyForward,
    MicroLoss,
    RolloutBound,
    L.LightningModule,
):
    """Policy-gradient RL on a causal LM.

    Every setting is a keyword argument of the flat name users write in recipes
    (``model.init_args.loss_agg``), declared once in a settings group (``learners/config.py``); they are split
    into ``self.config`` (a frozen ``PolicyConfig``), validated before the model is loaded, and recorded flat
    in ``hparams``. Change one on a built module with ``update_settings(name=value)``.

    Args:
        model: local directory or hub id of a causal LM.
        optimizer: LightningCLI ``OptimizerCallable`` (default AdamW, lr 1e-5).
        lr_scheduler: LightningCLI ``LRSchedulerCallable``; None = a constant learning rate.
        critic: a ``CriticModule`` (PPO): values attached to each Experience, value loss added to the policy loss;
            pair it with ``advantage: gae``.
    """

    config_type = PolicyConfig  # a subclass with its own settings group extends it (DistillModule)

    def __init__(
        self,
        model: str,
        *,
        optimizer: OptimizerFactory = _default_optimizer,
        lr_scheduler: SchedulerFactory | None = None,
        critic: CriticModule | None = None,
        **settings: Any,
    ):
        super().__init__()
        # seed None = the run's seed_everything (lit_rl.core.seeds), resolved once: config and record agree
        settings["seed"] = run_seed(settings.get("seed"))
        # every setting split into its group and validated once, before the model is loaded
        self.config = self.config_type.of(model, type(self).__name__, **settings).validate()
        record_settings(self, self.config.flat())  # the flat record: checkpoints, load_from_checkpoint
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.automatic_optimization = False
        self.critic = (
            critic  # PPO critics attach here (CriticModule); a submodule, so its params are optimized
        )
        step = self.config.step
        self._stepper = OptimizerStep(step.max_grad_norm, step.max_nonfinite_steps)  # the non-finite counters
        self.iteration = 0
        self.model = None
        self.tokenizer = None
        self._build()
        for term in self.own_loss_terms:  # terms built against the policy (a critic's head, its own backbone)
            term.bind(self)
        self.skips_zero_advantage_rows()  # skip_zero_advantage_rows=true with a critic: refused before training

    def update_settings(self, **settings: Any) -> None:
        """Change flat settings of a built module (tests switch a forward path this way): the config is
        rebuilt, validated and recorded in ``hparams``. The model is not rebuilt: a change of what ``_build``
        applies (``ModelSettings``, ``dtype``, ``lora``, ``adapter``, dropout, checkpointing) is refused."""
        built = {"lora", "adapter", "disable_dropout", "gradient_checkpointing"}
        reload = {f.name for g in (ModelSettings, PrecisionSettings) for f in fields(g)} | built
        if bad := sorted(reload & set(settings)):
            raise ValueError(
                f"update_settings: {', '.join(bad)} take effect only when the model is built; "
                "construct a new module instead"
            )
        self.config = self.config.replace(**settings)
        self.hparams.update(settings)

    @property
    def model_path(self) -> str:
        return self.config.model

    @property
    def seed(self) -> int:
        seed = self.config.load.seed
        assert seed is not None  # __init__ resolved it (run_seed)
        return seed

    # ----------------------------------------------------------------- model
    def _build(self) -> None:
        load, fw = self.config.load, self.config.forward
        if load.tiny_if_missing is not None and not (Path(self.model_path) / "config.json").exists():
            from lit_rl.models.tiny import ensure_tiny_model

            # the tiny model's initial weights follow the run's seed unless tiny_if_missing names its own
            ensure_tiny_model(self.model_path, **{"seed": self.seed, **load.tiny_if_missing})
        torch.manual_seed(self.seed)
        self.model = load_causal_lm(
            self.model_path, self.config.precision.dtype, fw.lora, adapter=fw.adapter
        ).train()
        if fw.disable_dropout:
            disable_dropout(self.model)
        enable_gradient_checkpointing(self.model, fw.gradient_checkpointing)
        if fw.padding_free and (why := unsupported_reason(self.model)) is not None:
            raise ValueError(f"padding_free: {why} (model {self.model_path!r}); set padding_free: false")
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
        for term in self.own_loss_terms:  # a critic's own parameters (head, separate backbone)
            if isinstance(term, torch.nn.Module) and any(True for _ in term.parameters()):
                fully_shard(term, mesh=dp)
        self._sharded = True

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return opt
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"},
        }

    def check_group_size(self, group_size: int) -> None:
        """Refuse a rollout group size the advantage estimator cannot use (``core.group_size``)."""
        check_group_size(self.config.advantages.advantage, group_size)

    def optimizer_steps_per_iteration(self, rows: int) -> int | None:
        """Optimizer steps (``global_step``, what ``trainer.max_steps`` counts) one iteration of ``rows`` rollout
        rows per rank takes: ``ppo_epochs`` x minibatches; None when it varies (``lit_rl.core.steps``)."""
        step = self.config.step
        return optimizer_steps_per_iteration(rows, step.ppo_epochs, step.minibatch_size)

    # ------------------------------------------------------------ experience
    @torch.no_grad()
    def on_experience(self, trainer, module, exp: Experience) -> None:
        """ExperienceHook of the module itself: old log-probs (when needed; deferred to the training step where
        nothing reads them before it, ``learners/old_logprobs.py``), then each of its own loss terms'
        ``on_experience`` (a critic's values; a callback term's runs as the rollout's ExperienceHook)."""
        self._old_logprob_s = 0.0
        if self.needs_old_logprobs and not self.defers_old_logprobs(trainer):
            self.fill_old_logprobs(exp)
        for term in self.own_loss_terms:
            term.on_experience(trainer, self, exp)

    # ------------------------------------------------------------ loss terms
    @property
    def own_loss_terms(self) -> list[LossTerm]:
        """The module's own loss terms (``LossTerm``s, ``learners/protocols.py``), in the order their parts are
        added: the ``critic`` (PPO's value loss) when given. The module binds them and runs their
        ``on_experience``; otherwise they are terms like any callback's."""
        return [self.critic] if self.critic is not None else []

    def active_loss_terms(self) -> list[LossTerm]:
        """Every term Σ_terms L_term of the objective, in the order their parts are added: the module's own,
        then the ``LossTerm`` callbacks in callback order (none while no trainer is attached)."""
        trainer = self._trainer
        return self.own_loss_terms + (loss_term_providers(trainer) if trainer is not None else [])

    # The non-finite counters are the optimizer step's (checkpointed through _RESUME_ATTRS).
    skipped_steps = property(
        lambda self: self._stepper.skipped_steps, lambda self, v: setattr(self._stepper, "skipped_steps", v)
    )
    nonfinite_in_a_row = property(
        lambda self: self._stepper.nonfinite_in_a_row,
        lambda self, v: setattr(self._stepper, "nonfinite_in_a_row", v),
    )

    # -------------------------------------------------------------- training
    def training_step(self, batch, batch_idx: int):
        exp = batch.experience if isinstance(batch, PromptBatch) else None  # RolloutCallback attaches it
        if exp is None:
            raise RuntimeError(
                "PolicyModule got a batch without an Experience: add a RolloutCallback to "
                "trainer.callbacks (it generates the rollouts each step)"
            )
        exp = exp.to(self.device)
        h = self.config.step
        opt = self.optimizers()
        sched = self.lr_schedulers()
        gen = torch.Generator().manual_seed(self.seed + self.iteration)
        shuffle = h.minibatch_size is not None
        epochs = [exp.minibatch_orders(h.minibatch_size, shuffle, gen) for _ in range(h.ppo_epochs)]
        own_first = self.deferred_old_logprobs(exp, epochs[0][0].tolist())
        t0 = time.perf_counter()  # the update's time: the deferred pass is perf/old_logprob_s
        sums: dict[str, list[float]] = {}
        for e, orders in enumerate(epochs):
            for i, mb in enumerate(exp.minibatches(h.minibatch_size, shuffle, orders=orders)):
                if own_first and e == i == 0:  # on the rollout's weights: its own detached log-probs
                    mb.old_logprobs = mb.old_full_logprobs = None
                stats = self._optimizer_step(opt, sched, mb)
                for k, v in stats.items():
                    sums.setdefault(k, []).append(v)
        metrics = {k: METRICS.reduce(k, v) for k, v in sums.items() if v}
        metrics["actor/skipped_steps"] = float(self.skipped_steps)
        metrics["perf/update_s"] = time.perf_counter() - t0
        metrics["perf/old_logprob_s"] = self._old_logprob_s
        metrics.update(batch.metrics)
        tokens = float(exp.attention_mask.sum())
        step_s = sum(
            metrics.get(k, 0.0)
            for k in ("perf/generate_s", "perf/reward_s", "perf/old_logprob_s", "perf/update_s")
        )
        metrics["perf/tokens_per_s"] = tokens / max(step_s, 1e-9)
        self.iteration += 1
        bar = {"reward/mean", "eval/accuracy"}
        # Across ranks: each metric's declared reduction (core.metrics), as over micro-batches and steps. One
        # gather of every rank's dict, not Lightning's one all-reduce per logged name: a name NaN (skipped) on one
        # rank only would pair the ranks' all-reduces wrongly (a mismatch abort or a hang).
        if self._trainer is not None and self._trainer.world_size > 1:
            gathered: list = [None] * self._trainer.world_size
            torch.distributed.all_gather_object(gathered, {k: float(v) for k, v in metrics.items()})
            metrics = METRICS.reduce_ranks(gathered)
        for k, v in metrics.items():
            if isinstance(v, float) and math.isnan(v):
                continue
            self.log(
                k,
                float(v),
                on_step=True,
                on_epoch=False,
                prog_bar=k in bar,
                batch_size=exp.batch_size,
                reduce_fx=METRICS.reduce_fx(k),
            )

    def _optimizer_step(self, opt, sched, mb: Experience, micro_loss=None) -> dict[str, float]:
        """One optimizer step on minibatch ``mb`` (``OptimizerStep``): accumulate ``micro_loss`` (default: the RL
        loss) over its micro-batches with the minibatch's global denominators, clip, skip a non-finite step, step
        the scheduler. Every optimizer step of the module (DistillModule's teacher-data step too) goes through here.
        The RL loss forwards only the rows with advantage signal where exact (skip_zero_advantage_rows)."""
        h = self.config.step
        skip = micro_loss is None and self.skips_zero_advantage_rows()
        micro_loss = self._micro_loss if micro_loss is None else micro_loss
        mb = mb.trim()
        common = self._denominators(mb)  # of every row: a left-out row is in the denominators all the same
        signal = signal_rows(advantages_of(mb), mb.train_mask) if skip else None
        rows = by_prompt(mb.group_ids, signal)
        self._last_metrics = {}
        stepper = self._stepper
        stepper.max_grad_norm, stepper.max_nonfinite_steps = h.max_grad_norm, h.max_nonfinite_steps
        stats = stepper.run(
            opt,
            sched,
            self.train_micro_batches(mb, rows),
            lambda micro: micro_loss(micro, common),
            lambda: micro_loss(self._zero_weight_micro(mb), common),
            self.manual_backward,
            self.parameters,
            ds=_deepspeed_engine(self),
            uncount=lambda: _uncount_optimizer_step(self.trainer),
        )
        if signal is not None:  # a rank with no signal row forwarded nothing: its policy loss is exactly 0
            stats.setdefault("loss/policy", 0.0)
            stats["actor/signal_rows"] = float(len(signal))
            stats["actor/signal_frac"] = len(signal) / max(mb.batch_size, 1)
        return stats

    def skips_zero_advantage_rows(self) -> bool:
        """``skip_zero_advantage_rows`` resolved (``core.signal_rows``): on where exact, i.e. an
        advantage-linear policy loss and no active loss term; ``true`` where not exact raises naming why."""
        terms = [type(t).__name__ for t in self.active_loss_terms()]
        return skips_rows(self.config.step.skip_zero_advantage_rows, self.config.objective.policy_loss, terms)

    def train_micro_batches(self, mb: Experience, rows: list[int] | None = None) -> list[Experience | None]:
        """The micro-batches of one optimizer step: ``micro_batch_size`` rows each, or with
        ``micro_batch_tokens`` token-budget groups (``core.microbatch.token_budget_groups``), each trimmed to
        its own width, padded with ``None`` (a zero-weight pass) up to the largest count over the ranks. With
        ``rows`` (the signal rows) only those are forwarded; no row on any rank = one zero-weight pass, so
        every parameter gets its exact zero gradient and AdamW steps as it would have (momentum moves)."""
        h = self.config.step
        budget = h.micro_batch_tokens
        if rows is None and budget is None:
            return list(mb.micro_batches(h.micro_batch_size))
        kept: Experience | None = mb
        if rows is not None and rows != list(range(mb.batch_size)):  # all rows in order: the plain plan
            kept = mb.select(rows).trim(prompt=True) if rows else None
        if kept is None:
            micros: list[Experience | None] = []
        elif budget is None:
            micros = list(kept.micro_batches(h.micro_batch_size))
        else:
            plens, clens = kept.row_extents()
            groups = token_budget_groups(plens, clens, budget, h.micro_batch_size)
            micros = [kept.select(g).trim(prompt=True) for g in groups]
        n = int(self._all_reduce_sum(torch.tensor([float(len(micros))]), op="max")[0])
        return micros + [None] * (max(n, 1) - len(micros))

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
        return {
            "num_tokens": max(float(counts[0]), floor),
            "num_seqs": max(float(counts[1]), floor),
            "horizon": self.horizon_for(mb),
        }

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
        if (
            self._trainer is not None
        ):  # resuming fit (not load_from_checkpoint): RNG applied at the next batch
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
    _last_metrics: dict[str, float]  # the last micro-batch's loss metrics (set by _micro_loss)
