"""`EngineBase`: the whole rollout-engine contract in one class, with its defaults.

Every engine (``HFEngine``, ``VLLMEngine``, ``VLLMServerEngine``, and the conformance suite's fake) subclasses
it; callers (``RolloutCallback``, the pipeline stages, the agent loop) call these members directly instead of
probing with ``getattr``. An object that only satisfies the four-member ``RolloutEngine`` protocol (a user's
engine written before this class) is wrapped by ``as_engine`` into the same contract.

| member | default | who calls it |
|---|---|---|
| ``bind(module)`` | abstract | ``RolloutCallback.setup``, ``lit-rl validate`` |
| ``generate(prompt_ids, n, sampling)`` | abstract; engines call ``_count`` on the result | ``rollout.generate.Generator`` |
| ``update_weights(named_tensors)`` | abstract; engines bump ``policy_version`` | weight sync (sync, async, resume) |
| ``sync_items(model)`` | ``merged_state_items(model)`` | the same, to build ``named_tensors`` |
| ``share_weights`` | False: the engine holds its own weights (a resumed run pushes the restored ones) | ``RolloutCallback`` |
| ``collective_sync`` | False; True when ``update_weights`` is a collective over the DDP ranks (servers shared by URL): every rank must call it at the same point of the training loop, with none of its own generation in flight | ``RolloutCallback`` (async: loads in the trainer thread) |
| ``metrics()`` | ``rollout/engine_*`` counters | logged every step |
| ``state_dict()`` / ``load_state_dict()`` | the counters | ``RolloutCallback`` checkpoint entry ``engine`` |
| ``limits()`` | ``{"max_model_len": None}`` | the renderer (prompt length), tests |
| ``close()`` / ``teardown()`` | nothing / nothing (engines owning processes: ``close()``) | users / ``RolloutCallback.teardown`` |
| ``tokenizer`` | set by ``bind`` | decoding completions |

``RequestSeeds`` is the one per-request seed rule (both vLLM engines and the fake: a cursor from
``rank_seed(seed, rank)``); ``HFEngine`` seeds each prompt's generate call from ``stable_seed``.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from torch import Tensor

from lit_rl.rollout.sampling import SamplingConfig

SEED_MOD = 2**62  # keeps derived seeds (and vLLM's child seeds seed + k) inside int64
COUNTERS = ("calls", "prompts", "sequences", "tokens")


class EngineBase:
    """Base class of rollout engines (module docstring: the contract and its defaults)."""

    policy_version: int = 0
    tokenizer: Any = None
    share_weights: bool = False
    collective_sync: bool = False

    # ---------------------------------------------------------------- required
    def bind(self, module) -> None:
        raise NotImplementedError(f"{type(self).__name__}.bind")

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Any]]:
        raise NotImplementedError(f"{type(self).__name__}.generate")

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        raise NotImplementedError(f"{type(self).__name__}.update_weights")

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

    def close(self) -> None:
        """Free what the engine holds (processes, memory); it may be bound again afterwards."""

    def teardown(self) -> None:
        """End of a fit (``RolloutCallback.teardown``). Default: nothing, so an engine can serve the next fit or
        validate of the same process without a restart; engines owning processes (launched servers) stop them
        here (``VLLMServerEngine``: ``close``)."""


class RequestSeeds:
    """Per-request sampling seeds from a cursor, and the cursor as checkpoint state (mixin of the vLLM engines).

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


def stable_seed(seed: int, call: int, tokens: list[int]) -> int:
    """A 63-bit seed from (seed, call, prompt tokens), stable across processes (unlike ``hash``)."""
    h = hashlib.blake2b(repr((seed, call, tuple(tokens))).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & (2**63 - 1)


class _ProtocolEngine(EngineBase):
    """An object with only the ``RolloutEngine`` protocol's members, given the rest of the contract: every
    member it has is used, the others take ``EngineBase``'s defaults."""

    def __init__(self, inner):
        self.__dict__["_inner"] = inner

    def __getattr__(self, name):  # only reached for names not found on the wrapper
        return getattr(self.__dict__["_inner"], name)

    def __setattr__(self, name, value):
        if name == "_counters":
            self.__dict__[name] = value
        else:
            setattr(self._inner, name, value)

    def _has(self, name: str) -> bool:
        return callable(getattr(self._inner, name, None))

    policy_version = property(lambda self: self._inner.policy_version,
                              lambda self, v: setattr(self._inner, "policy_version", v))
    tokenizer = property(lambda self: getattr(self._inner, "tokenizer", None))
    share_weights = property(lambda self: bool(getattr(self._inner, "share_weights", False)))
    collective_sync = property(lambda self: bool(getattr(self._inner, "collective_sync", False)))

    def bind(self, module):
        return self._inner.bind(module)

    def generate(self, prompt_ids, n, sampling):
        return self._count(self._inner.generate(prompt_ids, n, sampling))

    def update_weights(self, named_tensors):
        return self._inner.update_weights(named_tensors)

    def sync_items(self, model):
        return self._inner.sync_items(model) if self._has("sync_items") else super().sync_items(model)

    def limits(self):
        if self._has("limits"):
            return self._inner.limits()
        try:  # the attribute engines declared before limits() existed
            n = getattr(self._inner, "max_model_len", None)
        except RuntimeError:  # not started
            n = None
        return {"max_model_len": n}

    def metrics(self):
        return {**super().metrics(), **(self._inner.metrics() if self._has("metrics") else {})}

    def state_dict(self):
        return {**super().state_dict(), **(self._inner.state_dict() if self._has("state_dict") else {})}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if self._has("load_state_dict"):
            self._inner.load_state_dict(state)

    def close(self):
        if self._has("close"):
            self._inner.close()

    def teardown(self):
        if self._has("teardown"):
            self._inner.teardown()


def as_engine(engine) -> EngineBase:
    """``engine`` itself when it subclasses ``EngineBase``, else a wrapper giving it the whole contract."""
    if engine is None or isinstance(engine, EngineBase):
        return engine
    missing = [m for m in ("bind", "generate", "update_weights") if not callable(getattr(engine, m, None))]
    if missing:
        raise TypeError(f"engine {type(engine).__name__} lacks {missing}: a rollout engine subclasses "
                        "lit_rl.rollout.base.EngineBase (or has bind, generate, update_weights, policy_version)")
    return _ProtocolEngine(engine)
