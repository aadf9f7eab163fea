"""`HFEngine` (generation with ``transformers.generate``) and `Completion`; the engine contract is
``rollout.base.EngineBase``.

Log-probabilities returned by every engine are those of the sampled token under the distribution it was
sampled from: ``log softmax(process_logits(logits))[token]`` (``lit_rl.rollout.sampling``: repetition penalty,
temperature, min-p, top-k, top-p, in vLLM's order). With the defaults that is ``log softmax(logits / T)``, the
trainer's own recomputation (``PolicyModule.temperature`` is taken from the rollout sampling config); greedy
decoding reports T = 1. With truncation or a repetition penalty the engine's log-probs are the behaviour
policy's, and ``PolicyModule(rollout_correction=...)`` corrects the gap to the trainer's.
"""

from __future__ import annotations

import collections
import contextlib
import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_rl.rollout.base import EngineBase, global_rank, rank_seed, stable_seed
from lit_rl.rollout.sampling import (
    SamplingConfig,
    check_generation_kwargs,
    end_of_completion,
    process_logits,
    stop_window,
)

if TYPE_CHECKING:
    from lit_rl.rollout.settings import RolloutSettings

__all__ = ["Completion", "HFEngine", "SamplingConfig"]


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, including the eos token when it stopped on one
    logprobs: list[float]  # log-prob of each generated token (see module doc), same length
    finish_reason: str  # "stop" (eos) | "length" (max_new_tokens)
    # The engine's policy_version when this completion was generated; None = not recorded (in-process engines
    # generate and sync in one thread, so the engine's current version is the completion's).
    policy_version: int | None = None


