"""``AgentCurvePlot``: an agent run's curves over training in one PNG (issue 54.3: success, turns per episode,
valid-call rate and tokens per episode)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import lightning.pytorch as pl

from lit_rl.callbacks._learner import bound_rollout, rl_iteration
from lit_rl.data.prompts import PromptBatch
from lit_rl.runs import run_path

# panel title -> (training metric of EnvRewards, held-out metric of AgentEval)
PANELS = {
    "success": ("rollout/success_frac", "eval/accuracy"),
    "turns per episode": ("rollout/turns_mean", "eval/turns_mean"),
    "valid-call rate": ("tools/valid_call_rate", "eval/valid_call_rate"),
    "tokens per episode": ("rollout/tokens_per_episode", "eval/tokens_per_episode"),
}


class AgentCurvePlot(L.Callback):
    """Writes ``path`` (PNG, four panels) at the end of training: each panel the training value per RL iteration
    (the rollout's episodes) and the held-out value at each evaluation (``AgentEval``'s history). A metric a run
    never logged (no tools: no valid-call rate) leaves its panel empty. ``series`` is checkpointed, so a resumed
    run plots its whole history. A relative ``path`` is under the run directory."""

    def __init__(self, path: str = "agent_curves.png"):
        self.path = path
        self.series: dict[str, list[tuple[int, float]]] = {train: [] for train, _ in PANELS.values()}

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        m = batch.metrics
        for key, points in self.series.items():
            v = m.get(key)
            if v is not None and not math.isnan(float(v)):
                points.append((rl_iteration(trainer, pl_module), float(v)))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank != 0:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rc = bound_rollout(pl_module)  # its evaluator: the AgentEval (or HeldoutEval) of the run
        history = rc.evaluator.history if rc is not None else []
        fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
        for ax, (title, (train, held)) in zip(axes.flat, PANELS.items()):
            if self.series[train]:
                ax.plot(*zip(*self.series[train]), label="training episodes", alpha=0.7)
            evals = [(h["step"], h[held]) for h in history if held in h]
            if evals:
                ax.plot(*zip(*evals), "o-", label="held-out (greedy)")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        for ax in axes[-1]:
            ax.set_xlabel("RL iteration")
        out = run_path(trainer, self.path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100, bbox_inches="tight")
        plt.close(fig)

    def state_dict(self) -> dict[str, Any]:
        return {"series": {k: list(v) for k, v in self.series.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.get("series", {}).items():
            self.series[k] = [(int(s), float(x)) for s, x in v]
