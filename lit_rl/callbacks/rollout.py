"""`RolloutCallback`: turns each batch of prompts into an annotated `Experience` before the training step.

Order inside ``on_train_batch_start`` (documented contract, DESIGN §1):
  1. render + length-check prompts → 2. ``engine.generate`` (n = group_size) → 3. rewards (RewardPool)
  → 4. optional dynamic sampling (refill zero-variance groups) → 5. ``Experience``
  → 6. ExperienceHooks: the module's own (old log-probs, critic values), then every callback implementing
  ``on_experience`` in ``trainer.callbacks`` order → 7. advantages (``module.compute_advantages``).
After the optimizer steps (``on_train_batch_end``) weights are pushed to the engine every ``sync_every``
optimizer steps.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable

import lightning as L
import torch

from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.models.loading import merged_state_items
from lit_rl.modules.protocols import experience_hooks
from lit_rl.rewards.pool import RewardBatch, RewardPool
from lit_rl.rollout.engine import Completion, HFEngine, RolloutEngine, SamplingConfig

OVERLONG = ("truncate", "drop", "error")


class RolloutCallback(L.Callback):
    """Generate, score and annotate rollouts for every training batch.

    Args:
        engine: a ``RolloutEngine`` (``HFEngine`` default, ``VLLMEngine``).
        rewards: a ``RewardPool``, or reward functions (one, a list, or a dict name → fn) wrapped in one.
        group_size: completions per prompt (G).
        sampling: temperature / top-p / top-k / max_new_tokens.
        sync_every: push weights to the engine every this many optimizer steps.
        max_prompt_len: prompts longer than this many tokens are handled per ``overlong_prompts``.
        overlong_prompts: ``truncate`` (keep the last tokens) | ``drop`` (counted) | ``error``.
        dynamic_sampling: DAPO (arXiv 2503.14476): drop groups whose rewards have zero variance and refill
            from freshly drawn prompts, at most ``max_resample_tries`` extra generations per step.
    """

    def __init__(
        self,
        engine: RolloutEngine | None = None,
        rewards: RewardPool | Callable | list[Callable] | dict[str, Callable] | None = None,
        group_size: int = 8,
        sampling: SamplingConfig | None = None,
        sync_every: int = 1,
        max_prompt_len: int = 512,
        overlong_prompts: str = "truncate",
        dynamic_sampling: bool = False,
        max_resample_tries: int = 3,
        seed: int = 0,
    ):
        if rewards is None:
            raise ValueError("RolloutCallback.rewards is required: a RewardPool or reward function(s)")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        if overlong_prompts not in OVERLONG:
            raise ValueError(f"overlong_prompts={overlong_prompts!r}; valid values: {', '.join(OVERLONG)}")
        if max_resample_tries < 0:
            raise ValueError(f"max_resample_tries must be >= 0, got {max_resample_tries}")
        if dynamic_sampling and group_size < 2:
            raise ValueError("dynamic_sampling needs group_size >= 2 (a group of one has no reward variance)")
        self.engine = engine if engine is not None else HFEngine()
        self.rewards = rewards if isinstance(rewards, RewardPool) else RewardPool(rewards)
        self.group_size, self.sampling = group_size, sampling or SamplingConfig()
        self.sync_every, self.max_prompt_len, self.overlong = sync_every, max_prompt_len, overlong_prompts
        self.dynamic_sampling, self.max_resample_tries = dynamic_sampling, max_resample_tries
        self.rng = random.Random(seed)
        self.last_sync_step = 0
        self.counters = {"prompts_truncated": 0, "prompts_dropped": 0}
        self._next_group = 0

    # ------------------------------------------------------------------ setup
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        pl_module.temperature = self.sampling.logprob_temperature
        self.engine.bind(pl_module)
        dm = getattr(trainer, "datamodule", None)
        prompts_per_step = getattr(dm, "batch_size", None)
        mb = getattr(pl_module.hparams, "minibatch_size", None)
        if prompts_per_step and mb:
            rows = prompts_per_step * self.group_size * 1  # per rank: each rank draws its own prompts
            if rows % mb:
                raise ValueError(
                    f"minibatch_size={mb} does not divide the rollout batch of {rows} rows "
                    f"(data.batch_size={prompts_per_step} prompts x group_size={self.group_size})")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.rewards.close()

    # -------------------------------------------------------------- rollouts
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        metrics: dict[str, float] = {}
        prompts, ids = self._prepare(pl_module.tokenizer, batch.prompts, metrics)
        comps, rb, gen_s = self._rollout(ids, prompts)
        metrics["rollout/zero_std_frac"] = _zero_std_frac(rb, self.group_size)
        if self.dynamic_sampling:
            prompts, ids, comps, rb, extra_s, tries = self._refill(trainer, pl_module, prompts, ids, comps, rb)
            gen_s += extra_s
            metrics["rollout/resample_tries"] = float(tries)
        exp = self._experience(pl_module, prompts, ids, comps, rb)
        metrics.update(_rollout_metrics(exp, rb))
        metrics["perf/generate_s"] = gen_s
        metrics.update({f"rollout/{k}": float(v) for k, v in self.counters.items()})
        pl_module.on_experience(trainer, pl_module, exp)
        for hook in experience_hooks(trainer):
            hook.on_experience(trainer, pl_module, exp)
        metrics.update(pl_module.compute_advantages(exp))
        batch.experience, batch.metrics = exp, metrics

    def _prepare(self, tokenizer, prompts: list[Prompt], metrics) -> tuple[list[Prompt], list[list[int]]]:
        kept, ids = [], []
        for p in prompts:
            t = render_prompt(p, tokenizer)
            if len(t) > self.max_prompt_len:
                if self.overlong == "error":
                    raise ValueError(f"prompt {p.uid!r} has {len(t)} tokens > max_prompt_len={self.max_prompt_len}")
                if self.overlong == "drop":
                    self.counters["prompts_dropped"] += 1
                    continue
                self.counters["prompts_truncated"] += 1
                t = t[-self.max_prompt_len:]  # keep the end: it holds the question and the generation prompt
            kept.append(p)
            ids.append(t)
        if not kept:
            raise ValueError(f"every prompt of the batch exceeded max_prompt_len={self.max_prompt_len} and was dropped")
        return kept, ids

    def _rollout(self, ids, prompts) -> tuple[list[list[Completion]], RewardBatch, float]:
        t0 = time.perf_counter()
        comps = self.engine.generate(ids, self.group_size, self.sampling)
        gen_s = time.perf_counter() - t0
        texts = [self._decode(c) for group in comps for c in group]
        rows = [p for p in prompts for _ in range(self.group_size)]
        return comps, self.rewards.score(rows, texts), gen_s

    def _decode(self, c: Completion) -> str:
        return self._tokenizer.decode(c.token_ids, skip_special_tokens=True)

    def _refill(self, trainer, pl_module, prompts, ids, comps, rb):
        """DAPO dynamic sampling: replace zero-variance groups with groups from newly drawn prompts."""
        G, target = self.group_size, len(prompts)
        keep = _informative_groups(rb, G)
        pool = getattr(getattr(trainer, "datamodule", None), "train_prompts", None) or prompts
        P, I, C, R = [], [], [], []
        for g in keep:
            P.append(prompts[g]), I.append(ids[g]), C.append(comps[g]), R.append(_rows(rb, g, G))
        tries, extra_s = 0, 0.0
        while len(P) < target and tries < self.max_resample_tries:
            tries += 1
            new_p = [self.rng.choice(pool) for _ in range(target - len(P))]
            new_p, new_i = self._prepare(pl_module.tokenizer, new_p, {})
            new_c, new_rb, s = self._rollout(new_i, new_p)
            extra_s += s
            for g in _informative_groups(new_rb, G):
                P.append(new_p[g]), I.append(new_i[g]), C.append(new_c[g]), R.append(_rows(new_rb, g, G))
        if not P:  # nothing informative found: train on the original batch (advantages are all 0)
            return prompts, ids, comps, rb, extra_s, tries
        P, I, C, R = P[:target], I[:target], C[:target], R[:target]
        merged = RewardBatch(
            total=torch.cat([r.total for r in R]), valid=torch.cat([r.valid for r in R]),
            components={k: torch.cat([r.components[k] for r in R]) for k in rb.components},
            errors=[e for r in R for e in r.errors], metrics=rb.metrics)
        return P, I, C, merged, extra_s, tries

    def _experience(self, pl_module, prompts, ids, comps, rb: RewardBatch) -> Experience:
        tok = pl_module.tokenizer
        G = self.group_size
        rows_p = [p for p in ids for _ in range(G)]
        rows_c = [c for group in comps for c in group]
        B, P = len(rows_c), max(len(p) for p in ids)
        C = max(1, max(len(c.token_ids) for c in rows_c))
        input_ids = torch.full((B, P + C), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((B, P + C), dtype=torch.long)
        loss_mask = torch.zeros((B, C), dtype=torch.bool)
        rlp = torch.zeros((B, C), dtype=torch.float32)
        for i, (p, c) in enumerate(zip(rows_p, rows_c)):
            n = len(c.token_ids)
            input_ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
            att[i, P - len(p):P + n] = 1
            if n:
                input_ids[i, P:P + n] = torch.tensor(c.token_ids, dtype=torch.long)
                loss_mask[i, :n] = True
                rlp[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
        first = self._next_group
        self._next_group += len(ids)
        group_ids = torch.arange(first, first + len(ids)).repeat_interleave(G)
        rec = [p for p in prompts for _ in range(G)]
        return Experience(
            input_ids=input_ids, attention_mask=att, loss_mask=loss_mask, prompt_len=P, group_ids=group_ids,
            rewards=rb.total.float(), valid=rb.valid, policy_version=torch.full((B,), self.engine.policy_version),
            reward_components={k: v.float() for k, v in rb.components.items()}, rollout_logprobs=rlp,
            finish_reasons=[c.finish_reason for c in rows_c], domains=[p.domain for p in rec], prompts=rec,
            texts=[self._decode(c) for c in rows_c])

    @property
    def _tokenizer(self):
        return self.engine.tokenizer

    # ----------------------------------------------------------- weight sync
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step - self.last_sync_step >= self.sync_every:
            t0 = time.perf_counter()
            self.engine.update_weights(merged_state_items(pl_module.model))
            self.last_sync_step = trainer.global_step
            pl_module.log("perf/weight_sync_s", time.perf_counter() - t0, on_step=True, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"last_sync_step": self.last_sync_step, "counters": dict(self.counters), "rng": self.rng.getstate(),
                "next_group": self._next_group, "policy_version": self.engine.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_sync_step = state["last_sync_step"]
        self.counters = dict(state["counters"])
        self.rng.setstate(state["rng"])
        self._next_group = state["next_group"]
        self.engine.policy_version = state["policy_version"]


def _rows(rb: RewardBatch, g: int, G: int) -> RewardBatch:
    s = slice(g * G, (g + 1) * G)
    return RewardBatch(rb.total[s], rb.valid[s], {k: v[s] for k, v in rb.components.items()}, rb.errors[s])


def _informative_groups(rb: RewardBatch, G: int) -> list[int]:
    out = []
    for g in range(len(rb.total) // G):
        r = rb.total[g * G:(g + 1) * G][rb.valid[g * G:(g + 1) * G]]
        if len(r) >= 2 and float(r.max() - r.min()) > 0:
            out.append(g)
    return out


def _zero_std_frac(rb: RewardBatch, G: int) -> float:
    n = len(rb.total) // G
    return 1.0 - len(_informative_groups(rb, G)) / max(n, 1)


def _rollout_metrics(exp: Experience, rb: RewardBatch) -> dict[str, float]:
    v = exp.valid
    r = exp.rewards[v]
    lens = exp.loss_mask.sum(-1).float()
    m = {
        "reward/mean": float(r.mean()) if len(r) else float("nan"),
        "reward/std": float(r.std()) if len(r) > 1 else 0.0,
        "rollout/response_len_mean": float(lens.mean()),
        "rollout/response_len_max": float(lens.max()),
        "rollout/truncation_rate": sum(f == "length" for f in exp.finish_reasons) / max(len(exp), 1),
        "rollout/rows": float(len(exp)),
    }
    m.update(rb.metrics)
    for name, comp in exp.reward_components.items():
        ok = ~comp.isnan()
        m[f"reward/{name}"] = float(comp[ok].mean()) if ok.any() else float("nan")
    return m