class HFEngine(EngineBase):
    """Generation with ``transformers`` ``model.generate`` (KV cache, temperature, eos stop).

    The checkpoint's ``generation_config.json`` is ignored: hub checkpoints ship sampling defaults
    (``repetition_penalty``, ``top_k``, ``top_p``, ``min_new_tokens``, ...) that ``generate`` would otherwise apply
    silently, so the tokens would come from another distribution than the reported log-probs. Every call runs
    with a fresh ``GenerationConfig`` (the tokenizer's eos / pad ids, ``max_new_tokens``, ``generation_kwargs``)
    whose own processors are all off; the sampling settings are applied by one final logits processor
    (``_ProcessedSampler``: ``process_logits`` in vLLM's order), which also keeps the step's ``(N, V)``
    log-softmax to read the next sampled token's log-prob from. No ``(N, C, V)`` tensor is ever formed.

    Args:
        share_weights: True (default) generates with the policy module's own model object, so weights are
            always current and a sync costs nothing. False keeps a private copy updated by
            ``update_weights`` (needed when generation overlaps training, e.g. asynchronous RL).
        batch_size: maximum sequences per ``generate`` call (bounds memory); None = all at once.
        share_prefill: compute each distinct prompt's prefill once and let its ``n`` samples reuse the
            key/value cache (vLLM's prefix caching does the same); False = one prefill per row.
    """

    def __init__(self, share_weights: bool = True, batch_size: int | None = None, share_prefill: bool = True):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"HFEngine.batch_size must be >= 1 or None, got {batch_size}")
        self.share_weights, self.batch_size = share_weights, batch_size
        self.share_prefill = share_prefill
        # the model generate runs (the policy's own, or a private copy) once bound: a transformers model,
        # typed Any as transformers' generate is (its overloads do not describe our use)
        self.model: Any = None
        self.tokenizer = None
        self.policy_version = 0
        self._calls = 0  # generate() calls so far: part of the seeded-sampling key

    def bind(self, module, rollout: RolloutSettings | None = None) -> None:
        """Attach to a policy module (called by RolloutCallback.setup); no limits to check the rollout's
        ``group_size`` / ``max_new_tokens`` against."""
        self.tokenizer = module.tokenizer
        src = module.model
        trainer = getattr(module, "_trainer", None)
        if self.share_weights and trainer is not None and _is_model_parallel(trainer.strategy):
            # FSDP-sharded weights are all-gathered inside every forward: ranks would have to run the same
            # number of generation steps in lock-step. A private full copy, synced by gathering each
            # parameter once per sync, avoids that.
            self.share_weights = False
        self._source = src
        if self.share_weights:
            self.model = src
        else:
            # A LoRA policy syncs merged weights under the base checkpoint's names (``merged_state_items``), so
            # the private copy is the merged plain model, not a PEFT wrapper with prefixed names.
            copied = copy.deepcopy(src)
            if hasattr(copied, "merge_and_unload"):
                copied = copied.merge_and_unload()
            self.model = copied.requires_grad_(False)

    def state_dict(self) -> dict:
        """Checkpointed by RolloutCallback: the call count keys seeded sampling, so a resumed run samples
        exactly what the uninterrupted one would."""
        return {**super().state_dict(), "calls": self._calls}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._calls = int(state.get("calls", 0))

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        if not self.share_weights:
            # remove_duplicate=False: tied weights (lm_head = embeddings) appear under every name a state_dict uses
            params = dict(self.model.named_parameters(remove_duplicate=False))
            params.update(dict(self.model.named_buffers(remove_duplicate=False)))
            items = list(named_tensors)
            unknown = sorted(n for n, _ in items if n not in params)
            if unknown:  # checked before any write: a partial load would mix two policies
                raise ValueError(
                    f"HFEngine.update_weights: unknown weight names {unknown[:5]} (the engine's copy "
                    f"has e.g. {sorted(params)[:3]}); pass merged_state_items(model)"
                )
            with torch.no_grad():
                for name, t in items:
                    params[name].copy_(t)
        self.policy_version += 1

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate called before bind(module); RolloutCallback.setup binds it")
        check_generation_kwargs(sampling, _hf_generation_keys(), "HFEngine", "transformers GenerationConfig")
        self._follow_source_dtype()
        rows = [p for p in prompt_ids for _ in range(n)]  # prompt i's samples are rows i*n .. i*n+n-1
        step = self.batch_size or len(rows)
        flat: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        self._calls += 1
        try:
            if sampling.seed is not None and sampling.temperature > 0:
                # one generate per prompt, under its own seed (see SamplingConfig.seed): (seed, call, prompt, the
                # prompt's occurrence in this batch), so a prompt listed twice is two groups. No rank is folded
                # in: the samples of a prompt do not depend on which rank holds it, which is what makes 2 ranks x 8
                # prompts train exactly like 1 x 16 (tests/test_distributed.py). A prompt on two ranks at one call
                # (a duplicate split across shards) replays its group there; folding the global occurrence in
                # would need a collective per generate, and agent loops call generate a different number of
                # times per rank.
                base = sampling.seed
                seen: collections.Counter[tuple[int, ...]] = collections.Counter()
                for p in prompt_ids:
                    key = stable_seed(base, self._calls, p, seen[tuple(p)])
                    seen[tuple(p)] += 1
                    with torch.random.fork_rng(devices=[] if not torch.cuda.is_available() else None):
                        torch.manual_seed(key)
                        flat.extend(self._generate([p] * n, sampling))
            else:
                with _rank_stream(sampling):
                    for s in range(0, len(rows), step):
                        flat.extend(self._generate(rows[s : s + step], sampling))
        finally:
            self.model.train(was_training)
        return self._count([flat[i * n : (i + 1) * n] for i in range(len(prompt_ids))])

    def _follow_source_dtype(self) -> None:
        """A private copy takes the policy's floating dtype: ``bind`` runs at the callback's setup, before
        Lightning's ``*-true`` precision converts the module (``64-true``, ``bf16-true``), so the copy would
        otherwise sample from float32 weights while the trainer's log-probs come from the converted ones."""
        src = getattr(self, "_source", None)
        if self.share_weights or src is None:
            return
        want = next(src.parameters()).dtype
        have = next(self.model.parameters()).dtype
        if want.is_floating_point and want != have:
            self.model.to(dtype=want)

    def _generate(self, rows: list[list[int]], sp: SamplingConfig) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        P = max(len(r) for r in rows)
        ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(rows), P), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every prompt ends at column P-1
            ids[i, P - len(r) :] = torch.tensor(r, dtype=torch.long)
            att[i, P - len(r) :] = 1
        greedy = sp.greedy
        # Every sampling field explicit and neutral (top_k=0: transformers' global default is 50;
        # repetition_penalty=1; temperature=1): generate() fills unset (None) fields from model.generation_config,
        # which is swapped for an empty one below, so nothing from the checkpoint's generation_config.json reaches
        # the sampler, and the settings themselves are applied by _ProcessedSampler alone. Not set, because
        # transformers warns on every call otherwise: min_new_tokens (min_length=0 already means "no minimum";
        # both set -> "Both min_new_tokens and min_length seem to have been set") and, when greedy, top_k (a
        # sampling-only flag next to do_sample=False -> "generation flags are not valid: ['top_k']").
        cfg = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=sp.max_new_tokens,
            min_length=0,
            temperature=1.0,
            top_p=1.0,
            top_k=None if greedy else 0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            num_beams=1,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            return_dict_in_generate=True,
            **(sp.generation_kwargs or {}),
        )
        sampler = _ProcessedSampler(sp, ids.to(device), att.to(device))
        stopping = StoppingCriteriaList([_StopStrings(tok, sp.stops, P)] if sp.stops else [])
        extra = self._shared_prefill(rows, ids, att, device) if self.share_prefill else {}
        saved = model.generation_config
        model.generation_config = GenerationConfig(
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
        try:
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=att.to(device),
                generation_config=cfg,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=stopping,
                **extra,
            )
        finally:
            model.generation_config = saved
        new = out.sequences[:, P:]  # (N, C)
        lp = sampler.sampled_logprobs(new).cpu()  # (N, C) float32
        new = new.cpu()
        decode = _decoder(tok)
        result = []
        for i in range(new.shape[0]):
            toks = new[i].tolist()
            end, reason = end_of_completion(toks, tok.eos_token_id, decode, sp.stops)
            result.append(Completion(toks[:end], lp[i, :end].tolist(), reason))
        return result

    def _shared_prefill(self, rows: list[list[int]], ids: Tensor, att: Tensor, device) -> dict:
        """The n samples of a prompt share its prefill: run each distinct prompt once (all but its last
        token) and gather the key/value cache out to its rows; ``generate`` then feeds only the last prompt
        token per row. Same logits as a full prefill (each row's computation is unchanged, only not repeated);
        {} when no prompt repeats or the model's cache is not a plain per-layer one.

        Shapes:
            ids, att: (N, P) left-padded rows. Returns ``{"past_key_values": cache of N rows x (P-1) tokens}``.
        """
        from lit_rl.models.shared_prompt import gatherable

        index: dict[tuple[int, ...], int] = {}
        inverse = [index.setdefault(tuple(r), len(index)) for r in rows]
        P = ids.shape[1]
        if len(index) == len(rows) or P < 2:
            return {}
        first = [inverse.index(u) for u in range(len(index))]  # a row holding each distinct prompt
        u_ids, u_att = ids[first, :-1].to(device), att[first, :-1].to(device)  # (U, P-1)
        pos = (u_att.cumsum(-1) - 1).clamp(min=0)
        cache = self.model(
            input_ids=u_ids, attention_mask=u_att, position_ids=pos, use_cache=True, logits_to_keep=1
        ).past_key_values
        if not gatherable(cache):
            return {}
        cache.reorder_cache(torch.tensor(inverse, device=device))  # (U, ...) -> (N, ...)
        return {"past_key_values": cache}


