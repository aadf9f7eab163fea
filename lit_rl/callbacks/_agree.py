"""Agreement on failure: one rank's error stops every rank, with that rank's message.

A rank that raises in its rollout (generation, reward) or weight push while the others go on into the next
collective (the gradient all-reduce, an FSDP all-gather, a server engine's sync broadcast) leaves them either
waiting for a partner that never comes or failing with gloo's "Connection closed by peer", which does not say
what went wrong. ``agree`` closes such a step with one small collective: every rank reports whether it failed
(``all_gather_object`` of a message or None), and if any did, every rank raises — the failing rank its own
exception (its traceback intact), the others ``RankFailure`` naming the first failing rank and its message.

Bound: a rank that raises reaches the agreement at once, so the others raise as soon as they finish the step
they are in. A rank that never arrives (a hung generation) or died is bounded by the agreement group's timeout,
the strategy's process-group timeout (Lightning's default 30 min) — the same bound as any other collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_GROUP_ATTR = "_lit_rl_agree_group"


class RankFailure(RuntimeError):
    """Raised on the ranks that did not fail, when another rank's step raised."""


def _group(trainer):
    """A gloo group of all ranks (the default group may be NCCL, which cannot carry Python objects on CPU),
    created once per strategy. ``new_group`` is itself a collective: every rank reaches the first agreement at the
    same point, so every rank creates it there."""
    import torch.distributed as dist

    strategy = trainer.strategy
    group = getattr(strategy, _GROUP_ATTR, None)
    if group is None:
        timeout = getattr(strategy, "_timeout", None)
        group = dist.new_group(backend="gloo", **({"timeout": timeout} if timeout is not None else {}))
        setattr(strategy, _GROUP_ATTR, group)
    return group


def agree(trainer, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on this rank, then an agreement collective: returns ``fn``'s result when no rank failed, else raises
    on every rank. A collective: every rank must call it at the same point with the same ``what``.

    ``fn`` must not itself end in a collective that a failed rank skips (the agreement would then pair with it);
    the weight push of ``VLLMServerEngine`` therefore broadcasts its own errors before returning.
    """
    import torch.distributed as dist

    if getattr(trainer, "world_size", 1) <= 1 or not (dist.is_available() and dist.is_initialized()):
        return fn()
    err: BaseException | None = None
    result = None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - re-raised below, after every rank has heard of it
        err = exc
    mine = None if err is None else f"{type(err).__name__}: {err}"
    reports: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, mine, group=_group(trainer))
    if err is not None:
        raise err
    failed = [(r, m) for r, m in enumerate(reports) if m is not None]
    if failed:
        rank, msg = failed[0]
        more = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        raise RankFailure(f"rank {rank} failed during {what}{more}: {msg}")
    return result
