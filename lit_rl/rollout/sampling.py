"""`SamplingConfig` and the sampling processing every engine applies, in one order.

**What the log-probs describe.** Every engine samples a token from a *processed* distribution and reports
that token's log-probability under the same processed distribution (the behaviour policy μ). The processing,
in vLLM's order (``vllm/v1/sample/sampler.py``, which the two vLLM engines run; ``HFEngine`` runs
``process_logits`` below, so all three agree):

1. repetition penalty on the raw logits: a token already in the prompt or the completion so far has its logit
   divided by ``repetition_penalty`` when positive, multiplied when negative (Keskar et al. 2019, arXiv
   1909.05858);
2. temperature: ``/ T`` (greedy: T = 1, steps 3-5 skipped);
3. min-p: tokens with probability < ``min_p`` × the top token's probability are removed;
4. top-k: tokens below the k-th largest logit are removed (ties kept);
5. top-p: sorted ascending, tokens whose cumulative probability is <= 1 − ``top_p`` are removed (the top token
   always stays); the sort is stable, so a group of equal scores cut by the boundary keeps its highest token ids,
   as vLLM's torch sampler does with a stable sort (``core.processed``, "Ties at the boundary").

``log_softmax`` of the result is what the engines report. Without steps 1 and 3-5 (the defaults) that is
``log softmax(logits / T)``. With them, the trainer applies the same processing to its own logits for the ratios
it forms against these log-probs (``core.processed``, docs/architecture.md "Truncated sampling"), so at the
on-policy point the PPO ratio and the mismatch correction are 1 whatever the settings.

**Stop strings** (``stop``): a completion ends with the first token whose text completes one of them
(``finish_reason`` "stop"); its tokens are kept up to and including that token, nothing after it is trained.
Every engine finds that token with ``stop_index`` (vLLM stops on its own too; the cut is applied again so all
engines agree on the token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lit_rl.core.processed import LogitProcessing
from lit_rl.core.settings import field_docs, setting

# generation_kwargs keys that are settings of ours: the error names the field to use instead.
MAPPED_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_new_tokens",
    "max_new_tokens": "max_new_tokens",
    "max_completion_length": "max_new_tokens",
    "stop": "stop",
    "stop_strings": "stop",
    "seed": "seed",
    "chat_template_kwargs": "chat_template_kwargs",
}
# Keys that change the sampled distribution (or the sequence) without every engine reporting it in its log-probs.
UNREPORTED_KEYS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "bad_words",
        "bad_words_ids",
        "allowed_token_ids",
        "min_tokens",
        "min_new_tokens",
        "min_length",
        "no_repeat_ngram_size",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "guided_decoding",
        "structured_outputs",
        "logits_processors",
        "logits_processor",
        "sequence_bias",
        "suppress_tokens",
        "begin_suppress_tokens",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "guidance_scale",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "encoder_repetition_penalty",
        "renormalize_logits",
        "top_n_sigma",
        "top_h",
        "do_sample",
        "ignore_eos",
        "penalty_alpha",
        "exponential_decay_length_penalty",
        "length_penalty",
        "constraints",
        "force_words_ids",
        "assistant_model",
        "prompt_lookup_num_tokens",
        "watermarking_config",
        "thinking_token_budget",
        "extra_args",
    }
)
# Keys the engines set themselves (what they must get to report the sampled tokens' log-probs).
ENGINE_KEYS = frozenset(
    {
        "n",
        "num_return_sequences",
        "best_of",
        "logprobs",
        "prompt_logprobs",
        "logprobs_mode",
        "flat_logprobs",
        "output_logits",
        "output_scores",
        "return_dict_in_generate",
        "detokenize",
        "return_token_ids",
        "output_kind",
        "eos_token_id",
        "pad_token_id",
        "max_length",
        "model",
        "prompt",
        "stream",
    }
)


@dataclass
class SamplingConfig:
    """How completions are sampled (module docstring: the processing and what the log-probs describe)."""

    temperature: float = setting(1.0, "0 = greedy (log-probs then at T = 1, after the repetition penalty).")
    top_p: float = setting(1.0, "Nucleus sampling, in (0, 1]; 1 = off.")
    top_k: int = setting(0, "Keep the k most likely tokens; 0 = off.")
    max_new_tokens: int = setting(32, "Completion budget (tokens).")
    seed: int | None = setting(
        None,
        "Seeded sampling. HFEngine: each prompt's n samples come from a generator seeded by (seed, engine "
        "call, prompt tokens, the prompt's occurrence in the batch), so a prompt listed twice gets two "
        "groups, and neither the other prompts in the batch nor the rank change them (2 ranks x 8 prompts "
        "sample like 1 x 16; a prompt on two ranks at one call gets the same group); None = the "
        "global RNG (one batched generate call; ranks > 0 under a per-rank fork of it). The vLLM "
        "engines: the base of their per-request seed cursor (per rank, rollout.base.RequestSeeds), "
        "None = the engine's own seed.",
    )
    min_p: float = setting(0.0, "In [0, 1]; 0 = off.")
    repetition_penalty: float = setting(1.0, "> 0; 1 = off.")
    stop: list[str] | None = setting(
        None, "Stop strings (module docstring); None / [] = only eos and the budget end a completion."
    )
    chat_template_kwargs: dict[str, Any] | None = setting(
        None,
        "Passed to tokenizer.apply_chat_template when chat prompts are rendered (e.g. "
        '{"enable_thinking": false}).',
    )
    generation_kwargs: dict[str, Any] | None = setting(
        None,
        "Further engine settings passed through (vLLM SamplingParams fields, server request fields, "
        "transformers GenerationConfig fields). Refused: keys that are fields here, keys that change "
        "the sampled distribution without the engines reporting it (UNREPORTED_KEYS), keys the engines "
        "set themselves (ENGINE_KEYS); each engine also refuses a key it does not know.",
    )

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature == float("inf"):  # also rejects NaN
            raise ValueError(f"sampling.temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling.min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(
                f"sampling.repetition_penalty must be a finite number > 0 (1 = off), got "
                f"{self.repetition_penalty}"
            )
        if isinstance(self.stop, str):
            self.stop = [self.stop]  # TRL / vLLM accept one string
        if self.stop is not None and not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"sampling.stop must be a list of non-empty strings, got {self.stop!r}")
        for name in ("chat_template_kwargs", "generation_kwargs"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, dict) and all(isinstance(k, str) for k in v)):
                raise ValueError(f"sampling.{name} must be a mapping of names to values, got {v!r}")
        for key in self.generation_kwargs or {}:
            if key in MAPPED_KEYS:
                raise ValueError(
                    f"sampling.generation_kwargs.{key}: use sampling.{MAPPED_KEYS[key]} instead (every "
                    "engine applies it and reports the log-probs of the distribution it samples from)"
                )
            if key in UNREPORTED_KEYS:
                raise ValueError(
                    f"sampling.generation_kwargs.{key} changes the sampled distribution without every "
                    "engine reporting it in its log-probs, so the trainer would learn from a policy it "
                    "did not sample; supported settings: temperature, top_p, top_k, min_p, "
                    "repetition_penalty, stop"
                )
            if key in ENGINE_KEYS:
                raise ValueError(
                    f"sampling.generation_kwargs.{key} is set by the engine itself (it needs it to "
                    "return the sampled tokens' log-probs); remove it"
                )

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processing(self) -> LogitProcessing:
        """The distribution-changing settings, as the trainer reads them (``core.processed``)."""
        return LogitProcessing(self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty)

    @property
    def processed(self) -> bool:
        """True when the engines' log-probs are not plain ``log softmax(logits / T)`` (module docstring)."""
        return self.processing.active

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])