class _ProcessedSampler:
    """The final (only active) logits processor of ``HFEngine``'s ``generate``: applies the sampling settings
    (``process_logits``) and reads each sampled token's log-prob from the previous step's log-softmax, so the
    engine holds O(N x V) of vocabulary-sized memory, not the (N, C, V) of ``output_logits``/``output_scores``.

    Called once per generated token with ``input_ids`` (N, P + t) and raw ``scores`` (N, V): column P + t - 1 is
    the token sampled from the distribution kept at the previous call. The last token's log-prob is read after
    ``generate`` returns (``sampled_logprobs``).
    """

    def __init__(self, sp: SamplingConfig, ids: Tensor, att: Tensor):
        self.sp, self.P = sp, ids.shape[1]
        self._prompt = (ids, att)  # the seen-token mask needs V, known at the first call
        self.seen: Tensor | None = None  # (N, V + 1) bool; column V collects the padding (never read)
        self.prev: Tensor | None = None  # (N, V) float32 log-softmax of the last processed scores
        self.cols: list[Tensor] = []  # (N,) per generated token but the last

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        N, V = scores.shape
        if self.sp.repetition_penalty != 1 and self.seen is None:
            ids, att = self._prompt
            self.seen = torch.zeros(N, V + 1, dtype=torch.bool, device=scores.device)
            self.seen.scatter_(
                1, ids.masked_fill(att == 0, V), True
            )  # left padding is not a token of the prompt
        if self.prev is not None:
            last = input_ids[:, -1:]  # (N, 1) sampled from self.prev
            self.cols.append(self.prev.gather(1, last)[:, 0])
            if self.seen is not None:
                self.seen.scatter_(1, last, True)
        x = process_logits(scores.float(), None if self.seen is None else self.seen[:, :V], self.sp)
        self.prev = torch.log_softmax(x, -1)
        return x

    def sampled_logprobs(self, new: Tensor) -> Tensor:
        """(N, C) log-probs of the generated tokens ``new`` (N, C) under the distributions they came from."""
        if self.prev is None:
            raise RuntimeError("sampled_logprobs before any generated token (generate makes at least one)")
        cols = self.cols[: new.shape[1] - 1] + [self.prev.gather(1, new[:, -1:])[:, 0]]
        return torch.stack(cols, dim=1)


