"""Held-out evaluation, reward-curve plot and Hugging Face export at the end of training."""
from __future__ import annotations

import math
from typing import Any, Callable

import lightning as L
import torch

from lit_rl.core.value import explained_variance
from lit_rl.data.prompts import render_prompt
from lit_rl.rewards.verifiers import ExactAnswerReward
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.runs import run_path


def _rollout_cb(trainer):
    from lit_rl.callbacks.rollout import RolloutCallback

    for cb in trainer.callbacks:
        if isinstance(cb, RolloutCallback):
            return cb
    raise RuntimeError("HeldoutEval needs a RolloutCallback in trainer.callbacks (it reuses its engine)")


class HeldoutEval(L.Callback):
    """Greedy evaluation on held-out prompts every ``every_n_steps`` iterations (and before the first one).

    Accuracy is the fraction of prompts whose greedy completion scores ``>= 1`` with ``scorer`` (exact
    answer match by default); ``eval/reward_mean`` uses the RolloutCallback's reward pool. Prompts come
    from ``trainer.datamodule.heldout_prompts`` (first ``max_prompts``).

    With a critic on the policy (PPO) and ``critic_eval=True``, it also samples ``group_size`` rollouts per
    held-out prompt with the training sampling config and logs ``eval/critic_explained_variance``: the
    critic's values against the returns on prompts it never trained on (a memorising critic scores ~0).
    """

    def __init__(self, every_n_steps: int = 10, max_prompts: int | None = None, max_new_tokens: int | None = None,
                 scorer: Callable | None = None, critic_eval: bool = True):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps, self.max_prompts, self.max_new_tokens = every_n_steps, max_prompts, max_new_tokens
        self.critic_eval = critic_eval
        self.scorer = scorer or ExactAnswerReward()
        self.history: list[dict[str, float]] = []

    def evaluate(self, trainer, pl_module) -> dict[str, float]:
        rc = _rollout_cb(trainer)
        prompts = list(getattr(trainer.datamodule, "heldout_prompts", []) or [])[: self.max_prompts]
        if not prompts:
            raise ValueError("HeldoutEval: the datamodule has no held-out prompts (heldout_prompts is empty)")
        ids = [render_prompt(p, pl_module.tokenizer) for p in prompts]
        sp = SamplingConfig(temperature=0.0, max_new_tokens=self.max_new_tokens or rc.sampling.max_new_tokens)
        comps = rc.eval_generate(ids, 1, sp)  # the latest pushed weights; safe beside an async producer
        texts = [pl_module.tokenizer.decode(g[0].token_ids, skip_special_tokens=True) for g in comps]
        correct = [float(self.scorer(p, t)) >= 1.0 for p, t in zip(prompts, texts)]
        rb = rc.rewards.score(prompts, texts)
        ok = rb.total[rb.valid]
        out = {"eval/accuracy": sum(correct) / len(correct),
               "eval/reward_mean": float(ok.mean()) if len(ok) else math.nan}
        if self.critic_eval and getattr(pl_module, "critic", None) is not None:
            out["eval/critic_explained_variance"] = self._critic_ev(rc, pl_module, prompts, ids)
        self.history.append({"step": float(getattr(pl_module, "iteration", trainer.global_step)), **out})
        return out

    @torch.no_grad()
    def _critic_ev(self, rc, pl_module, prompts, ids) -> float:
        comps, rb, _ = rc._rollout(ids, prompts)  # sampled, as in training: returns vary within a prompt
        exp = rc._experience(pl_module, prompts, ids, comps, rb)
        pl_module.critic.attach_values(pl_module, exp)
        pl_module.compute_advantages(exp)  # fills exp.returns (GAE / reward-to-go)
        if exp.returns is None:
            return math.nan
        return explained_variance(exp.values, exp.returns, exp.loss_mask & exp.valid[:, None])

    def _log(self, pl_module, metrics):
        for k, v in metrics.items():
            if not math.isnan(v):
                pl_module.log(k, v, on_step=True, on_epoch=False, prog_bar=k == "eval/accuracy", batch_size=1)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if getattr(pl_module, "iteration", 0) == 0 and not self.history:  # the step-0 baseline
            self._log(pl_module, self.evaluate(trainer, pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.iteration % self.every_n_steps == 0:
            self._log(pl_module, self.evaluate(trainer, pl_module))

    def on_train_end(self, trainer, pl_module) -> None:
        if not self.history or self.history[-1]["step"] != pl_module.iteration:
            self.evaluate(trainer, pl_module)  # final point for the curve (logging is closed by now)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])


class RewardCurvePlot(L.Callback):
    """Writes ``path`` (PNG): training reward per iteration and held-out accuracy vs iteration.

    A relative ``path`` is under the run directory (``trainer.default_root_dir``)."""

    def __init__(self, path: str = "reward_curve.png"):
        self.path = path
        self.reward: list[tuple[int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        m = getattr(batch, "metrics", {})
        if "reward/mean" in m and not math.isnan(m["reward/mean"]):
            self.reward.append((pl_module.iteration, m["reward/mean"]))

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        if self.reward:
            ax.plot(*zip(*self.reward), label="train reward (mean)", alpha=0.7)
        ev = next((cb for cb in trainer.callbacks if isinstance(cb, HeldoutEval)), None)
        if ev is not None and ev.history:
            ax.plot([h["step"] for h in ev.history], [h["eval/accuracy"] for h in ev.history], "o-",
                    label="held-out greedy accuracy")
        ax.set_xlabel("RL iteration")
        ax.set_ylim(-0.02, max(1.02, max((r for _, r in self.reward), default=1) + 0.02))
        ax.grid(alpha=0.3)
        ax.legend()
        out = run_path(trainer, self.path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100, bbox_inches="tight")
        plt.close(fig)


class SaveHFModel(L.Callback):
    """Saves the final policy (merged if LoRA) and tokenizer in Hugging Face format to ``dirpath``
    (a relative one is under the run directory, ``trainer.default_root_dir``)."""

    def __init__(self, dirpath: str = "final_model"):
        self.dirpath = dirpath

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0:
            return
        model = pl_module.model
        if hasattr(model, "merge_and_unload"):
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        out = run_path(trainer, self.dirpath)
        model.save_pretrained(out, safe_serialization=True)
        pl_module.tokenizer.save_pretrained(out)