SamplingConfig.__doc__ = (SamplingConfig.__doc__ or "") + field_docs(SamplingConfig)


def process_logits(logits: Tensor, seen: Tensor | None, sp: SamplingConfig) -> Tensor:
    """The processed scores an engine samples from (module docstring, steps 1-5); removed tokens are -inf.

    ``log_softmax`` of the result is what the engines report; greedy takes its argmax. The one implementation is
    ``core.processed.LogitProcessing.apply``, which the trainer runs too.

    Shapes:
        logits: (N, V) raw next-token logits (float32 or float64; not modified).
        seen: (N, V) bool, tokens of each row's prompt and completion so far (needed only when
            ``repetition_penalty != 1``). Returns (N, V), the dtype of ``logits``.
    """
    return sp.processing.apply(logits, seen)


def stop_window(stops: list[str]) -> int:
    """Tokens that can hold a stop string completed by the last one: at most 4 bytes per character, at least
    one byte per token, plus the overhang on each side."""
    return 4 * max(len(s) for s in stops) + 2


def stop_index(
    tokens: list[int], decode: Callable[[list[int]], str], stops: list[str], start: int = 0
) -> int | None:
    """Index of the first token (from ``start``) whose text completes a stop string, or None.

    Each position decodes only the tail window ending at it (``stop_window``), so the scan is linear in the
    completion length; a stop string earlier than ``start`` was found before."""
    if not stops:
        return None
    if start == 0 and not any(s in decode(tokens) for s in stops):
        return None  # the common case: one decode
    w = stop_window(stops)
    for i in range(start, len(tokens)):
        text = decode(tokens[max(0, i - w + 1) : i + 1])
        if any(s in text for s in stops):
            return i
    return None


def end_of_completion(
    tokens: list[int], eos_id: int | None, decode: Callable[[list[int]], str] | None, stops: list[str]
) -> tuple[int, str]:
    """(number of tokens kept, finish reason) for a generated token list: cut after the first eos token or the
    token completing a stop string ("stop"), else all of them ("length")."""
    end = len(tokens)
    reason = "length"
    if eos_id is not None and eos_id in tokens:
        end, reason = tokens.index(eos_id) + 1, "stop"
    if stops and decode is not None:
        i = stop_index(tokens[:end], decode, stops)
        if i is not None:
            end, reason = i + 1, "stop"
    return end, reason


def check_generation_kwargs(sp: SamplingConfig, known: set[str] | None, engine: str, target: str) -> None:
    """Raise for a ``generation_kwargs`` key the engine cannot pass on (``known`` = what ``target`` accepts;
    None = not checkable here, e.g. a remote server, which answers 4xx for an unknown field)."""
    if known is None:
        return
    unknown = sorted(set(sp.generation_kwargs or {}) - set(known))
    if unknown:
        raise ValueError(
            f"sampling.generation_kwargs {unknown}: {engine} passes these to {target}, which has no "
            f"such field(s)"
        )


def cut_at_stop(
    tokens: list[int],
    logprobs: list[float],
    reason: str,
    decode: Callable[[list[int]], str],
    stops: list[str],
) -> tuple[list[int], list[float], str]:
    """An engine's completion cut after the token completing the first stop string (``end_of_completion``'s
    rule), for engines that stop on their own (vLLM): the same token on every engine; unchanged without one."""
    end, why = end_of_completion(tokens, None, decode, stops)
    if why == "stop":
        return tokens[:end], logprobs[:end], "stop"
    return tokens, logprobs, reason
