"""Held-out evaluation (``HeldoutEval``) and the reward-curve plot (``RewardCurvePlot``)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch

from lit_rl.callbacks._learner import bound_rollout, prompt_data, rl_iteration
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners.binding import RolloutBinding
from lit_rl.learners.policy import PolicyModule
from lit_rl.rewards.verifiers import ExactAnswerReward
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.runs import run_path


class HeldoutEval(L.Callback):
    """Greedy evaluation on held-out prompts, run by Lightning's validation loop.

    The policy module's ``validation_step`` (``lit_rl.learners.validation.HeldoutValidation``) hands each
    batch of ``trainer.datamodule``'s held-out prompts (``val_dataloader``) to this callback, which generates
    greedily with the RolloutCallback's engine and accumulates, with ``torchmetrics`` (summed over batches
    and ranks):

    - ``eval/accuracy``: fraction of prompts whose greedy completion is correct: the run's own reward (the
      RolloutCallback's reward pool total) ``>= correct_threshold`` (1.0), a row without a valid reward being
      incorrect; with ``scorer`` set, that scorer's value ``>= correct_threshold`` instead (the user chose it);
    - ``eval/accuracy/<domain>``: the same per prompt ``domain``, when the held-out prompts carry more than
      one (``chat_mixed``); a domain none of whose prompts were scored (``max_prompts``) is not logged;
    - ``eval/reward_mean``: mean valid reward of the RolloutCallback's reward pool;
    - ``eval/critic_explained_variance`` (a PPO critic, ``critic_eval``): the critic's values against the
      returns of ``group_size`` sampled rollouts per held-out prompt (a memorising critic scores ~0).

    When it runs is Lightning's business: ``trainer.val_check_interval`` (iterations) with
    ``check_val_every_n_epoch: null``; ``every_n_steps`` is a shorthand that sets both. Metrics are logged only
    on the steps they were measured. ``baseline`` also evaluates the untrained policy (through Lightning's
    sanity check, all held-out batches) and logs it at step 0. ``lit-rl validate --ckpt_path ...`` runs the
    same evaluation on a checkpoint. ``history`` keeps every evaluation (``step`` = RL iteration) for
    ``RewardCurvePlot`` and ``RLHealthMonitor``; while fitting each entry also has what the run had spent:
    ``wall_s`` (seconds since fitting started, evaluation time excluded, continued across a resume) and
    ``student_tokens`` (completion tokens the policy sampled on this rank), so runs compare at equal cost.
    ``history_path`` (a relative path is under the run directory) gets the history as JSON after every
    evaluation (rank 0).
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        max_prompts: int | None = None,
        max_new_tokens: int | None = None,
        scorer: Callable | None = None,
        critic_eval: bool = True,
        baseline: bool = True,
        correct_threshold: float = 1.0,
        history_path: str | None = None,
    ):
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or null, got {every_n_steps}")
        if max_prompts is not None and max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1 or null, got {max_prompts}")
        self.every_n_steps, self.max_prompts, self.max_new_tokens = every_n_steps, max_prompts, max_new_tokens
        self.critic_eval, self.baseline = critic_eval, baseline
        # None = the run's reward: accuracy must never come from a scorer the user did not choose (a run
        # rewarded by its own scorer read "0 % accuracy" from a silent exact-answer default).
        self.scorer, self.correct_threshold = scorer, float(correct_threshold)
        self.history: list[dict[str, float]] = []
        self._metrics: dict[str, Any] = {}
        self._domains: list[str] = []  # of the held-out prompts, when more than one: per-domain accuracy
        self._seen = 0
        self.history_path = history_path
        # the run's spending: tokens sampled, wall seconds of earlier processes (resume) and of this one
        self._tokens, self._wall_before, self._eval_s = 0, 0.0, 0.0
        self._t0: float | None = None  # perf_counter at fit start (None outside fit)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Explicit wiring: the RolloutCallback binds this evaluator to the learner (its RolloutBinding), and
        # the datamodule yields held-out batches while fitting only because an evaluator asked for them.
        if stage != "fit":
            return
        dm = prompt_data(trainer)
        if dm is not None:
            dm.heldout_in_fit = True
        if self.every_n_steps is not None:
            trainer.val_check_interval = self.every_n_steps
            trainer.check_val_every_n_epoch = None
        # The baseline is Lightning's sanity check over every held-out batch; a resumed run has one already
        # (and a validation batch before the first training batch would consume the restored RNG state).
        trainer.num_sanity_val_steps = math.inf if self.baseline and trainer.ckpt_path is None else 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0, self._eval_s = (
            time.perf_counter(),
            0.0,
        )  # before the baseline, which is excluded as all evals

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        if batch.experience is not None:
            self._tokens += int(batch.experience.loss_mask.sum())

    def _wall_s(self, now: float | None = None) -> float:
        if self._t0 is None:
            return self._wall_before
        return self._wall_before + (time.perf_counter() if now is None else now) - self._t0 - self._eval_s

    # ------------------------------------------------------------ the validation loop's pieces
    def start(self, pl_module: PolicyModule) -> None:
        from torchmetrics import MeanMetric, SumMetric

        self._eval_t0 = time.perf_counter()
        self._eval_wall = self._wall_s(self._eval_t0)  # what the run had spent when this evaluation started

        dev = pl_module.device
        self._metrics = {
            k: MeanMetric(nan_strategy="ignore").to(dev) for k in ("eval/accuracy", "eval/reward_mean")
        }
        # The domain list comes from the datamodule's whole held-out set, identical on every rank (a rank's
        # batches may lack a domain), so every rank syncs the same per-domain counts.
        domains = sorted({p.domain for p in _heldout_prompts(pl_module.trainer)})
        self._domains = domains if len(domains) > 1 else []
        for d in self._domains:
            self._metrics[f"eval/accuracy/{d}"] = MeanMetric().to(dev)
        # Explained variance is not a mean of per-batch values: accumulate its sufficient statistics (n, Σr, Σr²,
        # Σe, Σe² with e = r − v over the trainable tokens) across batches and ranks, then form 1 − Var[e]/Var[r].
        self._ev = [
            SumMetric().to(dev) for _ in range(5)
        ]  # SumMetric sums a vector to a scalar: one per statistic
        self._seen = 0

    @torch.no_grad()
    def score_batch(self, trainer: pl.Trainer, pl_module: PolicyModule, prompts: list) -> None:
        """Greedy completions of one batch of held-out prompts, scored into the running metrics."""
        if self.max_prompts is not None:
            prompts = prompts[: max(0, self.max_prompts - self._seen)]
        if not prompts:
            return
        self._seen += len(prompts)
        missing = [p.uid for p in prompts if p.answer is None]
        if missing and isinstance(self.scorer, ExactAnswerReward):
            raise ValueError(f"HeldoutEval: held-out prompts without an answer: {missing[:5]}")
        rc = pl_module.rollout  # the learner's rollout binding (an error naming the RolloutCallback if none)
        with training_state_kept(rc, pl_module.device):
            self._score(rc, pl_module, prompts)

    def _score(self, rc: RolloutBinding, pl_module: PolicyModule, prompts: list) -> None:
        budget = self.max_new_tokens or rc.settings.sampling.max_new_tokens
        sp = SamplingConfig(temperature=0.0, max_new_tokens=budget)
        # the run's prompt-length policy (and the engine's context), not counted as training truncations
        prompts, ids = rc.pipeline.render(
            pl_module.tokenizer, prompts, max_new_tokens=sp.max_new_tokens, count=False
        )
        comps = rc.eval_generate(ids, 1, sp)  # the latest pushed weights; safe beside an async producer
        texts = [pl_module.tokenizer.decode(g[0].token_ids, skip_special_tokens=True) for g in comps]
        dev = pl_module.device
        if rc.rewards is None:
            raise RuntimeError(
                "HeldoutEval scores with the RolloutCallback's reward pool, and this one has none (the "
                "agent path scores with its environment)"
            )
        rb = rc.rewards.score(prompts, texts, completion_ids=[list(g[0].token_ids) for g in comps])
        if self.scorer is None:
            correct = (rb.valid & (rb.total >= self.correct_threshold)).to(dev)  # NaN (invalid) is never >=
        else:
            correct = torch.tensor(
                [float(self.scorer(p, t)) >= self.correct_threshold for p, t in zip(prompts, texts)],
                device=dev,
            )
        self._metrics["eval/accuracy"].update(correct.float())
        # every domain on every batch (weight 0 off the domain): the same number of updates on every rank
        for d in self._domains:
            here = torch.tensor([p.domain == d for p in prompts], device=dev, dtype=torch.float32)
            self._metrics[f"eval/accuracy/{d}"].update(correct.float(), weight=here)
        ok = rb.total[rb.valid]
        if len(ok):
            self._metrics["eval/reward_mean"].update(ok.float().to(dev))
        if self.critic_eval and pl_module.critic is not None:
            stats = self._critic_ev_stats(rc, pl_module, prompts, ids)
            if stats is not None:
                for m, x in zip(self._ev, stats.to(dev)):
                    m.update(x)

    def finish(self, trainer: pl.Trainer, pl_module: PolicyModule) -> dict[str, float]:
        """The accumulated metrics (synced across ranks by torchmetrics); appended to ``history``."""
        out = {}
        for k, m in self._metrics.items():
            if m.update_count:
                v = float(m.compute())
                if not math.isnan(v):
                    out[k] = v
        if self._ev[0].update_count:
            out["eval/critic_explained_variance"] = _ev_from_sums(
                torch.stack([m.compute() for m in self._ev]).double()
            )
        self._metrics = {}
        if self._t0 is not None:  # fitting: evaluation time is not the run's budget
            self._eval_s += time.perf_counter() - self._eval_t0
        if out:
            spent: dict[str, float] = (
                {"wall_s": self._eval_wall, "student_tokens": float(self._tokens)}
                if self._t0 is not None
                else {}
            )
            self.history.append({"step": float(pl_module.iteration), **out, **spent})
            if self.history_path is not None and trainer.global_rank == 0:
                path = run_path(trainer, self.history_path)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(self.history, indent=1) + "\n")
        return out

    # ------------------------------------------------------------ outside the loop
    def evaluate(self, trainer: pl.Trainer, pl_module: PolicyModule) -> dict[str, float]:
        """Evaluate every held-out prompt now, outside Lightning's loop (appends to ``history``, logs nothing)."""
        prompts = _heldout_prompts(trainer)
        if not prompts:
            raise ValueError("HeldoutEval: the datamodule has no held-out prompts (heldout_prompts is empty)")
        self.start(pl_module)
        self.score_batch(trainer, pl_module, prompts)
        return self.finish(trainer, pl_module)

    @torch.no_grad()
    def _critic_ev_stats(
        self, rc: RolloutBinding, pl_module: PolicyModule, prompts: list, ids: list[list[int]]
    ) -> torch.Tensor | None:
        """(5,) float64 sums (n, Σr, Σr², Σe, Σe²) over the trainable tokens of sampled rollouts of ``prompts``."""
        rollouts = rc.pipeline.generate_and_score(
            prompts, ids
        )  # sampled as in training: returns vary in a prompt
        exp = rc.pipeline.build_experience(rollouts, pl_module.tokenizer.pad_token_id, count=False)
        critic = pl_module.critic
        assert critic is not None  # the caller checked there is one
        critic.attach_values(pl_module, exp)
        pl_module.compute_advantages(exp)  # fills exp.returns (GAE / reward-to-go)
        if exp.returns is None or exp.values is None:  # (attach_values sets values)
            return None
        m = exp.train_mask
        r, e = exp.returns.double()[m], (exp.returns.double() - exp.values.double())[m]
        return torch.stack(
            [
                torch.tensor(float(m.sum()), dtype=torch.float64),
                r.sum(),
                (r * r).sum(),
                e.sum(),
                (e * e).sum(),
            ]
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not isinstance(pl_module, PolicyModule):  # evaluation generates with a lit_rl learner's rollout
            return
        if not self.history or self.history[-1]["step"] != pl_module.iteration:
            self.evaluate(trainer, pl_module)  # final point for the curve (logging is closed by now)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        dm = prompt_data(trainer)
        if stage == "fit" and dm is not None:
            dm.heldout_in_fit = False

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "wall_s": self._wall_s(), "student_tokens": self._tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])
        # checkpoints from before the spending was kept start it at 0
        self._wall_before, self._tokens = float(state.get("wall_s", 0.0)), int(state.get("student_tokens", 0))