class _StopStrings:
    """``generate`` stopping criterion for ``SamplingConfig.stop``: a row is done once its newest token
    completes a stop string (only the tail window of tokens is decoded, ``stop_window``). The completion is cut
    at that token afterwards (``end_of_completion``), the rule every engine shares."""

    def __init__(self, tokenizer, stops: list[str], prompt_len: int):
        self.decode, self.stops, self.P, self.w = _decoder(tokenizer), stops, prompt_len, stop_window(stops)

    def __call__(self, input_ids: Tensor, scores, **kwargs) -> Tensor:
        tails = input_ids[:, self.P :][:, -self.w :].tolist()
        done = [any(s in self.decode(t) for s in self.stops) for t in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _decoder(tokenizer):
    """Completion text as the rewards see it (``rollout.generate.decode_with``): special tokens skipped."""
    return lambda toks: tokenizer.decode(toks, skip_special_tokens=True)


def _hf_generation_keys() -> set[str]:
    from transformers import GenerationConfig

    return set(vars(GenerationConfig()))


@contextlib.contextmanager
def _rank_stream(sp: SamplingConfig):
    """Unseeded sampling draws from torch's global generators, which ``seed_everything`` seeds identically on
    every rank: ranks would share their sampling noise. Rank r > 0 samples under a fork of them reseeded with
    ``rank_seed(draw, r)``, ``draw`` one value of the global CPU generator (so the stream still moves with it
    and is restored on resume with the per-rank RNG states); rank 0 (and one process) samples as before."""
    rank = global_rank()
    if rank == 0 or sp.greedy:
        yield
        return
    draw = int(torch.randint(0, 2**62, (1,)))
    with torch.random.fork_rng(devices=[] if not torch.cuda.is_available() else None):
        torch.manual_seed(rank_seed(draw, rank))
        yield


def _is_model_parallel(strategy) -> bool:
    """Parameters sharded across ranks: FSDP2 (ModelParallelStrategy) or DeepSpeed ZeRO-3."""
    try:
        from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy
    except ImportError:  # pragma: no cover - lightning is a core dependency
        return False
    if isinstance(strategy, DeepSpeedStrategy):
        return bool(strategy.config and strategy.config.get("zero_optimization", {}).get("stage") == 3)
    return isinstance(strategy, ModelParallelStrategy)
