"""Stage 5, build: the one place an ``Experience`` is assembled (+ the rollout metrics).

Layout (``lit_rl.data.experience``): prompts left-padded to P, completions right-padded to C; one row per
completion (or episode), group-major. Group ids are numbered across the whole run (``next_group``, checkpointed
by the owner), so two iterations never share a group id.

Every Experience of the package comes from ``ExperienceBuilder.pack``: training rollouts (``__call__`` with the
single-turn layout), episodes (``rollout/agent_loop.py``: ``AgentLoop.episode_rows`` as the layout, also
``AgentLoop.to_experience``), evaluation's critic path (``count=False``), teacher rollouts
(``callbacks/teachers.py``), a teacher's re-tokenised view of student rows
(``callbacks/teacher_inputs.cross_tokenizer_view``) and the critic's pretraining records
(``learners/critic_pretrain.py``). So padding, the rollout log-prob columns, the policy version and the horizon
are set in one place. The one other constructor, ``reprompted``, rebuilds the prompt columns of rows already
built (a teacher's privileged prompt) and keeps everything else, completion columns included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lit_rl.data.experience import Experience, pad_prompts_completions
from lit_rl.rewards.pool import RewardBatch
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import Completion
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.stats import completion_length_stats


@dataclass
class Rows:
    """The B rows of an Experience before padding.

    Fields:
        prompt_ids, completion_ids: B token lists.
        prompts: B prompt records (``Experience.prompts``; ``domains`` are read from them).
        rewards: (B,) sequence rewards (NaN where not valid).
        valid: (B,) bool; None = every row.
        logprobs: B lists aligned with ``completion_ids`` (the sampling log-probs; 0 where the policy did not
            sample, e.g. observations); None = no ``rollout_logprobs``.
        action_masks: B bool lists aligned with ``completion_ids`` (the policy's tokens: the loss mask); the
            other completion tokens (observations) become ``extras["obs_mask"]``. None = every completion token
            is the policy's (single turn).
        token_rewards: B float32 (n,) tensors aligned with ``completion_ids``; None = no ``token_rewards``.
        policy_versions: B int lists aligned with ``completion_ids``: the policy version that sampled each token
            (-1 where the policy did not sample); they become ``extras["token_versions"]`` (B, C) long (-1 past
            each row's end) and each row's ``policy_version`` is its oldest sampled token's, so the staleness
            bound checked per row holds for every token. None = one version per row (the engine's).
        fields: other Experience fields as they are (``finish_reasons``, ``texts``, ``reward_components``,
            ``reward_errors``, ``extras``).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    prompts: list[Any]
    rewards: torch.Tensor
    valid: torch.Tensor | None = None
    logprobs: list[list[float]] | None = None
    action_masks: list[list[bool]] | None = None
    token_rewards: list[torch.Tensor] | None = None
    policy_versions: list[list[int]] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def single_turn_rows(batch: Rollouts, decode: Callable[[Completion], str]) -> Rows:
    """The single-turn layout: row g*G + j = completion j of prompt g, rewards from the batch's RewardBatch."""
    G = len(batch.groups[0])
    rb = batch.scored
    comps: list[Completion] = batch.rows()
    return Rows(
        prompt_ids=[p for p in batch.prompt_ids for _ in range(G)],
        completion_ids=[c.token_ids for c in comps],
        prompts=[p for p in batch.prompts for _ in range(G)],
        rewards=rb.total,
        valid=rb.valid,
        logprobs=[c.logprobs for c in comps],
        fields={
            "reward_components": {k: v.float() for k, v in rb.components.items()},
            "finish_reasons": [c.finish_reason for c in comps],
            "texts": [decode(c) for c in comps],
            "reward_errors": list(rb.errors),
            "reward_extras": list(rb.extras),
        },
    )


class ExperienceBuilder:
    """Pack rollouts into an ``Experience``.

    Args:
        engine: its ``policy_version`` (read at build time) is every row's ``policy_version``; None = 0
            (rows not sampled by the rollout engine, e.g. teacher rollouts).
        decode: ``Completion -> str`` for ``Experience.texts`` (single-turn layout).
        horizon: ``Experience.horizon`` (Dr. GRPO's constant: the token budget ``sampling.max_new_tokens``;
            an episode's is ``max_turns x max_new_tokens``). None = not set.
        layout: ``Rollouts -> Rows``; None = ``single_turn_rows`` with ``decode``.
    """

    def __init__(
        self,
        engine: EngineBase | None = None,
        decode: Callable[[Completion], str] | None = None,
        horizon: int | None = None,
        layout: Callable[[Rollouts], Rows] | None = None,
    ):
        self.engine, self.decode, self.horizon = engine, decode, horizon
        self.layout = layout if layout is not None else self._single_turn
        self.next_group = 0

    def _single_turn(self, batch: Rollouts) -> Rows:
        if self.decode is None:
            raise ValueError("ExperienceBuilder: the single-turn layout needs decode (Completion -> str)")
        return single_turn_rows(batch, self.decode)

    def take_group_ids(self, n: int, G: int, count: bool = True) -> torch.Tensor:
        """(n·G,) long: the next n run-wide group ids, each repeated G times; ``count=False`` (evaluation):
        0 .. n-1, the run-wide counter untouched."""
        first = self.next_group if count else 0
        if count:
            self.next_group += n
        return torch.arange(first, first + n).repeat_interleave(G)

    def __call__(
        self, batch: Rollouts, pad_id: int, trainable: torch.Tensor | None = None, count: bool = True
    ) -> Experience:
        """Shapes: B = N·G rows, P = longest prompt, C = longest completion (>= 1); ``trainable`` (B,) or None."""
        G = len(batch.groups[0]) if batch.groups else 1
        return self.pack(self.layout(batch), pad_id, self.take_group_ids(len(batch), G, count), trainable)

    def pack(
        self,
        rows: Rows,
        pad_id: int,
        group_ids: torch.Tensor,
        trainable: torch.Tensor | None = None,
        policy_version: int | torch.Tensor | None = None,
    ) -> Experience:
        """The Experience of ``rows``: (B, P+C) ids and attention, (B, C) loss mask (completion tokens, or the
        action tokens), rollout log-probs and token rewards (float32, 0 past each row's end), (B,) rewards,
        validity, ``group_ids`` (B,), policy version (``policy_version``: one for every row, or the (B,)
        versions of rows re-tokenised from built ones; else the engine's, else 0), horizon."""
        input_ids, att, loss_mask, P = pad_prompts_completions(pad_id, rows.prompt_ids, rows.completion_ids)
        B, C = loss_mask.shape
        fields = dict(rows.fields)
        if rows.action_masks is not None:
            completion, loss_mask = loss_mask, torch.zeros((B, C), dtype=torch.bool)
            for i, m in enumerate(rows.action_masks):
                if m:
                    loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
            fields["extras"] = {**fields.get("extras", {}), "obs_mask": completion & ~loss_mask}
        rlp = token_rewards = None
        if rows.logprobs is not None:
            rlp = torch.zeros((B, C), dtype=torch.float32)
            for i, lp in enumerate(rows.logprobs):
                if len(lp):
                    rlp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        if rows.token_rewards is not None:
            token_rewards = torch.zeros((B, C), dtype=torch.float32)
            for i, tr in enumerate(rows.token_rewards):
                token_rewards[i, : len(tr)] = tr
        if policy_version is None:
            policy_version = self.engine.policy_version if self.engine is not None else 0
        if rows.policy_versions is not None:
            tv = torch.full((B, C), -1, dtype=torch.long)
            oldest = []
            for i, v in enumerate(rows.policy_versions):
                tv[i, : len(v)] = torch.tensor(v, dtype=torch.long)
                sampled = [x for x in v if x >= 0]
                oldest.append(min(sampled) if sampled else int(policy_version))
            fields["extras"] = {**fields.get("extras", {}), "token_versions": tv}
            policy_version = torch.tensor(oldest, dtype=torch.long)
        if not isinstance(policy_version, torch.Tensor):
            policy_version = torch.full((B,), policy_version, dtype=torch.long)
        valid = rows.valid if rows.valid is not None else torch.ones(B, dtype=torch.bool)
        return Experience(
            input_ids=input_ids,
            attention_mask=att,
            loss_mask=loss_mask,
            prompt_len=P,
            group_ids=group_ids,
            rewards=rows.rewards.float(),
            valid=valid,
            policy_version=policy_version.long(),
            rollout_logprobs=rlp,
            token_rewards=token_rewards,
            trainable=trainable,
            horizon=self.horizon,
            domains=[getattr(p, "domain", "default") for p in rows.prompts],
            prompts=list(rows.prompts),
            **fields,
        )


def reprompted(exp: Experience, prompt_ids: list[list[int]], pad_id: int) -> Experience:
    """``exp``'s rows behind new prompts: ``prompt_ids`` left-padded to a new P, the completion columns and
    every other field as they are, so entry t of each (B, C) field still belongs to the same completion token
    (a teacher's privileged prompt in front of the student's completion, ``teacher_inputs.teacher_view``)."""
    # prompt columns only: with no completion tokens the layout is (B, P+1), P prompt columns and one pad
    ids, att, _, P = pad_prompts_completions(pad_id, prompt_ids, [[] for _ in prompt_ids])
    completion_att = exp.attention_mask[:, exp.prompt_len :].long().cpu()
    input_ids = torch.cat([ids[:, :P], exp.completion_ids.cpu()], dim=1)
    dev = exp.input_ids.device
    return replace(
        exp,
        input_ids=input_ids.to(dev),
        prompt_len=P,
        attention_mask=torch.cat([att[:, :P], completion_att], dim=1).to(dev),
    )


def rollout_metrics(exp: Experience, rb: RewardBatch) -> dict[str, float]:
    """Reward / length / truncation statistics of one built Experience, plus the reward pool's own metrics."""
    v = exp.valid
    r = exp.rewards[v]
    lens = exp.loss_mask.sum(-1)  # (B,) generated tokens per row
    m = {
        "reward/mean": float(r.mean()) if len(r) else float("nan"),
        "reward/std": float(r.std()) if len(r) > 1 else 0.0,
        **completion_length_stats(lens, exp.finish_reasons),  # min/mean/max, stopped-only, veRL aliases
        "rollout/truncation_rate": sum(f == "length" for f in exp.finish_reasons) / max(len(exp), 1),
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