@contextmanager
def training_state_kept(rc: RolloutBinding, device: torch.device) -> Iterator[None]:
    """Evaluation changes no training state: what it draws or counts is put back when it ends.

    Held for the whole evaluation batch: the engine lock (an async producer cannot generate in between, so
    what is restored is exactly what evaluation changed), the torch RNG (the critic path samples; forked for
    the CPU and the module's accelerator) and the engine's checkpointed state (its generate-call count keys
    seeded sampling). Evaluation's Experiences number their groups without the run-wide counter
    (``build_experience(count=False)``) and its prompts are rendered uncounted."""
    devices = [device] if device.type == "cuda" else []
    with rc.lock, torch.random.fork_rng(devices=devices):
        state = rc.engine.state_dict()
        try:
            yield
        finally:
            rc.engine.load_state_dict(state)


class RewardCurvePlot(L.Callback):
    """Writes ``path`` (PNG): training reward per iteration and held-out accuracy vs iteration.

    A relative ``path`` is under the run directory (``trainer.default_root_dir``)."""

    def __init__(self, path: str = "reward_curve.png"):
        self.path = path
        self.reward: list[tuple[int, float]] = []

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        m = batch.metrics
        if "reward/mean" in m and not math.isnan(m["reward/mean"]):
            self.reward.append((rl_iteration(trainer, pl_module), m["reward/mean"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank != 0:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        if self.reward:
            ax.plot(*zip(*self.reward), label="train reward (mean)", alpha=0.7)
        bound = bound_rollout(pl_module)  # its evaluator: the HeldoutEval callback, or the default one
        ev = bound.evaluator if bound is not None else None
        if ev is not None and ev.history:
            ax.plot(
                [h["step"] for h in ev.history],
                [h["eval/accuracy"] for h in ev.history],
                "o-",
                label="held-out greedy accuracy",
            )
        ax.set_xlabel("RL iteration")
        ax.set_ylim(-0.02, max(1.02, max((r for _, r in self.reward), default=1) + 0.02))
        ax.grid(alpha=0.3)
        ax.legend()
        out = run_path(trainer, self.path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100, bbox_inches="tight")
        plt.close(fig)


def _heldout_prompts(trainer: pl.Trainer) -> list:
    """The held-out prompts of lit_rl's datamodule (another datamodule has none)."""
    dm = prompt_data(trainer)
    return list(dm.heldout_prompts) if dm is not None else []


def _ev_from_sums(s: torch.Tensor) -> float:
    """1 − Var[e] / Var[r] from (n, Σr, Σr², Σe, Σe²), population variances; 0.0 when Var[r] = 0 (as
    ``core.value.explained_variance``, which this equals on one batch)."""
    n = float(s[0])
    if n < 2:
        return 0.0
    var_r = float(s[2]) / n - (float(s[1]) / n) ** 2
    var_e = float(s[4]) / n - (float(s[3]) / n) ** 2
    return 0.0 if var_r <= 1e-12 * max(1.0, float(s[2]) / n) else 1.0 - var_e / var_r
