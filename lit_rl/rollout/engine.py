"""The rollout-engine protocol and `HFEngine` (generation with ``transformers.generate``).

Log-probabilities returned by every engine are of the *temperature-scaled, untruncated* distribution,
``log softmax(logits / T)[token]``, and that is also the distribution the tokens are sampled from: an engine
samples with exactly the processing its log-probs describe. The trainer computes its log-probabilities with
the same temperature (``PolicyModule.temperature`` is taken from the rollout sampling config), so
old/rollout/current log-probabilities are comparable. Greedy decoding (``temperature=0``) reports logprobs at
T = 1. Truncated sampling (top-p < 1, top-k > 0) is refused unless the engine is told to report the truncated
distribution's log-probs instead (``allow_truncated_logprobs=True``; the trainer's mismatch correction,
``PolicyModule(rollout_correction=...)``, then sees the difference).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class SamplingConfig:
    """How completions are sampled. ``temperature=0`` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 32
    # Seeded sampling: each prompt's n samples come from a generator seeded by (seed, engine call, prompt
    # tokens), so they do not depend on which other prompts share the batch or the rank (DDP equivalence,
    # reproducible rollouts). None = the global RNG (faster: one batched generate call).
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature == float("inf"):  # also rejects NaN
            raise ValueError(f"sampling.temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, including the eos token when it stopped on one
    logprobs: list[float]  # log-prob of each generated token (see module doc), same length
    finish_reason: str  # "stop" (eos) | "length" (max_new_tokens)
    # The engine's policy_version when this completion was generated; None = not recorded (in-process engines
    # generate and sync in one thread, so the engine's current version is the completion's).
    policy_version: int | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    """What RolloutCallback needs from a generator.

    ``generate`` returns, for each prompt, ``n`` completions. ``update_weights`` loads new policy weights;
    ``policy_version`` counts the syncs (every row of an Experience records the version that produced it).
    """

    policy_version: int

    def bind(self, module) -> None: ...

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None: ...


class HFEngine:
    """Generation with ``transformers`` ``model.generate`` (KV cache, temperature, eos stop).

    The checkpoint's ``generation_config.json`` is ignored: hub checkpoints ship sampling defaults
    (``repetition_penalty``, ``top_k``, ``top_p``, ``min_new_tokens``, ...) that ``generate`` would otherwise apply
    silently, so the tokens would come from another distribution than the reported log-probs. Every call runs
    with a fresh ``GenerationConfig`` holding only what ``SamplingConfig`` says (temperature, max_new_tokens,
    top-p / top-k when allowed) plus the tokenizer's eos / pad ids; no repetition penalty, no minimum length.

    Args:
        share_weights: True (default) generates with the policy module's own model object, so weights are
            always current and a sync costs nothing. False keeps a private copy updated by
            ``update_weights`` (needed when generation overlaps training, e.g. asynchronous RL).
        batch_size: maximum sequences per ``generate`` call (bounds memory); None = all at once.
        allow_truncated_logprobs: accept top-p / top-k sampling; the log-probs are then those of the truncated,
            renormalised distribution actually sampled from (``log_softmax`` of the processed scores), a
            departure from the module convention (as ``VLLMEngine``'s setting of the same name).
        share_prefill: compute each distinct prompt's prefill once and let its ``n`` samples reuse the
            key/value cache (vLLM's prefix caching does the same); False = one prefill per row.
    """

    def __init__(self, share_weights: bool = True, batch_size: int | None = None,
                 allow_truncated_logprobs: bool = False, share_prefill: bool = True):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"HFEngine.batch_size must be >= 1 or None, got {batch_size}")
        self.share_weights, self.batch_size = share_weights, batch_size
        self.allow_truncated_logprobs = allow_truncated_logprobs
        self.share_prefill = share_prefill
        self.model = None
        self.tokenizer = None
        self.policy_version = 0
        self._calls = 0  # generate() calls so far: part of the seeded-sampling key

    def bind(self, module) -> None:
        """Attach to a policy module (called by RolloutCallback.setup)."""
        self.tokenizer = module.tokenizer
        src = module.model
        trainer = getattr(module, "_trainer", None)
        if self.share_weights and trainer is not None and _is_model_parallel(trainer.strategy):
            # FSDP-sharded weights are all-gathered inside every forward: ranks would have to run the same
            # number of generation steps in lock-step. A private full copy, synced by gathering each
            # parameter once per sync, avoids that.
            self.share_weights = False
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
        return {"calls": self._calls}

    def load_state_dict(self, state: dict) -> None:
        self._calls = int(state.get("calls", 0))

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        if not self.share_weights:
            # remove_duplicate=False: tied weights (lm_head = embeddings) appear under every name a state_dict uses
            params = dict(self.model.named_parameters(remove_duplicate=False))
            params.update(dict(self.model.named_buffers(remove_duplicate=False)))
            items = list(named_tensors)
            unknown = sorted(n for n, _ in items if n not in params)
            if unknown:  # checked before any write: a partial load would mix two policies
                raise ValueError(f"HFEngine.update_weights: unknown weight names {unknown[:5]} (the engine's copy "
                                 f"has e.g. {sorted(params)[:3]}); pass merged_state_items(model)")
            with torch.no_grad():
                for name, t in items:
                    params[name].copy_(t)
        self.policy_version += 1

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate called before bind(module); RolloutCallback.setup binds it")
        if (sampling.top_p < 1 or sampling.top_k > 0) and sampling.temperature > 0 and not self.allow_truncated_logprobs:
            raise ValueError(
                f"sampling.top_p={sampling.top_p}, top_k={sampling.top_k}: HFEngine would sample from the truncated "
                "distribution while reporting logprobs of the untruncated temperature-scaled one the trainer "
                "computes. Use top_p=1 and top_k=0, or set HFEngine(allow_truncated_logprobs=True) to report the "
                "truncated distribution's logprobs (and correct with PolicyModule rollout_correction).")
        rows = [p for p in prompt_ids for _ in range(n)]  # prompt i's samples are rows i*n .. i*n+n-1
        step = self.batch_size or len(rows)
        flat: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        self._calls += 1
        try:
            if sampling.seed is not None and sampling.temperature > 0:
                for p in prompt_ids:  # one generate per prompt, under its own seed (see SamplingConfig.seed)
                    key = _stable_seed(sampling.seed, self._calls, p)
                    with torch.random.fork_rng(devices=[] if not torch.cuda.is_available() else None):
                        torch.manual_seed(key)
                        flat.extend(self._generate([p] * n, sampling))
            else:
                for s in range(0, len(rows), step):
                    flat.extend(self._generate(rows[s : s + step], sampling))
        finally:
            self.model.train(was_training)
        return [flat[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def _generate(self, rows: list[list[int]], sp: SamplingConfig) -> list[Completion]:
        from transformers import GenerationConfig

        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        P = max(len(r) for r in rows)
        ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(rows), P), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every prompt ends at column P-1
            ids[i, P - len(r) :] = torch.tensor(r, dtype=torch.long)
            att[i, P - len(r) :] = 1
        greedy = sp.temperature == 0
        truncated = not greedy and (sp.top_p < 1 or sp.top_k > 0)  # only reachable with allow_truncated_logprobs
        # Every sampling field explicit (top_k=0: transformers' global default is 50; repetition_penalty=1):
        # generate() fills unset (None) fields from model.generation_config, which is swapped for an empty one
        # below, so nothing from the checkpoint's generation_config.json reaches the sampler. Not set, because
        # transformers warns on every call otherwise: min_new_tokens (min_length=0 already means "no minimum";
        # both set -> "Both min_new_tokens and min_length seem to have been set") and, when greedy, top_k (a
        # sampling-only flag next to do_sample=False -> "generation flags are not valid: ['top_k']").
        cfg = GenerationConfig(
            do_sample=not greedy, max_new_tokens=sp.max_new_tokens, min_length=0,
            temperature=sp.temperature if not greedy else 1.0, top_p=sp.top_p if not greedy else 1.0,
            top_k=sp.top_k if not greedy else None, repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, return_dict_in_generate=True,
            output_logits=True, output_scores=truncated)
        extra = self._shared_prefill(rows, ids, att, device) if self.share_prefill else {}
        saved = model.generation_config
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        try:
            out = model.generate(input_ids=ids.to(device), attention_mask=att.to(device), generation_config=cfg,
                                 **extra)
        finally:
            model.generation_config = saved
        new = out.sequences[:, P:].cpu()  # (N, C)
        if truncated:  # processed scores: logits / T with the truncated entries at -inf, i.e. what was sampled
            lp = torch.log_softmax(torch.stack(out.scores, dim=1).float().cpu(), dim=-1)  # (N, C, V)
        else:
            logits = torch.stack(out.logits, dim=1).float().cpu()  # (N, C, V) raw (unprocessed) logits
            lp = torch.log_softmax(logits / sp.logprob_temperature, dim=-1)
        lp = lp.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (N, C)
        result = []
        for i in range(new.shape[0]):
            toks = new[i].tolist()
            if tok.eos_token_id in toks:
                end = toks.index(tok.eos_token_id) + 1
                result.append(Completion(toks[:end], lp[i, :end].tolist(), "stop"))
            else:
                result.append(Completion(toks, lp[i].tolist(), "length"))
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
        cache = self.model(input_ids=u_ids, attention_mask=u_att, position_ids=pos, use_cache=True,
                           logits_to_keep=1).past_key_values
        if not gatherable(cache):
            return {}
        cache.reorder_cache(torch.tensor(inverse, device=device))  # (U, ...) -> (N, ...)
        return {"past_key_values": cache}


def _stable_seed(seed: int, call: int, tokens: list[int]) -> int:
    """A 63-bit seed from (seed, call, prompt tokens), stable across processes (unlike ``hash``)."""
    import hashlib

    h = hashlib.blake2b(repr((seed, call, tuple(tokens))).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & (2**63 - 1)


def _is_model_parallel(strategy) -> bool:
    """Parameters sharded across ranks: FSDP2 (ModelParallelStrategy) or DeepSpeed ZeRO-3."""
    try:
        from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy
    except ImportError:  # pragma: no cover - lightning is a core dependency
        return False
    if isinstance(strategy, DeepSpeedStrategy):
        return bool(strategy.config and strategy.config.get("zero_optimization", {}).get("stage") == 3)
    return isinstance(strategy, ModelParallelStrategy)
