"""Stage 5, build: a scored, filtered ``Rollouts`` batch → ``Experience`` (+ the rollout metrics).

Layout (``lit_rl.data.experience``): prompts left-padded to P, completions right-padded to C; one row per
completion, group-major. Group ids are numbered across the whole run (``next_group``, checkpointed by the
owner), so two iterations never share a group id.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from lit_rl.data.experience import Experience, pad_prompts_completions
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.engine import Completion, RolloutEngine
from lit_rl.rollout.rollouts import Rollouts


class ExperienceBuilder:
    """Pack single-turn completions into an ``Experience``.

    Args:
        engine: its ``policy_version`` (read at build time) is every row's ``policy_version``.
        decode: ``Completion -> str`` for ``Experience.texts``.
        horizon: ``Experience.horizon`` (the token budget, ``sampling.max_new_tokens``; Dr. GRPO's constant).
    """

    def __init__(self, engine: RolloutEngine, decode: Callable[[Completion], str], horizon: int):
        self.engine, self.decode, self.horizon = engine, decode, horizon
        self.next_group = 0

    def take_group_ids(self, n: int, G: int, count: bool = True) -> torch.Tensor:
        """(n·G,) long: the next n run-wide group ids, each repeated G times; ``count=False`` (evaluation):
        0 .. n-1, the run-wide counter untouched."""
        first = self.next_group if count else 0
        if count:
            self.next_group += n
        return torch.arange(first, first + n).repeat_interleave(G)

    def __call__(self, batch: Rollouts, pad_id: int, trainable: torch.Tensor | None = None,
                 count: bool = True) -> Experience:
        """Shapes: B = N·G rows, P = longest prompt, C = longest completion (>= 1); ``trainable`` (B,) or None."""
        G = len(batch.groups[0])
        rb = batch.rewards
        rows_c: list[Completion] = batch.rows()
        rows_p = [p for p in batch.prompt_ids for _ in range(G)]
        input_ids, att, loss_mask, P = pad_prompts_completions(pad_id, rows_p, [c.token_ids for c in rows_c])
        B, C = loss_mask.shape
        rlp = torch.zeros((B, C), dtype=torch.float32)
        for i, c in enumerate(rows_c):
            if c.token_ids:
                rlp[i, :len(c.token_ids)] = torch.tensor(c.logprobs, dtype=torch.float32)
        rec = [p for p in batch.prompts for _ in range(G)]
        return Experience(
            input_ids=input_ids, attention_mask=att, loss_mask=loss_mask, prompt_len=P,
            group_ids=self.take_group_ids(len(batch), G, count), rewards=rb.total.float(), valid=rb.valid,
            policy_version=torch.full((B,), self.engine.policy_version),
            reward_components={k: v.float() for k, v in rb.components.items()}, rollout_logprobs=rlp,
            finish_reasons=[c.finish_reason for c in rows_c], domains=[p.domain for p in rec], prompts=rec,
            texts=[self.decode(c) for c in rows_c], trainable=trainable, horizon=self.horizon,
            reward_errors=list(rb.errors))


def rollout_metrics(exp: Experience, rb: RewardBatch) -> dict[str, float]:
    """Reward / length / truncation statistics of one built Experience, plus the reward pool's own metrics."""
    v = exp.valid
    r = exp.rewards[v]
    lens = exp.loss_mask.sum(-1).float()
    m = {
        "reward/mean": float(r.mean()) if len(r) else float("nan"),
        "reward/std": float(r.std()) if len(r) > 1 else 0.0,
        "rollout/response_len_mean": float(lens.mean()),
        "rollout/response_len_max": float(lens.max()),
        "rollout/truncation_rate": sum(f == "length" for f in exp.finish_reasons) / max(len(exp), 1),
        # the names veRL users search for (aliases of the two above; TRL's reward/mean is already ours)
        "response_length/mean": float(lens.mean()), "response_length/max": float(lens.max()),
        "rollout/rows": float(len(exp)),
        # rows out of every loss term: failed rewards (valid False) and filtered rows (trainable False)
        "rollout/untrained_rows": float((~exp.train_rows).sum()),
        "rollout/overlong_filtered": float((~exp.trainable).sum()) if exp.trainable is not None else 0.0,
    }
    m.update(rb.metrics)
    for name, comp in exp.reward_components.items():
        ok = ~comp.isnan()
        m[f"reward/{name}"] = float(comp[ok].mean()) if ok.any() else float("nan")
    return m
