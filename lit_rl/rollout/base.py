"""`EngineBase`: the one rollout-engine contract, an abstract base class with defaults for what is optional.

Every engine (``HFEngine``, ``VLLMEngine``, ``VLLMServerEngine``, the conformance suite's fake, a user's own)
subclasses it; every caller (``RolloutCallback``, the pipeline stages, the agent loop, evaluation) is
annotated with it and calls its members directly, never probing with ``hasattr`` / ``getattr``. Anything
else given as an engine is refused in one line (``check_engine``).

| member | default | who calls it |
|---|---|---|
| ``bind(module, rollout=None)`` (the ``RolloutSettings``) | abstract | ``RolloutCallback.setup``, validate |
| ``generate(prompt_ids, n, sampling)`` | abstract; engines call ``_count`` on the result | ``Generator`` |
| ``update_weights(named_tensors)`` | abstract; engines bump ``policy_version`` | weight sync (sync, async, resume) |
| ``sync_items(model)`` | ``merged_state_items(model)`` | the same, to build ``named_tensors`` |
| ``share_weights`` | False: the engine holds its own weights (see [1]) | ``RolloutCallback`` |
| ``collective_sync`` | False; True: see [2] | ``RolloutCallback`` (async: loads in the trainer thread) |
| ``metrics()`` | ``rollout/engine_*`` counters | logged every step |
| ``state_dict()`` / ``load_state_dict()`` | the counters (a dict) | checkpoint entry ``engine``, evaluation |
| ``limits()`` | ``{"max_model_len": None}`` | the renderer (prompt length), tests |
| ``close()`` / ``teardown()`` | nothing / nothing (owners of processes: ``close()``) | CLI exit / teardown |
| ``tokenizer`` | set by ``bind`` | decoding completions |

[1] A resumed run pushes the restored weights into such an engine. [2] ``collective_sync`` is True when
``update_weights`` is a collective over the DDP ranks (servers shared by URL): every rank must call it at the
same point of the training loop, with none of its own generation in flight. ``Generator`` is
``rollout.generate.Generator``.

``RequestSeeds`` is the one per-request seed rule (both vLLM engines and the fake: a cursor from
``rank_seed(seed, rank)``); ``HFEngine`` seeds each prompt's generate call from ``stable_seed``.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_rl.core.settings import removed_fix, removed_settings
from lit_rl.rollout.sampling import SamplingConfig

if TYPE_CHECKING:
    from lit_rl.rollout.settings import RolloutSettings

SEED_MOD = 2**62  # keeps derived seeds (and vLLM's child seeds seed + k) inside int64
COUNTERS = ("calls", "prompts", "sequences", "tokens")

# Engine arguments that were removed, with what replaces them: an old script or config gets the reason and the
# fix in one line instead of Python's bare "unexpected keyword argument".
REMOVED_ARGS = {
    "allow_truncated_logprobs": (
        "allow_truncated_logprobs was removed: top-p/top-k/min-p/repetition penalty "
        "always work (log-probs of the processed distribution); delete the setting"
    ),
    "overlong_prompts": (
        "overlong_prompts was removed from the engines (prompt length is decided when "
        "prompts are rendered): set RolloutCallback overlong_prompts instead"
    ),
}


class EngineBase(abc.ABC):
    """Base class of rollout engines (module docstring: the contract and its defaults)."""

    policy_version: int = 0
    tokenizer: Any = None
    share_weights: bool = False
    collective_sync: bool = False

    def __new__(cls, *args, **kwargs):
        # __new__ sees the constructor's keywords before __init__ would reject them with a bare TypeError
        for name in kwargs:
            if (why := removed_fix(cls, name)) is not None:
                raise TypeError(f"{cls.__name__}: {why}")
        return super().__new__(cls)

    # ---------------------------------------------------------------- required
    @abc.abstractmethod
    def bind(self, module, rollout: RolloutSettings | None = None) -> None:
        """Attach to a policy module (``.model``, ``.tokenizer``, ``.model_path``). ``rollout`` is the run's
        ``RolloutSettings`` (``RolloutCallback.setup`` passes it whole, so an engine can check ``group_size`` and
        ``sampling.max_new_tokens`` against its limits now rather than at the first generate); None = not known
        (validate, eval)."""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Any]]:
        """``n`` ``Completion``s for each prompt (token ids); pass the result through ``_count``."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load new policy weights (``sync_items(model)``) and bump ``policy_version``."""

    # ---------------------------------------------------------------- defaults
    def sync_items(self, model) -> Iterable[tuple[str, Tensor]]:
        """What ``update_weights`` takes for ``model``: its merged weights under the checkpoint's names (a LoRA
        policy merged on the fly)."""
        from lit_rl.models.loading import merged_state_items

        return merged_state_items(model)

    def limits(self) -> dict[str, int | None]:
        """``max_model_len``: prompt + completion tokens the engine accepts (None = no declared limit)."""
        return {"max_model_len": None}

    @property
    def counters(self) -> dict[str, int]:
        if "_counters" not in self.__dict__:
            self._counters = dict.fromkeys(COUNTERS, 0)
        return self._counters

    def _count(self, groups: list[list[Any]]) -> list[list[Any]]:
        """Engines pass ``generate``'s result through this: calls, prompts, sequences and generated tokens."""
        c = self.counters
        c["calls"] += 1
        c["prompts"] += len(groups)
        c["sequences"] += sum(len(g) for g in groups)
        c["tokens"] += sum(len(x.token_ids) for g in groups for x in g)
        return groups

    def metrics(self) -> dict[str, float]:
        """Cumulative counters, logged by RolloutCallback every step (engines add their own)."""
        return {f"rollout/engine_{k}": float(v) for k, v in self.counters.items()}

    def state_dict(self) -> dict:
        """Checkpointed by RolloutCallback (entry ``engine``); engines add what their sampling depends on."""
        return {"counters": dict(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        self.counters.update({k: int(v) for k, v in (state.get("counters") or {}).items() if k in COUNTERS})

    def close(self) -> None:  # noqa: B027 - an optional hook: engines holding nothing need not override it
        """Free what the engine holds (processes, memory); it may be bound again afterwards."""

    def teardown(self) -> None:  # noqa: B027 - an optional hook, a no-op by design (see the docstring)
        """End of a fit (``RolloutCallback.teardown``). Default: nothing, so an engine can serve the next fit or
        validate of the same process without a restart; engines owning processes (launched servers) stop them
        here (``VLLMServerEngine``: ``close``)."""


removed_settings(EngineBase, REMOVED_ARGS)


def check_engine(engine) -> EngineBase:
    """``engine`` itself when it is an ``EngineBase``; anything else is refused in one line."""
    if not isinstance(engine, EngineBase):
        raise TypeError(
            f"engine={type(engine).__name__} is not a rollout engine: subclass "
            "lit_rl.rollout.base.EngineBase (bind, generate, update_weights)"
        )
    return engine


class RequestSeeds(EngineBase):
    """Per-request sampling seeds from a cursor, and the cursor as checkpoint state (a base of the vLLM engines).

    One seed per prompt; vLLM gives sample k of a prompt seed + k, so each prompt steps the cursor by n (equal
    seeds across prompts would give every prompt the same sampling noise: correlated groups). The cursor is
    what ``state_dict`` keeps, so a resumed run continues the seed sequence instead of replaying it.

    Ranks: every DDP rank runs its own engine with the same ``seed`` and a cursor starting at 0, so the base
    is ``rank_seed(seed, global rank)`` (torch.distributed's rank, read per request): without it prompt i of
    every rank would get the same noise. Each rank's cursor is its own; ``RolloutCallback`` checkpoints every
    rank's engine state (``engine_ranks``).
    """

    seed: int = 0
    _seed_cursor: int = 0

    def _next_seed(self, sp: SamplingConfig, n: int) -> int:
        base = rank_seed(self.seed if sp.seed is None else sp.seed, global_rank())
        seed = (base + self._seed_cursor) % SEED_MOD
        self._seed_cursor += n
        return seed

    def state_dict(self) -> dict:
        return {**super().state_dict(), "seed_cursor": self._seed_cursor}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._seed_cursor = int(state.get("seed_cursor", 0))


def global_rank() -> int:
    """This process's rank in torch.distributed (0 when it is not initialised: one process)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rank_seed(seed: int, rank: int) -> int:
    """Base of rank ``rank``'s per-request seeds, in [0, SEED_MOD).

    Rank 0 keeps ``seed`` itself, so a one-process run (and its checkpoints) samples exactly as before ranks
    were folded in; rank r > 0 starts at a 62-bit hash of (seed, r), so its cursor range [base, base + cursor)
    overlaps rank 0's (or another rank's) only with probability ~ cursor / 2**62.
    """
    if rank == 0:
        return seed % SEED_MOD
    h = hashlib.blake2b(repr(("lit_rl.rank_seed", seed, rank)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % SEED_MOD


def stable_seed(seed: int, call: int, tokens: list[int], occurrence: int = 0) -> int:
    """A 63-bit seed from (seed, call, prompt tokens, occurrence of the prompt in its batch), stable across
    processes (unlike ``hash``). Occurrence 0 hashes the triple alone: the keys seeded runs had before the
    occurrence was folded in."""
    key = (seed, call, tuple(tokens)) + ((occurrence,) if occurrence else ())
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & (2**63 - 1)
